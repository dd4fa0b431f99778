package failuremodes_test

// Network faults with a real proxy: Shopify's toxiproxy runs in-process
// between a real grpc client (this package's interceptors, loopback TCP) and
// a real grpc server. Each test cuts, blackholes, slows or refuses the
// connection the way a network does and asserts what the README's "Failure
// modes" section promises. The clock is the wall clock (real sockets cannot
// run in a synctest bubble), so every bound below is generous.

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	. "github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// netSlack is how far past its deadline a call may return on a loaded
// machine before the test calls it an overrun.
const netSlack = 300 * time.Millisecond

// netServer is the echo service of the network tests. It records, per
// method, the peer of every attempt (so a test sees that a retry came on a
// new connection), the handler executions per request message, and what
// each bidi attempt received. fault, when set, runs before every response
// message an attempt sends (sent counts those already sent); it may block
// and it may cut the connection.
type netServer struct {
	echov1.UnimplementedEchoServiceServer

	fault func(method string, attempt, sent int)

	mu       sync.Mutex
	peers    map[string][]string // method → peer address of each attempt
	execs    map[string]int      // request message → handler executions
	received [][]string          // bidi attempts → messages received
}

func (s *netServer) begin(ctx context.Context, method string) int {
	addr := "?"
	if p, ok := peer.FromContext(ctx); ok {
		addr = p.Addr.String()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.peers[method] = append(s.peers[method], addr)
	return len(s.peers[method])
}

func (s *netServer) inject(method string, attempt, sent int) {
	if s.fault != nil {
		s.fault(method, attempt, sent)
	}
}

// attempts returns the peers of the attempts of method, in order.
func (s *netServer) attempts(method string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.peers[method]...)
}

// executions returns the handler executions of the request message msg.
func (s *netServer) executions(msg string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.execs[msg]
}

// recordUnary records the attempts of unary calls; installed outside the
// idempotency interceptor, it sees the attempts that interceptor answers from
// its store too.
func (s *netServer) recordUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	s.begin(ctx, info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:])
	return handler(ctx, req)
}

// Echo numbers its executions of each request message from 1: the fault
// sees that number as the attempt (a replayed attempt does not execute).
func (s *netServer) Echo(_ context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	s.mu.Lock()
	s.execs[req.GetMessage()]++
	n := s.execs[req.GetMessage()]
	s.mu.Unlock()
	s.inject("Echo", n, 0)
	return &echov1.EchoResponse{Message: req.GetMessage(), Payload: req.GetPayload()}, nil
}

func (s *netServer) ServerStream(req *echov1.ServerStreamRequest, stream grpc.ServerStreamingServer[echov1.ServerStreamResponse]) error {
	n := s.begin(stream.Context(), "ServerStream")
	for k := range int(req.GetCount()) {
		s.inject("ServerStream", n, k)
		if err := stream.Send(&echov1.ServerStreamResponse{Message: req.GetMessage(), Index: int32(k)}); err != nil {
			return err
		}
	}
	return nil
}

// BidiStream reads every request before it answers any, so the call stays
// uncommitted (no header, no message) until the client half-closes.
func (s *netServer) BidiStream(stream grpc.BidiStreamingServer[echov1.BidiStreamRequest, echov1.BidiStreamResponse]) error {
	n := s.begin(stream.Context(), "BidiStream")
	var got []string
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		got = append(got, req.GetMessage())
	}
	s.mu.Lock()
	s.received = append(s.received, got)
	s.mu.Unlock()
	for k, m := range got {
		s.inject("BidiStream", n, k)
		if err := stream.Send(&echov1.BidiStreamResponse{Message: m}); err != nil {
			return err
		}
	}
	return nil
}

// netEnv is one client, proxy and server on loopback TCP.
type netEnv struct {
	t     *testing.T
	srv   *netServer
	proxy *toxiproxy.Proxy
	c     *Client
	echo  echov1.EchoServiceClient

	calls, overruns atomic.Int64
}

// netEnvConfig configures newNetEnv.
type netEnvConfig struct {
	client []ClientOption
	// keyed installs server-side idempotency on a memory store.
	keyed bool
}

// serveLoopback serves gs on a loopback TCP port and returns its address;
// stop stops gs and waits for Serve to return.
func serveLoopback(t *testing.T, gs *grpc.Server) (addr string, stop func()) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	return lis.Addr().String(), func() {
		gs.Stop()
		<-served
	}
}

// newNetEnv starts a grpc server on a loopback port, a toxiproxy proxy in
// front of it, and a client connection through the proxy whose reconnect
// backoff is short (10 ms to 100 ms), so a test sees recoveries quickly.
// Everything stops when the test ends, before the leak checks run.
func newNetEnv(t *testing.T, cfg netEnvConfig) *netEnv {
	t.Helper()
	e := &netEnv{t: t, srv: &netServer{peers: make(map[string][]string), execs: make(map[string]int)}}
	sopts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(e.srv.recordUnary)}
	if cfg.keyed {
		sopts = append(sopts, grpc.ChainUnaryInterceptor(memoryIdemServer(t).UnaryServerInterceptor()))
	}
	gs := grpc.NewServer(sopts...)
	echov1.RegisterEchoServiceServer(gs, e.srv)
	addr, stop := serveLoopback(t, gs)
	t.Cleanup(stop)

	api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	e.proxy = toxiproxy.NewProxy(api, t.Name(), "127.0.0.1:0", addr)
	if err := e.proxy.Start(); err != nil {
		t.Fatalf("toxiproxy: %v", err)
	}
	t.Cleanup(e.proxy.Stop)

	e.c = newTestClient(t, cfg.client...)
	dial := append(e.c.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.5, Jitter: 0.2, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	cc, err := grpc.NewClient("passthrough:///"+e.proxy.Listen, dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	e.echo = echov1.NewEchoServiceClient(cc)
	return e
}

// cut drops every connection through the proxy at once and opens it again
// on the same address: a mid-call connection loss, as a restarted proxy or
// load balancer causes it.
func (e *netEnv) cut() {
	e.proxy.Stop()
	if err := e.proxy.Start(); err != nil {
		e.t.Errorf("toxiproxy restart: %v", err)
	}
}

// toxic adds a toxic to the proxy: typ ("timeout", "latency", ...) on
// stream ("upstream": client to server, "downstream": back), with attributes
// as JSON. It returns the function that removes it.
func (e *netEnv) toxic(name, typ, stream, attributes string) (remove func()) {
	e.t.Helper()
	body := `{"name":"` + name + `","type":"` + typ + `","stream":"` + stream + `","attributes":` + attributes + `}`
	if _, err := e.proxy.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		e.t.Fatalf("toxic %s: %v", body, err)
	}
	return func() {
		if err := e.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
			e.t.Errorf("remove toxic %s: %v", name, err)
		}
	}
}

// unary makes one Echo call with a deadline d, checks that it returned
// within d (plus netSlack), and returns its error.
func (e *netEnv) unary(msg string, d time.Duration, opts ...grpc.CallOption) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	_, err := e.echo.Echo(ctx, &echov1.EchoRequest{Message: msg}, opts...)
	e.done(start, d)
	return err
}

// done counts a call that started at start with deadline d.
func (e *netEnv) done(start time.Time, d time.Duration) {
	e.calls.Add(1)
	if took := time.Since(start); took > d+netSlack {
		e.overruns.Add(1)
		e.t.Errorf("a call with a %v deadline returned after %v", d, took)
	}
}

// summary logs the counts the issue asks for.
func (e *netEnv) summary(duplicates, lost int) {
	e.t.Helper()
	leaked := 0
	if heldGuards(e.c) != "" {
		leaked = 1
	}
	e.t.Logf("summary: calls %d, duplicates executed %d, lost stream messages %d, leaked slots %d, deadline overruns %d",
		e.calls.Load(), duplicates, lost, leaked, e.overruns.Load())
}

// netRetry is the retry policy of the network tests: four attempts, short
// backoff, UNAVAILABLE retried.
func netRetry(perAttempt time.Duration) *serviceconfig.RetryPolicy {
	return &serviceconfig.RetryPolicy{
		MaxAttempts:           4,
		InitialBackoff:        10 * time.Millisecond,
		MaxBackoff:            50 * time.Millisecond,
		BackoffMultiplier:     2,
		RetryableStatusCodes:  []codes.Code{codes.Unavailable},
		PerAttemptRecvTimeout: perAttempt,
	}
}

// A connection cut after the handler ran, before its response reached the
// client: the client retries on a new connection. With an idempotency key
// the server replays the stored response (one execution); without one the
// handler runs again, which is why side effects need keys.
func TestNetFaultCutMidUnaryRetriesOnNewConnection(t *testing.T) {
	tests := []struct {
		name      string
		keyed     bool
		wantExecs int
	}{
		{name: "keyed", keyed: true, wantExecs: 1},
		{name: "unkeyed", keyed: false, wantExecs: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := []ClientOption{WithRetryPolicy(netRetry(0), "resilience.echo.v1.EchoService")}
			if tt.keyed {
				opts = append(opts, WithIdempotencyKeys("/resilience.echo.v1.EchoService/Echo"))
			}
			e := newNetEnv(t, netEnvConfig{client: opts, keyed: tt.keyed})
			e.srv.fault = func(_ string, attempt, _ int) {
				if attempt == 1 {
					e.cut()
				}
			}
			if err := e.unary("order-1", 5*time.Second); err != nil {
				t.Fatalf("Echo through a cut connection = %v, want success after a retry", err)
			}
			peers := e.srv.attempts("Echo")
			if len(peers) < 2 {
				t.Fatalf("server saw %d attempts, want a retry after the cut", len(peers))
			}
			if peers[0] == peers[len(peers)-1] {
				t.Errorf("retry came from %s, the cut connection's address; want a new connection", peers[0])
			}
			if got := e.srv.executions("order-1"); got != tt.wantExecs {
				t.Errorf("handler executions = %d, want %d", got, tt.wantExecs)
			}
			dups := 0
			if tt.keyed {
				dups = e.srv.executions("order-1") - 1
			}
			e.summary(dups, 0)
		})
	}
}

// Streams cut before they commit are replayed on a new connection: the
// caller sees every response once, the server's successful attempt every
// request once. Cut after commit, the error reaches the caller unchanged
// and nothing is retried.
func TestNetFaultCutMidStream(t *testing.T) {
	const count = 5
	t.Run("server stream before commit", func(t *testing.T) {
		e := newNetEnv(t, netEnvConfig{client: []ClientOption{WithRetryPolicy(netRetry(0), "resilience.echo.v1.EchoService")}})
		e.srv.fault = func(_ string, attempt, sent int) {
			if attempt == 1 && sent == 0 {
				e.cut()
			}
		}
		got, err := e.serverStream("s", count, 5*time.Second, nil)
		if err != nil {
			t.Fatalf("stream through a cut before commit: %v, want it replayed", err)
		}
		lost, dups := checkIndexes(t, got, count)
		if peers := e.srv.attempts("ServerStream"); len(peers) != 2 || peers[0] == peers[1] {
			t.Errorf("server stream attempts from %v, want two, on two connections", peers)
		}
		e.summary(dups, lost)
	})
	cuts := []struct {
		name string
		cut  func(e *netEnv)
	}{
		{name: "proxy restart", cut: (*netEnv).cut},
		// limit_data closes the connection once its byte allowance (none
		// here) is spent: the next response never leaves the proxy.
		{name: "limit_data", cut: func(e *netEnv) { e.toxic("limit", "limit_data", "downstream", `{"bytes":0}`) }},
	}
	for _, c := range cuts {
		t.Run("server stream after commit, "+c.name, func(t *testing.T) {
			e := newNetEnv(t, netEnvConfig{client: []ClientOption{WithRetryPolicy(netRetry(0), "resilience.echo.v1.EchoService")}})
			read3 := make(chan struct{})
			e.srv.fault = func(_ string, attempt, sent int) {
				if attempt == 1 && sent == 3 {
					<-read3 // the caller has read three responses: committed
					c.cut(e)
				}
			}
			got, err := e.serverStream("s", count, 5*time.Second, func(n int) {
				if n == 3 {
					close(read3)
				}
			})
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("stream cut after commit ended with %v, want the transport's UNAVAILABLE", err)
			}
			if len(got) != 3 {
				t.Errorf("caller read %d responses before the cut, want 3", len(got))
			}
			_, dups := checkIndexes(t, got, len(got))
			if n := len(e.srv.attempts("ServerStream")); n != 1 {
				t.Errorf("server saw %d attempts, want 1: a committed stream is not retried", n)
			}
			e.summary(dups, 0)
		})
	}
	t.Run("bidi before commit", func(t *testing.T) {
		e := newNetEnv(t, netEnvConfig{client: []ClientOption{WithRetryPolicy(netRetry(0), "resilience.echo.v1.EchoService")}})
		e.srv.fault = func(_ string, attempt, sent int) {
			if attempt == 1 && sent == 0 {
				e.cut()
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		stream, err := e.echo.BidiStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sent := []string{"m0", "m1", "m2"}
		for _, m := range sent {
			if err := stream.Send(&echov1.BidiStreamRequest{Message: m}); err != nil {
				t.Fatalf("Send(%s): %v", m, err)
			}
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			r, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("bidi through a cut before commit: %v after %v, want it replayed", err, got)
			}
			got = append(got, r.GetMessage())
		}
		e.done(start, 5*time.Second)
		if strings.Join(got, ",") != "m0,m1,m2" {
			t.Errorf("caller read %v, want m0,m1,m2 once each", got)
		}
		e.srv.mu.Lock()
		received := e.srv.received
		e.srv.mu.Unlock()
		lost, dups := 0, 0
		if len(received) != 2 {
			t.Fatalf("server attempts received %v, want two attempts", received)
		}
		for i, m := range sent {
			if i >= len(received[1]) {
				lost++
			}
			if c := strings.Count(strings.Join(received[1], ","), m); c > 1 {
				dups += c - 1
			}
		}
		if strings.Join(received[1], ",") != "m0,m1,m2" {
			t.Errorf("replayed attempt received %v, want m0,m1,m2 once each", received[1])
		}
		e.summary(dups, lost)
	})
}

// serverStream reads a ServerStream of count responses carrying msg;
// onRead runs after each response with the number read so far.
func (e *netEnv) serverStream(msg string, count int, d time.Duration, onRead func(n int)) ([]int32, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	defer e.done(start, d)
	stream, err := e.echo.ServerStream(ctx, &echov1.ServerStreamRequest{Message: msg, Count: int32(count)})
	if err != nil {
		return nil, err
	}
	var got []int32
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		got = append(got, r.GetIndex())
		if onRead != nil {
			onRead(len(got))
		}
	}
}

// checkIndexes checks that got is 0..want-1 in order and returns the lost
// and duplicated indexes.
func checkIndexes(t *testing.T, got []int32, want int) (lost, dups int) {
	t.Helper()
	seen := make(map[int32]int)
	for _, i := range got {
		seen[i]++
	}
	for i := range int32(want) {
		switch seen[i] {
		case 0:
			lost++
		case 1:
		default:
			dups += seen[i] - 1
		}
	}
	if lost != 0 || dups != 0 || len(got) != want {
		t.Errorf("responses %v: %d lost, %d duplicated, want 0..%d once each", got, lost, dups, want-1)
	}
	return lost, dups
}

// A blackhole (the peer accepts, then never answers: packets dropped, no
// RST) on a live connection: per-attempt timeouts cut each attempt and the
// call ends within its deadline; without them the call ends at its
// deadline, not later. After the blackhole, the client recovers.
func TestNetFaultBlackhole(t *testing.T) {
	const perAttempt = 150 * time.Millisecond
	var retries atomic.Int64
	e := newNetEnv(t, netEnvConfig{client: []ClientOption{
		WithRetryPolicy(&serviceconfig.RetryPolicy{
			MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond, BackoffMultiplier: 1,
			// An explicit list is honoured as written: DEADLINE_EXCEEDED
			// must be in it for the per-attempt timeout to be retried.
			RetryableStatusCodes: []codes.Code{codes.Unavailable, codes.DeadlineExceeded}, PerAttemptRecvTimeout: perAttempt,
		}, "/resilience.echo.v1.EchoService/Echo"),
		WithOnRetry(func(_ context.Context, ev RetryEvent) {
			if status.Code(ev.Err) == codes.DeadlineExceeded {
				retries.Add(1)
			}
		}),
	}})
	if err := e.unary("warm-up", 5*time.Second); err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	// Count the blackholed call's retries only: on a busy machine the
	// warm-up (a new connection) may outlast a per-attempt timeout too.
	retries.Store(0)
	remove := e.toxic("blackhole", "timeout", "upstream", `{"timeout":0}`)

	start := time.Now()
	err := e.unary("into-the-hole", 3*time.Second)
	took := time.Since(start)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("Echo into a blackhole = %v, want DEADLINE_EXCEEDED from the per-attempt timeout", err)
	}
	if got := retries.Load(); got != 2 {
		t.Errorf("retries after per-attempt timeouts = %d, want 2 (3 attempts)", got)
	}
	if took < 3*perAttempt || took > 3*perAttempt+time.Second {
		t.Errorf("3 attempts cut at %v each took %v", perAttempt, took)
	}

	const deadline = 400 * time.Millisecond
	start = time.Now()
	err = e.unary("into-the-hole", deadline, PerAttemptTimeout(0))
	if took := time.Since(start); status.Code(err) != codes.DeadlineExceeded || took < deadline {
		t.Errorf("Echo into a blackhole without per-attempt timeout = %v after %v, want DEADLINE_EXCEEDED at %v", err, took, deadline)
	}
	if n := e.srv.executions("into-the-hole"); n != 0 {
		t.Errorf("blackholed requests reached the handler %d times", n)
	}

	// The bytes the blackhole swallowed leave the connection unusable; the
	// peer restarts (a new connection) and the client recovers.
	remove()
	e.cut()
	if err := e.unary("after", 5*time.Second); err != nil {
		t.Errorf("Echo after the blackhole = %v, want success", err)
	}
	e.summary(0, 0)
}

// Latency with jitter, both ways, under hedging with idempotency keys:
// hedges fire, every call succeeds within its deadline, and the server runs
// each keyed call once.
func TestNetFaultLatencyJitterHedged(t *testing.T) {
	var hedges atomic.Int64
	e := newNetEnv(t, netEnvConfig{keyed: true, client: []ClientOption{
		WithMethodConfig(serviceconfig.MethodConfig{
			Name:          []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService", Method: "Echo"}},
			HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 3, HedgingDelay: 20 * time.Millisecond},
		}),
		WithIdempotencyKeys("/resilience.echo.v1.EchoService/Echo"),
		WithOnRetry(func(_ context.Context, ev RetryEvent) {
			if ev.Hedge {
				hedges.Add(1)
			}
		}),
	}})
	e.toxic("latency-down", "latency", "downstream", `{"latency":30,"jitter":25}`)
	e.toxic("latency-up", "latency", "upstream", `{"latency":10,"jitter":10}`)
	const workers, calls = 4, 5
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range calls {
				msg := "w" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
				if err := e.unary(msg, 3*time.Second); err != nil {
					t.Errorf("Echo(%s) under latency = %v", msg, err)
				}
			}
		})
	}
	wg.Wait()
	dups := 0
	for w := range workers {
		for i := range calls {
			msg := "w" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
			if n := e.srv.executions(msg); n != 1 {
				t.Errorf("handler ran %s %d times, want 1", msg, n)
				dups += max(n-1, 0)
			}
		}
	}
	if hedges.Load() == 0 {
		t.Errorf("no hedge fired under %s latency, want some", "30±25 ms")
	}
	t.Logf("hedges sent: %d, attempts on the server: %d", hedges.Load(), len(e.srv.attempts("Echo")))
	e.summary(dups, 0)
}

// A bandwidth limit slows a server stream; it completes in order within a
// generous deadline, and a deadline shorter than the transfer ends it with
// DEADLINE_EXCEEDED, on time, without a retry (the stream had committed).
func TestNetFaultBandwidth(t *testing.T) {
	e := newNetEnv(t, netEnvConfig{client: []ClientOption{WithRetryPolicy(netRetry(0), "resilience.echo.v1.EchoService")}})
	e.toxic("bandwidth", "bandwidth", "downstream", `{"rate":256}`) // KB/s
	const count = 20
	payload := strings.Repeat("x", 8<<10) // 20 × 8 KiB at 256 KB/s: about 0.6 s
	read := func(d time.Duration) ([]int32, error) { return e.serverStream(payload, count, d, nil) }
	start := time.Now()
	got, err := read(10 * time.Second)
	if err != nil {
		t.Fatalf("stream under a bandwidth limit: %v", err)
	}
	took := time.Since(start)
	lost, dups := checkIndexes(t, got, count)
	if took < 300*time.Millisecond {
		t.Errorf("160 KiB at 256 KB/s took %v: the limit did not apply", took)
	}

	before := len(e.srv.attempts("ServerStream"))
	got, err = read(250 * time.Millisecond)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("stream with a deadline shorter than the transfer = %v after %d responses, want DEADLINE_EXCEEDED", err, len(got))
	}
	if n := len(e.srv.attempts("ServerStream")) - before; n != 1 {
		t.Errorf("server saw %d attempts of the short stream, want 1", n)
	}
	e.summary(dups, lost)
}

// The proxy goes down (connections refused) or resets every connection
// (RST), and comes back: the breaker opens, fails calls fast with
// ErrCircuitOpen while open, probes after OpenDuration, and closes once the
// path works; calls recover within a bound.
func TestNetFaultProxyDownAndBackBreaker(t *testing.T) {
	const openFor = 200 * time.Millisecond
	tests := []struct {
		name string
		down func(e *netEnv) (up func())
	}{
		{name: "refused", down: func(e *netEnv) func() {
			e.proxy.Stop()
			return func() {
				if err := e.proxy.Start(); err != nil {
					t.Errorf("toxiproxy restart: %v", err)
				}
			}
		}},
		{name: "reset", down: func(e *netEnv) func() {
			remove := e.toxic("rst", "reset_peer", "upstream", `{"timeout":0}`)
			e.cut() // new connections only: the toxic's RST applies to links it starts with
			return remove
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			var changes []string
			e := newNetEnv(t, netEnvConfig{client: []ClientOption{
				WithMethodConfig(serviceconfig.MethodConfig{
					Name:           []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService"}},
					RetryPolicy:    &serviceconfig.RetryPolicy{MaxAttempts: 2, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond, BackoffMultiplier: 1, RetryableStatusCodes: []codes.Code{codes.Unavailable}},
					CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 3, OpenDuration: openFor, HalfOpenProbes: 1},
				}),
				WithOnStateChange(func(_ string, from, to BreakerState) {
					mu.Lock()
					defer mu.Unlock()
					changes = append(changes, from.String()+">"+to.String())
				}),
			}})
			const method = "/resilience.echo.v1.EchoService/Echo"
			if err := e.unary("warm-up", 5*time.Second); err != nil {
				t.Fatalf("warm-up: %v", err)
			}
			up := tt.down(e)

			// Down: failures until the breaker opens, then fast rejections.
			var failed, rejected int
			for i := 0; rejected == 0 && i < 20; i++ {
				err := e.unary("down-"+strconv.Itoa(i), 2*time.Second)
				switch {
				case errors.Is(err, ErrCircuitOpen):
					rejected++
				case status.Code(err) == codes.Unavailable:
					failed++
				default:
					t.Fatalf("call with the proxy down = %v, want UNAVAILABLE or ErrCircuitOpen", err)
				}
			}
			if rejected == 0 {
				t.Fatalf("breaker did not open after %d failures", failed)
			}
			if s := e.c.Status(method).Breaker; s == nil || s.State != BreakerOpen {
				t.Errorf("breaker = %+v, want open", s)
			}
			start := time.Now()
			err := e.unary("fast", time.Second)
			if !errors.Is(err, ErrCircuitOpen) || status.Code(err) != codes.Unavailable || time.Since(start) > 100*time.Millisecond+netSlack {
				t.Errorf("call on an open breaker = %v after %v, want ErrCircuitOpen at once", err, time.Since(start))
			}

			// Up: the breaker probes after openFor and closes.
			up()
			back := time.Now()
			var recovered bool
			for time.Since(back) < 5*time.Second {
				if err := e.unary("up", 2*time.Second); err == nil {
					recovered = true
					break
				}
				time.Sleep(20 * time.Millisecond) // real network: poll the recovery
			}
			if !recovered {
				t.Fatalf("no success within 5s of the proxy coming back")
			}
			t.Logf("recovered %v after the proxy came back (OpenDuration %v)", time.Since(back).Round(time.Millisecond), openFor)
			if s := e.c.Status(method).Breaker; s == nil || s.State != BreakerClosed {
				t.Errorf("breaker after recovery = %+v, want closed", s)
			}
			mu.Lock()
			got := strings.Join(changes, " ")
			mu.Unlock()
			if !strings.HasPrefix(got, "closed>open") || !strings.HasSuffix(got, "half-open>closed") {
				t.Errorf("breaker transitions %q, want closed>open … half-open>closed", got)
			}
			t.Logf("failed %d, rejected fast %d, transitions %s", failed, rejected, got)
			e.summary(0, 0)
		})
	}
}
