package resiliencetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/test/bufconn"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// Cluster is several backends behind one target: each backend a *Server
// of its own (its own scripts, OnCall and attempts), of the echo service
// or of the services WithService registers, all reached through one
// connection whose resolver (grpc's manual resolver) lists every backend
// as an endpoint, so the connection's load-balancing policy spreads the
// calls over them.
type Cluster struct {
	// Backends are the backends, in the resolver's order.
	Backends []*Server
	// Addrs are their addresses, as the resolver lists them and as the
	// client sees its peer: "backend-0", ... over bufconn, "127.0.0.1:port"
	// over loopback TCP.
	Addrs []string
	// Conn is the connection to the cluster, dialed with the options given.
	Conn *grpc.ClientConn

	r       *manual.Resolver
	stops   []func() // one per backend, idempotent
	stopped sync.Map // the addresses of the backends StopBackend stopped
	ready   *readiness
	policy  json.RawMessage // the loadBalancingConfig of the cluster's service config
	mu      sync.Mutex
	state   resolver.State // the resolver's latest, under mu
}

// ClusterOption configures a cluster.
type ClusterOption interface{ apply(*clusterOptions) }

type clusterOptions struct {
	tcp           bool
	serverOpts    []grpc.ServerOption
	serviceConfig string
	register      func(backend int, s *grpc.Server)
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

// WithServiceConfig sets the connection's default service config (what
// grpc.WithDefaultServiceConfig sets): its loadBalancingConfig (or
// loadBalancingPolicy) names the load-balancing policy that spreads the
// calls, round_robin when it names none (grpc's own default, pick_first,
// sends every call to one backend). Give the service config here, not as
// a dial option: the cluster puts its own policy in front of the one
// named, to learn when every backend is READY, and ServeCluster fails
// when a dial option replaces it.
//
//	resiliencetest.WithServiceConfig(`{"loadBalancingConfig": [{"resilience_endpoint": {}}]}`)
func WithServiceConfig(js string) ClusterOption {
	return clusterOptionFunc(func(o *clusterOptions) { o.serviceConfig = js })
}

// WithService makes each backend a Server of the services register
// installs on its grpc.Server, instead of the echo service: register is
// called once per backend, with the backend's index, so that each may have
// an implementation of its own. Every backend records and scripts the
// attempts of every method, as NewServer's registrars do.
//
//	resiliencetest.WithService(func(i int, s *grpc.Server) { healthgrpc.RegisterHealthServer(s, hs[i]) })
func WithService(register func(backend int, s *grpc.Server)) ClusterOption {
	return clusterOptionFunc(func(o *clusterOptions) { o.register = register })
}

var clusterSeq atomic.Uint64

// ServeCluster starts n backends and a connection to them dialed with
// dialOpts (such as a Client's DialOptions), and returns a function that
// closes the connection and stops the backends. Tests use StartCluster.
//
// It returns once every backend is READY: the connection's load-balancing
// policy (WithServiceConfig) has connected to every backend it connects
// to (all of them for round_robin and resilience_endpoint; the first for
// pick_first) and picks among them, so that the first calls already
// spread over every backend. A backend that fails to connect is an error.
//
// Over bufconn (the default) it works inside a testing/synctest bubble, and
// each backend's connection reports the backend's address as its peer.
func ServeCluster(n int, dialOpts []grpc.DialOption, opts ...ClusterOption) (*Cluster, func(), error) {
	var o clusterOptions
	for _, opt := range opts {
		opt.apply(&o)
	}
	sc, policy, err := clusterServiceConfig(o.serviceConfig, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("resiliencetest: WithServiceConfig: %w", err)
	}
	c := &Cluster{ready: newReadiness(), policy: policy}
	stopAll := func() {
		for _, stop := range c.stops {
			stop()
		}
	}
	listeners := map[string]*bufconn.Listener{}
	for i := range n {
		srv := NewServer()
		if o.register != nil {
			srv = NewServer(func(s *grpc.Server) { o.register(i, s) })
		}
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
		c.stops = append(c.stops, sync.OnceFunc(serveOn(lis, srv, o.serverOpts)))
		c.Backends = append(c.Backends, srv)
		c.Addrs = append(c.Addrs, addr)
	}
	scheme := fmt.Sprintf("resiliencetest-cluster-%d", clusterSeq.Add(1))
	c.r = manual.NewBuilderWithScheme(scheme)
	c.state.Attributes = attributes.New(readinessKey{}, c.ready)
	for _, a := range c.Addrs {
		c.state.Endpoints = append(c.state.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
	}
	c.r.InitialState(c.state)
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	if !o.tcp {
		dial = func(ctx context.Context, addr string) (net.Conn, error) {
			bl, ok := listeners[addr]
			if !ok {
				return nil, fmt.Errorf("resiliencetest: no backend %q", addr)
			}
			conn, err := bl.DialContext(ctx)
			if err != nil {
				return nil, err
			}
			return namedConn{Conn: conn, remote: namedAddr(addr)}, nil
		}
	}
	base := []grpc.DialOption{
		grpc.WithResolvers(c.r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dial),
		grpc.WithDefaultServiceConfig(sc),
	}
	cc, err := grpc.NewClient(scheme+":///cluster", append(base, dialOpts...)...)
	if err != nil {
		stopAll()
		return nil, nil, err
	}
	c.Conn = cc
	stop := func() {
		_ = cc.Close()
		stopAll()
	}
	// Connect builds the resolver and the policy, which takes the
	// resolver's first state before Connect returns.
	cc.Connect()
	if !c.ready.attached() {
		stop()
		return nil, nil, errors.New("resiliencetest: ServeCluster: a dial option replaced the cluster's service config " +
			"(grpc.WithDefaultServiceConfig?): give it with resiliencetest.WithServiceConfig")
	}
	if err := c.waitReady(1); err != nil { // Connect's ExitIdle included
		stop()
		return nil, nil, fmt.Errorf("resiliencetest: ServeCluster: %w", err)
	}
	return c, stop, nil
}

// StartCluster is ServeCluster for tests: it fails the test on error and
// stops everything in t.Cleanup. Like ServeCluster, it returns once every
// backend is READY.
func StartCluster(t testing.TB, n int, dialOpts []grpc.DialOption, opts ...ClusterOption) *Cluster {
	t.Helper()
	c, stop, err := ServeCluster(n, dialOpts, opts...)
	if err != nil {
		t.Fatalf("resiliencetest.StartCluster: %v", err)
	}
	t.Cleanup(stop)
	return c
}

// waitReady waits until the policy has every backend it connects to READY,
// but those StopBackend stopped, and has handled exits ExitIdle calls, and
// names the backends that failed.
func (c *Cluster) waitReady(exits int) error {
	err := c.ready.wait(context.Background(), exits, func(addr string) bool {
		_, stopped := c.stopped.Load(addr)
		return stopped
	})
	if err == nil {
		return nil
	}
	msg := err.Error()
	for i, a := range c.Addrs {
		msg = strings.ReplaceAll(msg, a+":", fmt.Sprintf("backend %d (%s):", i, a))
	}
	return errors.New(msg)
}

// clusterServiceConfig returns the service config js with its policy behind
// the cluster's readiness policy, and that policy (a loadBalancingConfig
// list): the one js names, else fallback, else round_robin.
func clusterServiceConfig(js string, fallback json.RawMessage) (string, json.RawMessage, error) {
	doc := map[string]json.RawMessage{}
	if strings.TrimSpace(js) != "" {
		if err := json.Unmarshal([]byte(js), &doc); err != nil {
			return "", nil, err
		}
	}
	policy := doc["loadBalancingConfig"]
	if policy == nil {
		if name, ok := doc["loadBalancingPolicy"]; ok {
			var s string
			if err := json.Unmarshal(name, &s); err != nil {
				return "", nil, fmt.Errorf("loadBalancingPolicy: %w", err)
			}
			policy, _ = json.Marshal([]map[string]struct{}{{s: {}}})
		}
	}
	if policy == nil {
		policy = fallback
	}
	if policy == nil {
		policy = json.RawMessage(`[{"round_robin": {}}]`)
	}
	delete(doc, "loadBalancingPolicy")
	wrapped, err := json.Marshal([]map[string]any{{readyPolicy: map[string]json.RawMessage{"childPolicy": policy}}})
	if err != nil {
		return "", nil, fmt.Errorf("loadBalancingConfig: %w", err)
	}
	doc["loadBalancingConfig"] = wrapped
	out, err := json.Marshal(doc)
	return string(out), policy, err
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
// load-balancing policy gets the update at once, and SetEndpoints returns
// once every backend listed is READY (as ServeCluster does; a backend
// StopBackend stopped is not waited for), or with the error of those that
// failed to connect.
func (c *Cluster) SetEndpoints(backends ...int) error {
	c.mu.Lock()
	c.state.Endpoints = nil
	for _, i := range backends {
		c.state.Endpoints = append(c.state.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: c.Addrs[i]}}})
	}
	c.r.UpdateState(c.state)
	c.mu.Unlock()
	if len(backends) == 0 {
		return nil
	}
	return c.waitReady(0)
}

// SetServiceConfig makes the resolver return the service config js with
// the current endpoints, as a DNS TXT record or xDS would: it replaces the
// connection's default service config (WithServiceConfig). When js names
// no load-balancing policy, the cluster's stays (a resolver's config
// without one would mean pick_first). An invalid js is an error, and the
// resolver's state is unchanged. SetServiceConfig returns once every
// backend is READY under the policy js names, as ServeCluster does.
func (c *Cluster) SetServiceConfig(js string) error {
	wrapped, _, err := clusterServiceConfig(js, c.policy)
	if err != nil {
		return err
	}
	sc := c.r.CC().ParseServiceConfig(wrapped)
	if sc.Err != nil {
		return sc.Err
	}
	c.mu.Lock()
	c.state.ServiceConfig = sc
	c.r.UpdateState(c.state)
	c.mu.Unlock()
	return c.waitReady(0)
}

// StopBackend stops backend i as a crash would: its connections close, the
// calls it is serving fail on the client with UNAVAILABLE, and new
// connections to it are refused. The resolver still lists it.
func (c *Cluster) StopBackend(i int) {
	c.stopped.Store(c.Addrs[i], true)
	c.stops[i]()
}

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
