package interceptor

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/test/bufconn"

	"github.com/grpc-resilience/resilience/interceptor/endpoint"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
)

// rig is a cluster of echo backends over bufconn behind a manual resolver,
// for the endpoint policy's round-2 tests (issue 30), with what
// resiliencetest.Cluster does not offer: resolver addresses that are host
// names while the connection reports another address as its peer (as a
// host name resolved to an IP, or a proxy, does); a backend restarted in
// place (the same name, a new server); duplicate and arbitrary resolver
// lists. It works inside a testing/synctest bubble. It waits for READY
// itself (waitReady), by the policy's snapshot.
type rig struct {
	t        *testing.T
	names    []string // the backends' addresses as the resolver lists them
	peers    []string // the addresses their connections report as the peer
	backends []*resiliencetest.Server
	r        *manual.Resolver
	Conn     *grpc.ClientConn

	mu    sync.Mutex
	lis   map[string]*bufconn.Listener // by name; nil: stopped (dials are refused)
	stops []func()                     // per backend; nil when stopped
}

var rigSeq int

// newRig starts n backends named "db-i.example.internal:443", whose
// connections report "10.0.0.(i+1):443" as the peer, and a connection to
// them dialed with dialOpts; it stops everything in t.Cleanup.
func newRig(t *testing.T, n int, dialOpts ...grpc.DialOption) *rig {
	t.Helper()
	rg := &rig{t: t, lis: map[string]*bufconn.Listener{}}
	for i := range n {
		rg.names = append(rg.names, fmt.Sprintf("db-%d.example.internal:443", i))
		rg.peers = append(rg.peers, fmt.Sprintf("10.0.0.%d:443", i+1))
		rg.backends = append(rg.backends, resiliencetest.NewServer())
		rg.stops = append(rg.stops, nil)
		rg.serve(i)
	}
	rigSeq++
	rg.r = manual.NewBuilderWithScheme(fmt.Sprintf("rig%d", rigSeq))
	rg.r.InitialState(rg.state(rg.names...))
	base := []grpc.DialOption{grpc.WithResolvers(rg.r), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(rg.dial)}
	cc, err := grpc.NewClient(rg.r.Scheme()+":///db.example.internal", append(base, dialOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	rg.Conn = cc
	t.Cleanup(func() {
		_ = cc.Close()
		for i := range rg.backends {
			rg.stop(i)
		}
	})
	return rg
}

func (rg *rig) state(addrs ...string) resolver.State {
	var st resolver.State
	for _, a := range addrs {
		st.Endpoints = append(st.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
	}
	return st
}

// serve starts backend i on a new listener under its name.
func (rg *rig) serve(i int) {
	l := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	echov1.RegisterEchoServiceServer(gs, rg.backends[i])
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(l)
	}()
	rg.mu.Lock()
	rg.lis[rg.names[i]] = l
	rg.stops[i] = func() {
		gs.Stop()
		<-served
	}
	rg.mu.Unlock()
}

// stop stops backend i as a crash would: its connections close (the calls
// it serves fail with UNAVAILABLE, nothing received), and dials to its name
// are refused until restart.
func (rg *rig) stop(i int) {
	rg.mu.Lock()
	stop := rg.stops[i]
	rg.stops[i] = nil
	rg.lis[rg.names[i]] = nil
	rg.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// restart stops backend i and serves it again under the same name: a
// backend restarted in place.
func (rg *rig) restart(i int) {
	rg.stop(i)
	rg.serve(i)
}

func (rg *rig) dial(ctx context.Context, addr string) (net.Conn, error) {
	rg.mu.Lock()
	l := rg.lis[addr]
	rg.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("rig: connection to %s refused", addr)
	}
	conn, err := l.DialContext(ctx)
	if err != nil {
		return nil, err
	}
	for i, n := range rg.names {
		if n == addr {
			return namedPeerConn{Conn: conn, remote: rigAddr(rg.peers[i])}, nil
		}
	}
	return conn, nil
}

// setEndpoints makes the resolver list addrs (names, duplicates allowed).
func (rg *rig) setEndpoints(addrs ...string) { rg.r.UpdateState(rg.state(addrs...)) }

// snapshot returns the policy's snapshot of the rig's channel.
func (rg *rig) snapshot() endpoint.Snapshot {
	rg.t.Helper()
	for _, s := range endpoint.Snapshots(time.Now()) {
		if s.Target == rg.Conn.Target() && !s.Idle {
			return s
		}
	}
	rg.t.Fatal("no snapshot for the rig's channel")
	return endpoint.Snapshot{}
}

// waitReady waits until the policy reports n READY endpoints (polling its
// snapshot: in a synctest bubble each wait is a tick of fake time).
func (rg *rig) waitReady(n int) {
	rg.t.Helper()
	rg.Conn.Connect()
	for range 5000 {
		for _, s := range endpoint.Snapshots(time.Now()) {
			if s.Target != rg.Conn.Target() || s.Idle {
				continue
			}
			ready := 0
			for _, e := range s.Endpoints {
				if e.Connectivity.String() == "READY" {
					ready++
				}
			}
			if ready == n {
				return
			}
		}
		time.Sleep(time.Millisecond)
	}
	rg.t.Fatalf("%d endpoints never READY", n)
}

// slowBackend makes backend slow answer in slowD and every other backend
// in fast.
func (rg *rig) slowBackend(slow int, fast, slowD time.Duration) {
	for i, b := range rg.backends {
		d := fast
		if i == slow {
			d = slowD
		}
		b.OnCall(func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Delay: d} })
	}
}

// counts returns the attempts of Echo each backend has seen.
func (rg *rig) counts() []int {
	out := make([]int, len(rg.backends))
	for i, b := range rg.backends {
		out[i] = len(b.Attempts(resiliencetest.EchoMethod))
	}
	return out
}

// retriesTo returns the retries (grpc-previous-rpc-attempts > 0) of Echo
// backend i has seen.
func (rg *rig) retriesTo(i int) int {
	n := 0
	for _, a := range rg.backends[i].Attempts(resiliencetest.EchoMethod) {
		if a.Previous > 0 {
			n++
		}
	}
	return n
}

func (rg *rig) echo() echov1.EchoServiceClient { return echov1.NewEchoServiceClient(rg.Conn) }

// namedPeerConn reports remote as its peer address, as a connection to a
// host name reports the IP it resolved to.
type namedPeerConn struct {
	net.Conn
	remote net.Addr
}

func (c namedPeerConn) RemoteAddr() net.Addr { return c.remote }

type rigAddr string

func (rigAddr) Network() string  { return "tcp" }
func (a rigAddr) String() string { return string(a) }

// lbDial is the dial option that puts a rig's connection on the endpoint
// policy configured by policy (lbConfig is its resiliencetest cluster's
// option).
func lbDial(policy string) grpc.DialOption {
	return grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"` + endpoint.Name + `": ` + policy + `}]}`)
}
