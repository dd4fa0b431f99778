package server

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/pushback"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestConcurrencyLimitOptionErrors: the errors of Limits.Config, from
// Validate and New alike, with the JSON path of the field at fault.
func TestConcurrencyLimitOptionErrors(t *testing.T) {
	method := func(n serviceconfig.Name, cfg serviceconfig.ConcurrencyLimit) Limits {
		return Limits{Config: serviceconfig.ServerConfig{MethodConfig: []serviceconfig.ServerMethodConfig{
			{Name: []serviceconfig.Name{n}, ConcurrencyLimit: &cfg}}}}
	}
	tests := []struct {
		name string
		l    Limits
		want string
	}{
		{"unknown algorithm", limitsOf(serviceconfig.ConcurrencyLimit{Algorithm: "gradient"}),
			`server: Limits.Config: serviceconfig: concurrencyLimit.algorithm: must be "vegas" or "aimd"`},
		{"min over max", limitsOf(serviceconfig.ConcurrencyLimit{MinLimit: 5, MaxLimit: 4}), "server: Limits.Config: serviceconfig: concurrencyLimit.minLimit: must not exceed maxLimit"},
		{"initial under min", limitsOf(serviceconfig.ConcurrencyLimit{MinLimit: 5, InitialLimit: 4}), "server: Limits.Config: serviceconfig: concurrencyLimit.initialLimit: must not be less than minLimit"},
		{"negative window", limitsOf(serviceconfig.ConcurrencyLimit{BaseWindow: -1}), "server: Limits.Config: serviceconfig: concurrencyLimit.baseWindow: must not be negative"},
		{"bad method name", method(serviceconfig.Name{Method: "svc"}, serviceconfig.ConcurrencyLimit{}),
			"server: Limits.Config: serviceconfig: methodConfig[0].name[0].service: must not be empty"},
		{"bad method config", method(serviceconfig.Name{Service: "pkg.S"}, serviceconfig.ConcurrencyLimit{MaxLimit: -1}),
			"server: Limits.Config: serviceconfig: methodConfig[0].concurrencyLimit.maxLimit: must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantLimitsError(t, tt.l, tt.want) })
	}
}

// blockingEcho holds each Echo until release is closed, after started
// reports it.
type blockingEcho struct {
	echov1.UnimplementedEchoServiceServer
	started chan struct{}
	release chan struct{}
	svc     time.Duration // slept before answering when release is nil
}

func (b *blockingEcho) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	if b.started != nil {
		b.started <- struct{}{}
	}
	if b.release != nil {
		<-b.release
	}
	time.Sleep(b.svc)
	if req.GetMessage() == "panic" {
		panic("handler panic")
	}
	return &echov1.EchoResponse{Message: req.GetMessage()}, nil
}

// sleepHandler is a unary handler that takes d (on the bubble's clock in
// synctest) and answers "ok".
func sleepHandler(d time.Duration) grpc.UnaryHandler {
	return func(context.Context, any) (any, error) {
		time.Sleep(d)
		return "ok", nil
	}
}

// limitOfOne is a server whose limit is one call.
func limitOfOne(t *testing.T, opts ...Option) *Server {
	t.Helper()
	return newLimitServer(t, limitsOf(serviceconfig.ConcurrencyLimit{InitialLimit: 1, MinLimit: 1, MaxLimit: 1}), opts...)
}

// TestShedCarriesRetryInfoAndPushback: a call over the limit fails at once
// with RESOURCE_EXHAUSTED, a RetryInfo detail, and the A6 trailer with the
// same delay; the handler does not run for it.
func TestShedCarriesRetryInfoAndPushback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		impl := &blockingEcho{started: make(chan struct{}, 1), release: make(chan struct{})}
		srv := limitOfOne(t)
		cc := serveEcho(t, impl, srv)
		client := echov1.NewEchoServiceClient(cc)
		done := make(chan error)
		go func() {
			_, err := client.Echo(context.Background(), &echov1.EchoRequest{Message: "first"})
			done <- err
		}()
		<-impl.started
		var trailer metadata.MD
		_, err := client.Echo(context.Background(), &echov1.EchoRequest{Message: "second"}, grpc.Trailer(&trailer))
		st := status.Convert(err)
		if st.Code() != codes.ResourceExhausted {
			t.Fatalf("second call: %v, want RESOURCE_EXHAUSTED", err)
		}
		var ri *errdetails.RetryInfo
		for _, d := range st.Details() {
			if r, ok := d.(*errdetails.RetryInfo); ok {
				ri = r
			}
		}
		if ri == nil {
			t.Fatalf("second call: no RetryInfo in %v", st.Details())
		}
		hint, ok, refuse := pushback.Hint(nil, trailer)
		if !ok || refuse || hint != ri.GetRetryDelay().AsDuration() || hint < time.Millisecond {
			t.Errorf("trailer %v gives %v (ok %v, refuse %v), want RetryInfo's %v", trailer, hint, ok, refuse, ri.GetRetryDelay().AsDuration())
		}
		close(impl.release)
		if err := <-done; err != nil {
			t.Errorf("first call: %v", err)
		}
		ls := srv.LimitStatuses()
		if len(ls) != 1 || ls[0].ShedLimit[wire.Critical] != 1 || ls[0].Admitted[wire.Critical] != 1 || ls[0].InFlight != 0 {
			t.Errorf("LimitStatuses() = %+v, want 1 admitted, 1 shed, none in flight", ls)
		}
	})
}

// TestShedSaysDoNotRetryWhenMostAreShed: once the server sheds half of
// what arrives or more, a shed call's trailer says not to retry, and it
// carries no RetryInfo.
func TestShedSaysDoNotRetryWhenMostAreShed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		impl := &blockingEcho{started: make(chan struct{}, 1), release: make(chan struct{})}
		cc := serveEcho(t, impl, limitOfOne(t))
		client := echov1.NewEchoServiceClient(cc)
		done := make(chan error)
		go func() {
			_, err := client.Echo(context.Background(), &echov1.EchoRequest{})
			done <- err
		}()
		<-impl.started
		var trailer metadata.MD
		var err error
		for range 50 { // 1 − (63/64)^45 ≥ 1/2
			trailer = nil
			_, err = client.Echo(context.Background(), &echov1.EchoRequest{}, grpc.Trailer(&trailer))
		}
		if _, _, refuse := pushback.Hint(nil, trailer); !refuse || status.Code(err) != codes.ResourceExhausted {
			t.Errorf("50th shed call: %v, trailer %v, want RESOURCE_EXHAUSTED and do-not-retry", err, trailer)
		}
		if len(status.Convert(err).Details()) != 0 {
			t.Errorf("do-not-retry shed carries details %v", status.Convert(err).Details())
		}
		close(impl.release)
		<-done
	})
}

// TestDeadlineShorterThanServiceTimeRejectedAtTheDoor: once the server
// knows its service time (100ms), a call with 50ms left fails with
// DEADLINE_EXCEEDED and its handler does not run; one with 100ms runs.
func TestDeadlineShorterThanServiceTimeRejectedAtTheDoor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		impl := &blockingEcho{started: make(chan struct{}, 10), svc: 100 * time.Millisecond}
		srv, err := New(WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{})))
		if err != nil {
			t.Fatal(err)
		}
		client := echov1.NewEchoServiceClient(serveEcho(t, impl, srv))
		call := func(d time.Duration) error {
			ctx := context.Background()
			if d > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, d)
				defer cancel()
			}
			_, err := client.Echo(ctx, &echov1.EchoRequest{})
			return err
		}
		if err := call(0); err != nil {
			t.Fatal(err)
		}
		<-impl.started
		err = call(50 * time.Millisecond)
		if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "not started") {
			t.Errorf("call with 50ms left: %v, want DEADLINE_EXCEEDED, not started", err)
		}
		if len(impl.started) != 0 {
			t.Errorf("the handler ran for the call rejected at the door")
		}
		if err := call(100 * time.Millisecond); status.Code(err) == codes.DeadlineExceeded && strings.Contains(err.Error(), "not started") {
			t.Errorf("call with exactly the service time left was rejected at the door: %v", err)
		}
		if got := srv.LimitStatuses()[0].ShedDeadline[wire.Critical]; got != 1 {
			t.Errorf("ShedDeadline[wire.Critical] = %d, want 1", got)
		}
	})
}

// TestMethodLimitsAreSeparate: a method's own limit does not hold the
// others, and the server's limit does not count the method's calls.
func TestMethodLimitsAreSeparate(t *testing.T) {
	one := serviceconfig.ConcurrencyLimit{InitialLimit: 1, MinLimit: 1, MaxLimit: 1}
	l := limitsOf(serviceconfig.ConcurrencyLimit{})
	l.Config.MethodConfig = []serviceconfig.ServerMethodConfig{
		methodLimitOf(t, "/resilience.echo.v1.EchoService/Echo", one),
		methodLimitOf(t, "other.Service", one),
	}
	srv := newLimitServer(t, l)
	tests := []struct {
		method string
		want   string // name of the limiter that applies
	}{
		{"/resilience.echo.v1.EchoService/Echo", "/resilience.echo.v1.EchoService/Echo"},
		{"/resilience.echo.v1.EchoService/Lookup", ""},
		{"/other.Service/M", "other.Service"},
		{"/x", ""},
		{"", ""},
	}
	names := map[any]string{}
	for _, ls := range srv.limits.all {
		names[ls.l] = ls.name
	}
	for _, tt := range tests {
		if got := names[srv.limits.lookup(tt.method)]; got != tt.want {
			t.Errorf("lookup(%q) = limiter %q, want %q", tt.method, got, tt.want)
		}
	}
	if got := len(srv.LimitStatuses()); got != 3 {
		t.Errorf("LimitStatuses() has %d entries, want 3", got)
	}
}

// TestLimitReleasedOnPanic: a panicking handler gives its slot back, and
// the panic goes on up.
func TestLimitReleasedOnPanic(t *testing.T) {
	srv := limitOfOne(t)
	icpt := srv.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"}
	func() {
		defer func() {
			if recover() == nil {
				t.Errorf("panic did not propagate")
			}
		}()
		_, _ = icpt(context.Background(), nil, info, func(context.Context, any) (any, error) { panic("boom") })
	}()
	if _, err := icpt(context.Background(), nil, info, func(context.Context, any) (any, error) { return "ok", nil }); err != nil {
		t.Errorf("call after the panic: %v, want the slot free", err)
	}
	if got := srv.LimitStatuses()[0].InFlight; got != 0 {
		t.Errorf("InFlight = %d, want 0", got)
	}
}

// TestLimitCancelledCallIsNoSample: a call its caller cancelled releases
// its slot without teaching the limit anything.
func TestLimitCancelledCallIsNoSample(t *testing.T) {
	srv := limitOfOne(t)
	icpt := srv.UnaryServerInterceptor()
	ctx, cancel := context.WithCancel(context.Background())
	_, _ = icpt(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"}, func(context.Context, any) (any, error) {
		cancel()
		return nil, errors.New("cancelled")
	})
	st := srv.LimitStatuses()[0]
	if st.InFlight != 0 || st.BaseRTT != 0 {
		t.Errorf("after a cancelled call: %+v, want nothing in flight and no sample", st)
	}
}

// TestLimitHotPathAllocatesNothing: the limit adds no allocation to an
// admitted call without criticality metadata.
func TestLimitHotPathAllocatesNothing(t *testing.T) {
	srv, err := New(WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{})))
	if err != nil {
		t.Fatal(err)
	}
	icpt := srv.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-other", "v"))
	h := func(context.Context, any) (any, error) { return nil, nil }
	if n := testing.AllocsPerRun(1000, func() { _, _ = icpt(ctx, nil, info, h) }); n != 0 {
		t.Errorf("allocs per admitted call = %v, want 0", n)
	}
}

// TestCPUSheddingAndShutdownAllocateNothing: the one admission path's
// other gates add no allocation either: a call the CPU shedder admits
// (the CPU cool or hot), and a call refused once Shutdown has begun.
func TestCPUSheddingAndShutdownAllocateNothing(t *testing.T) {
	info := &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"}
	ctx := context.Background()
	h := func(context.Context, any) (any, error) { return nil, nil }
	for _, cpu := range []float64{0.5, 1} {
		srv, err := New(WithLimits(Limits{CPU: &CPUShedding{CPU: func() float64 { return cpu }}}))
		if err != nil {
			t.Fatal(err)
		}
		icpt := srv.UnaryServerInterceptor()
		if n := testing.AllocsPerRun(1000, func() { _, _ = icpt(ctx, nil, info, h) }); n != 0 {
			t.Errorf("CPU at %v: allocs per admitted call = %v, want 0", cpu, n)
		}
	}
	srv, err := New(WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{})))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	icpt := srv.UnaryServerInterceptor()
	if n := testing.AllocsPerRun(1000, func() { _, _ = icpt(ctx, nil, info, h) }); n != 0 {
		t.Errorf("allocs per call refused while shutting down = %v, want 0", n)
	}
}

// TestWithServerConfig: Limits.Config takes the document ParseServer read.
func TestWithServerConfig(t *testing.T) {
	cfg, err := serviceconfig.ParseServer([]byte(`{"concurrencyLimit": {"maxLimit": 50},
		"methodConfig": [{"name": [{"service": "shop.Orders", "method": "Report"}, {"service": "shop.Admin"}],
			"concurrencyLimit": {"algorithm": "aimd", "initialLimit": 3, "maxLimit": 4}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(WithLimits(Limits{Config: *cfg}))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, ls := range srv.LimitStatuses() {
		got[ls.Name] = ls.Limit
	}
	want := map[string]int{"": 20, "/shop.Orders/Report": 3, "shop.Admin": 3}
	if len(got) != len(want) {
		t.Fatalf("limits = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("limit %q = %d, want %d", k, got[k], v)
		}
	}
	bad := serviceconfig.ServerConfig{MethodConfig: []serviceconfig.ServerMethodConfig{{Name: []serviceconfig.Name{{Service: "a.B"}}}}}
	wantLimitsError(t, Limits{Config: bad}, "server: Limits.Config: serviceconfig: methodConfig[0]: needs a concurrencyLimit or rateLimits")
}

func TestCPUSheddingOptions(t *testing.T) {
	both := limitsOf(serviceconfig.ConcurrencyLimit{})
	both.CPU = &CPUShedding{}
	wantLimitsError(t, both, "server: Limits: Config.ConcurrencyLimit and CPU: choose one")
	wantLimitsError(t, Limits{CPU: &CPUShedding{CPUThreshold: 1.5}}, "server: Limits.CPU: limit: cpuThreshold")
	// With a method limit of its own, the method is not under the CPU
	// shedder; the others are.
	srv := newLimitServer(t, Limits{CPU: &CPUShedding{CPU: func() float64 { return 0 }},
		Config: serviceconfig.ServerConfig{MethodConfig: []serviceconfig.ServerMethodConfig{
			methodLimitOf(t, "a.B", serviceconfig.ConcurrencyLimit{})}}})
	icpt := srv.UnaryServerInterceptor()
	h := func(context.Context, any) (any, error) { return nil, nil }
	_, _ = icpt(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/a.B/C"}, h)
	_, _ = icpt(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x.Y/Z"}, h)
	got := map[string]uint64{}
	for _, ls := range srv.LimitStatuses() {
		got[ls.Name] = ls.Admitted[wire.Critical]
	}
	if got[CPUSheddingName] != 1 || got["a.B"] != 1 {
		t.Errorf("admitted by limit = %v, want one each", got)
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x", "y"))
	info := &grpc.UnaryServerInfo{FullMethod: "/x.Y/Z"}
	if n := testing.AllocsPerRun(1000, func() { _, _ = icpt(ctx, nil, info, h) }); n != 0 {
		t.Errorf("allocs per call under CPU shedding = %v, want 0", n)
	}
}

// TestQueueWaitsForASlot: with a limit of 1 and a queue of 1 (50ms), a call
// arriving while another runs waits and runs after it; a third finds the
// queue full and is shed at once; a call that waits longer than 50ms is
// shed with the pushback.
func TestQueueWaitsForASlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, err := New(WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{
			InitialLimit: 1, MinLimit: 1, MaxLimit: 1, MaxQueue: 1, MaxQueueWait: 50 * time.Millisecond})))
		if err != nil {
			t.Fatal(err)
		}
		icpt := srv.UnaryServerInterceptor()
		info := &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"}
		results := make(chan error, 3)
		run := func(d time.Duration) {
			go func() {
				_, err := icpt(context.Background(), nil, info, sleepHandler(d))
				results <- err
			}()
			synctest.Wait()
		}
		start := time.Now()
		run(30 * time.Millisecond) // runs
		run(10 * time.Millisecond) // queued
		if q := srv.LimitStatuses()[0].Queued; q != 1 {
			t.Errorf("Queued = %d, want 1", q)
		}
		run(time.Millisecond) // queue full: shed at once
		if err := <-results; status.Code(err) != codes.ResourceExhausted || time.Since(start) != 0 {
			t.Errorf("third call: %v after %v, want RESOURCE_EXHAUSTED at once", err, time.Since(start))
		}
		for range 2 {
			if err := <-results; err != nil {
				t.Errorf("first or queued call: %v", err)
			}
		}
		if d := time.Since(start); d != 40*time.Millisecond {
			t.Errorf("the queued call ended after %v, want 40ms (30ms wait + 10ms)", d)
		}
		// Too long a wait: shed after 50ms.
		start = time.Now()
		run(200 * time.Millisecond)
		run(time.Millisecond)
		if err := <-results; status.Code(err) != codes.ResourceExhausted || time.Since(start) != 50*time.Millisecond {
			t.Errorf("queued past MaxQueueWait: %v after %v, want RESOURCE_EXHAUSTED after 50ms", err, time.Since(start))
		}
		<-results
		st := srv.LimitStatuses()[0]
		if st.InFlight != 0 || st.Queued != 0 || st.Admitted[wire.Critical] != 3 {
			t.Errorf("after: %+v, want nothing held and 3 admitted", st)
		}
	})
}
