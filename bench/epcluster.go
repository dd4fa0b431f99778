package bench

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/failsafegrpc"
	"github.com/failsafe-go/failsafe-go/hedgepolicy"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	_ "google.golang.org/grpc/balancer/leastrequest"       // registers least_request_experimental
	_ "google.golang.org/grpc/balancer/weightedroundrobin" // registers weighted_round_robin
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	_ "google.golang.org/grpc/xds" // registers outlier_detection_experimental (gRFC A50) for the side-by-side rows

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/endpoint"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The endpoint scenarios (issues 22 and 30) run several backends on
// loopback TCP behind one target, in real time: a manual resolver lists
// them as "127.0.0.1:port" (IP) or "localhost:port" (host name: the
// connection then reports 127.0.0.1 as its peer, which never matches the
// resolver's address), and each backend can be stopped and served again on
// its port (restarted in place) or dropped from the resolver's list.

const (
	epBackends = 3
	epCallers  = 16
	// epRetry is the retry policy of every retrying peer: maxAttempts 2,
	// backoff 10 ms (×2, to 100 ms), UNAVAILABLE.
	epRetry = `"retryPolicy":{"maxAttempts":2,"initialBackoff":"0.01s","maxBackoff":"0.1s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}`
	// epNoRetry is a method config field that changes nothing: the
	// scenarios without retries.
	epNoRetry = `"waitForReady":false`
)

// epBackend is one backend: its address and its scripted server, which
// survives restarts.
type epBackend struct {
	addr string // 127.0.0.1:port
	srv  *resiliencetest.Server

	mu   sync.Mutex
	stop func() // nil when stopped
}

// epCluster is one row's backends and connection, with what the backends
// saw: per attempt, when it arrived and whether it was a call's first.
type epCluster struct {
	backends []*epBackend
	names    []string // as the resolver lists them
	r        *manual.Resolver
	Conn     *grpc.ClientConn

	mu    sync.Mutex
	start time.Time
	seen  [][]epArrival // per backend
	// behave decides each backend's answer; nil: echo at once.
	behave func(backend int, at time.Duration) resiliencetest.Step
}

type epArrival struct {
	at    time.Duration
	first bool
	call  string // the call-id header, when sent
}

var epSeq atomic.Uint64

// startEPCluster starts n backends and a connection to them dialed with
// opts; hostNames lists them as localhost:port.
func startEPCluster(n int, hostNames bool, opts []grpc.DialOption) (*epCluster, error) {
	c := &epCluster{seen: make([][]epArrival, n)}
	for i := range n {
		b := &epBackend{srv: resiliencetest.NewServer()}
		if err := b.serve("127.0.0.1:0"); err != nil {
			c.stop()
			return nil, err
		}
		b.srv.OnCall(c.onCall(i))
		c.backends = append(c.backends, b)
		name := b.addr
		if hostNames {
			_, port, _ := net.SplitHostPort(b.addr)
			name = net.JoinHostPort("localhost", port)
		}
		c.names = append(c.names, name)
	}
	c.r = manual.NewBuilderWithScheme("bench-ep" + strconv.FormatUint(epSeq.Add(1), 10))
	c.r.InitialState(c.state(c.names...))
	base := []grpc.DialOption{grpc.WithResolvers(c.r), grpc.WithTransportCredentials(insecure.NewCredentials())}
	cc, err := grpc.NewClient(c.r.Scheme()+":///cluster", append(base, opts...)...)
	if err != nil {
		c.stop()
		return nil, err
	}
	c.Conn = cc
	return c, nil
}

// serve starts serving b.srv on addr (":0" picks a port, kept for restarts).
func (b *epBackend) serve(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	gs := grpc.NewServer()
	echov1.RegisterEchoServiceServer(gs, b.srv)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(l)
	}()
	b.mu.Lock()
	b.addr = l.Addr().String()
	b.stop = func() {
		gs.Stop()
		<-served
	}
	b.mu.Unlock()
	return nil
}

// halt stops b as a crash would: its connections close, new ones are
// refused.
func (b *epBackend) halt() {
	b.mu.Lock()
	stop := b.stop
	b.stop = nil
	b.mu.Unlock()
	if stop != nil {
		stop()
	}
}

func (c *epCluster) state(addrs ...string) resolver.State {
	var st resolver.State
	for _, a := range addrs {
		st.Endpoints = append(st.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
	}
	return st
}

// setEndpoints makes the resolver list these backends, by index.
func (c *epCluster) setEndpoints(backends ...int) {
	var names []string
	for _, i := range backends {
		names = append(names, c.names[i])
	}
	c.r.UpdateState(c.state(names...))
}

func (c *epCluster) stop() {
	if c.Conn != nil {
		_ = c.Conn.Close()
	}
	for _, b := range c.backends {
		b.halt()
	}
}

func (c *epCluster) onCall(i int) func(resiliencetest.Attempt) resiliencetest.Step {
	return func(a resiliencetest.Attempt) resiliencetest.Step {
		arr := epArrival{first: a.Previous <= 0}
		if v := a.MD.Get("call-id"); len(v) > 0 {
			arr.call = v[0]
		}
		c.mu.Lock()
		arr.at = time.Since(c.start)
		c.seen[i] = append(c.seen[i], arr)
		behave := c.behave
		c.mu.Unlock()
		if behave == nil {
			return resiliencetest.Step{}
		}
		return behave(i, arr.at)
	}
}

// warm waits until every listed backend has answered a call (the
// connections are up), then forgets what the backends saw.
func (c *epCluster) warm(ctx context.Context, listed int) {
	echo := echov1.NewEchoServiceClient(c.Conn)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		_, _ = echo.Echo(wctx, &echov1.EchoRequest{Message: "warm"}, grpc.WaitForReady(true))
		cancel()
		all := true
		for _, b := range c.backends[:listed] {
			if len(b.srv.Attempts("")) == 0 {
				all = false
			}
		}
		if all {
			break
		}
	}
	c.mu.Lock()
	c.seen = make([][]epArrival, len(c.backends))
	c.start = time.Now()
	c.mu.Unlock()
}

// setBehavior sets what the backends answer from now on.
func (c *epCluster) setBehavior(f func(backend int, at time.Duration) resiliencetest.Step) {
	c.mu.Lock()
	c.behave = f
	c.mu.Unlock()
}

// run drives epCallers closed-loop callers for d, each call with a 2 s
// deadline and a call-id header, and returns the outcomes; the arrivals'
// times count from the run's start.
func (c *epCluster) run(ctx context.Context, d time.Duration) *load {
	return c.runCallers(ctx, epCallers, d)
}

func (c *epCluster) runCallers(ctx context.Context, callers int, d time.Duration) *load {
	echo := echov1.NewEchoServiceClient(c.Conn)
	var l load
	start := time.Now()
	c.mu.Lock()
	c.start = start
	c.mu.Unlock()
	l.closedLoop(ctx, callers, 0, start.Add(d), func(ctx context.Context, i int) error {
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "call-id", strconv.Itoa(i))
		_, err := echo.Echo(ctx, &echov1.EchoRequest{Message: "e"})
		return err
	})
	return &l
}

// snapshot returns the endpoint policy's snapshot of the cluster's
// channel; ok false when the channel is not under the policy.
func (c *epCluster) snapshot() (endpoint.Snapshot, bool) {
	for _, s := range endpoint.Snapshots(time.Now()) {
		if s.Target == c.Conn.Target() && !s.Idle {
			return s, true
		}
	}
	return endpoint.Snapshot{}, false
}

// epPeer is one client setup of the endpoint scenarios: a load-balancing
// policy and a retry (or hedging) layer.
type epPeer struct {
	name string
	// dial returns the dial options for the method config fields methods
	// (epRetry, epNoRetry or a hedgingPolicy) and the document's extra
	// top-level fields.
	dial func(methods, extra string) ([]grpc.DialOption, error)
	// ours: the row runs the endpoint policy (its snapshot is read).
	ours bool
}

// oursLB is ours (interceptor.NewClient with the method config) under the
// load-balancing config lb.
func oursLB(name, lb string) epPeer {
	return epPeer{name: name, ours: isOursLB(lb), dial: func(methods, extra string) ([]grpc.DialOption, error) {
		doc := fmt.Sprintf(`{"methodConfig":[{"name":[{"service":%q}],%s}]%s}`, echoService, methods, extra)
		cfg, err := serviceconfig.Parse([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("bench: %s: %w", name, err)
		}
		c, err := interceptor.NewClient(interceptor.WithServiceConfig(cfg))
		if err != nil {
			return nil, err
		}
		return append(c.DialOptions(), grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[`+lb+`]}`)), nil
	}}
}

func isOursLB(lb string) bool { return strings.HasPrefix(lb, `{"resilience_endpoint"`) }

// grpcLB is grpc-go's built-in retry with the load-balancing config lb.
func grpcLB(name, lb string) epPeer {
	return epPeer{name: name, dial: func(methods, _ string) ([]grpc.DialOption, error) {
		if methods != epRetry && methods != epNoRetry {
			return nil, fmt.Errorf("bench: %s: grpc-go has no hedging", name)
		}
		return []grpc.DialOption{grpc.WithDefaultServiceConfig(fmt.Sprintf(
			`{"loadBalancingConfig":[%s],"methodConfig":[{"name":[{"service":%q}],%s}]}`, lb, echoService, methods))}, nil
	}}
}

// epGGM is go-grpc-middleware's retry (maxAttempts 2, 10 ms to 100 ms with
// jitter, UNAVAILABLE) under round_robin.
func epGGM() epPeer {
	return epPeer{name: "go-grpc-middleware retry, round_robin", dial: func(methods, _ string) ([]grpc.DialOption, error) {
		opts := []grpc.DialOption{grpc.WithDisableRetry(), grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[` + lbRR + `]}`)}
		if methods == epRetry {
			opts = append(opts, grpc.WithChainUnaryInterceptor(retry.UnaryClientInterceptor(
				ggmCallOptions(Policy{MaxAttempts: 2, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})...)))
		}
		return opts, nil
	}}
}

// epFailsafe is failsafe-go's retry (maxAttempts 2, 10 ms to 100 ms, jitter
// 0.2) under round_robin; with hedge set, its hedge policy (one hedge after
// the delay) instead.
func epFailsafe(hedge time.Duration) epPeer {
	name := "failsafe-go retry, round_robin"
	if hedge > 0 {
		name = "failsafe-go hedge, round_robin"
	}
	return epPeer{name: name, dial: func(methods, _ string) ([]grpc.DialOption, error) {
		opts := []grpc.DialOption{grpc.WithDisableRetry(), grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[` + lbRR + `]}`)}
		var p failsafe.Policy[any]
		switch {
		case hedge > 0:
			if raceEnabled {
				return nil, errSkipRace
			}
			p = hedgepolicy.NewBuilderWithDelay[any](hedge).WithMaxHedges(1).Build()
		case methods == epRetry:
			p = failsafeRetryPolicy(Policy{MaxAttempts: 2, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
		default:
			return opts, nil
		}
		return append(opts, grpc.WithChainUnaryInterceptor(failsafegrpc.NewUnaryClientInterceptor(p))), nil
	}}
}

// errSkipRace marks a row skipped under the race detector.
var errSkipRace = fmt.Errorf("skipped under the race detector")

// Load-balancing configs of the rows.
const (
	lbOursRR   = `{"resilience_endpoint":{"childPolicy":[{"round_robin":{}}]}}`
	lbOursPF   = `{"resilience_endpoint":{"childPolicy":[{"pick_first":{}}]}}`
	lbOursEWMA = `{"resilience_endpoint":{"childPolicy":[{"peak_ewma":{}}]}}`
	// lbOursEWMALinkerd is peak_ewma with Finagle's and Linkerd's settings:
	// an attempt in flight costs a whole latency, and a latency counts for
	// 10s.
	lbOursEWMALinkerd = `{"resilience_endpoint":{"childPolicy":[{"peak_ewma":{"endpointConcurrency":1,"decayTime":"10s"}}]}}`
	lbRR              = `{"round_robin":{}}`
	lbPF              = `{"pick_first":{}}`
	lbLeast           = `{"least_request_experimental":{"choiceCount":2}}`
	lbWRR             = `{"weighted_round_robin":{}}`
	lbOutlierBase     = `{"outlier_detection_experimental":{"interval":"10s","baseEjectionTime":"30s","maxEjectionPercent":50,` +
		`"failurePercentageEjection":{"threshold":50,"minimumHosts":3,"requestVolume":20},"childPolicy":[{"round_robin":{}}]}}`
)

// Row names the targets read.
const (
	epOursRR   = "grpc-resilience, resilience_endpoint (round_robin)"
	epOursPF   = "grpc-resilience, resilience_endpoint (pick_first)"
	epOursEWMA = "grpc-resilience, resilience_endpoint (peak_ewma)"
	// epOursEWMALinkerd is peak_ewma with Finagle's and Linkerd's settings.
	epOursEWMALinkerd = "grpc-resilience, resilience_endpoint (peak_ewma, endpointConcurrency 1, decayTime 10s)"
	epOursHedged      = "grpc-resilience hedged, resilience_endpoint (round_robin)"
	epHostSuffix      = ", host names"
)

// epRetryPeers are the rows of the scenarios with retries: ours under each
// child and under plain round_robin, grpc-go's retry under each of its
// policies reachable through public imports, go-grpc-middleware's and
// failsafe-go's retries under round_robin.
func epRetryPeers() []epPeer {
	return []epPeer{
		oursLB(epOursRR, lbOursRR),
		oursLB(epOursPF, lbOursPF),
		oursLB(epOursEWMA, lbOursEWMA),
		oursLB("grpc-resilience, round_robin", lbRR),
		grpcLB("grpc-go retry, round_robin", lbRR),
		grpcLB("grpc-go retry, pick_first", lbPF),
		grpcLB("grpc-go retry, least_request", lbLeast),
		grpcLB("grpc-go retry, weighted_round_robin", lbWRR),
		grpcLB("grpc-go retry, outlier_detection (round_robin)", lbOutlierBase),
		epGGM(),
		epFailsafe(0),
	}
}

// epPeerNotes describes the peers of the endpoint tables.
var epPeerNotes = []string{
	"peers: grpc-go's built-in retry under round_robin, pick_first, least_request_experimental (choiceCount 2), " +
		"weighted_round_robin (no ORCA load reports from these backends, so equal weights: round robin) and " +
		"outlier_detection_experimental (gRFC A50 through google.golang.org/grpc/xds: interval 10 s, failurePercentageEjection " +
		"threshold 50, minimumHosts 3, requestVolume 20, maxEjectionPercent 50, child round_robin); go-grpc-middleware's retry " +
		"and failsafe-go's retry under round_robin; every retry: maxAttempts 2, backoff 10 ms to 100 ms, UNAVAILABLE. " +
		"Ours: interceptor.NewClient with the same policy and its default retry budget, under resilience_endpoint (defaults " +
		"unless stated) or plain round_robin.",
}
