package resiliencetest

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/test/bufconn"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// Cluster is several backends of the echo service behind one target: each
// backend a *Server of its own (its own scripts, OnCall and attempts), all
// reached through one connection whose resolver (grpc's manual resolver)
// lists every backend as an endpoint, so the connection's load-balancing
// policy spreads the calls over them.
type Cluster struct {
	// Backends are the backends, in the resolver's order.
	Backends []*Server
	// Addrs are their addresses, as the resolver lists them and as the
	// client sees its peer: "backend-0", ... over bufconn, "127.0.0.1:port"
	// over loopback TCP.
	Addrs []string
	// Conn is the connection to the cluster, dialed with the options given.
	Conn *grpc.ClientConn

	r     *manual.Resolver
	stops []func() // one per backend, idempotent
	mu    sync.Mutex
	state resolver.State // the resolver's latest, under mu
}

// ClusterOption configures a cluster.
type ClusterOption interface{ apply(*clusterOptions) }

type clusterOptions struct {
	tcp        bool
	serverOpts []grpc.ServerOption
}

type clusterOptionFunc func(*clusterOptions)

func (f clusterOptionFunc) apply(o *clusterOptions) { f(o) }

// WithLoopbackTCP serves the backends on loopback TCP instead of bufconn:
// real sockets, for measurements in real time. Not inside testing/synctest.
func WithLoopbackTCP() ClusterOption {
	return clusterOptionFunc(func(o *clusterOptions) { o.tcp = true })
}

// WithServerOptions gives every backend these server options (such as
// faultinject's interceptors).
func WithServerOptions(opts ...grpc.ServerOption) ClusterOption {
	return clusterOptionFunc(func(o *clusterOptions) { o.serverOpts = append(o.serverOpts, opts...) })
}

var clusterSeq atomic.Uint64

// ServeCluster starts n backends and a connection to them dialed with
// dialOpts (such as a Client's DialOptions and grpc.WithDefaultServiceConfig
// naming a load-balancing policy), and returns a function that closes the
// connection and stops the backends. Tests use StartCluster.
//
// Over bufconn (the default) it works inside a testing/synctest bubble, and
// each backend's connection reports the backend's address as its peer.
func ServeCluster(n int, dialOpts []grpc.DialOption, opts ...ClusterOption) (*Cluster, func(), error) {
	var o clusterOptions
	for _, opt := range opts {
		opt.apply(&o)
	}
	c := &Cluster{}
	var stops []func()
	stopAll := func() {
		for _, stop := range stops {
			stop()
		}
	}
	listeners := map[string]*bufconn.Listener{}
	for i := range n {
		srv := NewServer()
		var lis net.Listener
		addr := fmt.Sprintf("backend-%d", i)
		if o.tcp {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				stopAll()
				return nil, nil, err
			}
			lis, addr = l, l.Addr().String()
		} else {
			bl := bufconn.Listen(1 << 20)
			listeners[addr] = bl
			lis = bl
		}
		stops = append(stops, sync.OnceFunc(serveOn(lis, srv, o.serverOpts)))
		c.Backends = append(c.Backends, srv)
		c.Addrs = append(c.Addrs, addr)
	}
	scheme := fmt.Sprintf("resiliencetest-cluster-%d", clusterSeq.Add(1))
	r := manual.NewBuilderWithScheme(scheme)
	var st resolver.State
	for _, a := range c.Addrs {
		st.Endpoints = append(st.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
	}
	r.InitialState(st)
	c.r, c.state, c.stops = r, st, stops
	base := []grpc.DialOption{grpc.WithResolvers(r), grpc.WithTransportCredentials(insecure.NewCredentials())}
	if !o.tcp {
		base = append(base, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			bl, ok := listeners[addr]
			if !ok {
				return nil, fmt.Errorf("resiliencetest: no backend %q", addr)
			}
			conn, err := bl.DialContext(ctx)
			if err != nil {
				return nil, err
			}
			return namedConn{Conn: conn, remote: namedAddr(addr)}, nil
		}))
	}
	cc, err := grpc.NewClient(scheme+":///cluster", append(base, dialOpts...)...)
	if err != nil {
		stopAll()
		return nil, nil, err
	}
	c.Conn = cc
	return c, func() {
		_ = cc.Close()
		stopAll()
	}, nil
}

// StartCluster is ServeCluster for tests: it fails the test on error and
// stops everything in t.Cleanup.
func StartCluster(t testing.TB, n int, dialOpts []grpc.DialOption, opts ...ClusterOption) *Cluster {
	t.Helper()
	c, stop, err := ServeCluster(n, dialOpts, opts...)
	if err != nil {
		t.Fatalf("resiliencetest.StartCluster: %v", err)
	}
	t.Cleanup(stop)
	return c
}

// Counts returns the number of attempts of fullMethod each backend has
// seen (all methods when fullMethod is empty), in the backends' order.
func (c *Cluster) Counts(fullMethod string) []int {
	out := make([]int, len(c.Backends))
	for i, b := range c.Backends {
		out[i] = len(b.Attempts(fullMethod))
	}
	return out
}

// SetEndpoints makes the resolver list these backends (by index in
// Backends, in this order) as the target's endpoints, as a DNS change or
// a scale-down would: none lists no endpoint at all. The connection's
// load-balancing policy gets the update at once.
func (c *Cluster) SetEndpoints(backends ...int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state.Endpoints = nil
	for _, i := range backends {
		c.state.Endpoints = append(c.state.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: c.Addrs[i]}}})
	}
	c.r.UpdateState(c.state)
}

// SetServiceConfig makes the resolver return the service config js with
// the current endpoints, as a DNS TXT record or xDS would: it replaces the
// connection's default service config (grpc.WithDefaultServiceConfig).
// An invalid js is an error, and the resolver's state is unchanged. It
// connects the channel first, as the resolver parses through it.
func (c *Cluster) SetServiceConfig(js string) error {
	c.Conn.Connect()
	sc := c.r.CC().ParseServiceConfig(js)
	if sc.Err != nil {
		return sc.Err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state.ServiceConfig = sc
	c.r.UpdateState(c.state)
	return nil
}

// StopBackend stops backend i as a crash would: its connections close, the
// calls it is serving fail on the client with UNAVAILABLE, and new
// connections to it are refused. The resolver still lists it.
func (c *Cluster) StopBackend(i int) { c.stops[i]() }

// EchoClient returns a client of the echo service on the cluster's
// connection.
func (c *Cluster) EchoClient() echov1.EchoServiceClient {
	return echov1.NewEchoServiceClient(c.Conn)
}

// namedConn is a bufconn connection that reports its backend's address as
// its remote address, which grpc gives the client as the attempt's peer.
type namedConn struct {
	net.Conn
	remote net.Addr
}

func (c namedConn) RemoteAddr() net.Addr { return c.remote }

type namedAddr string

func (namedAddr) Network() string  { return "bufconn" }
func (a namedAddr) String() string { return string(a) }

// serveOn serves srv on lis with serverOpts (recording attempts first when
// srv is a *Server) and returns the function that stops it.
func serveOn(lis net.Listener, srv echov1.EchoServiceServer, serverOpts []grpc.ServerOption) func() {
	if s, ok := srv.(*Server); ok {
		serverOpts = append([]grpc.ServerOption{grpc.StatsHandler(recorder{s})}, serverOpts...)
	}
	gs := grpc.NewServer(serverOpts...)
	echov1.RegisterEchoServiceServer(gs, srv)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	return func() {
		gs.Stop()
		<-served
	}
}
