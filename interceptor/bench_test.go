package interceptor

import (
	"context"
	"errors"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// okInvoker is a grpc.UnaryInvoker that succeeds at once, so a measurement
// sees the interceptor alone.
func okInvoker(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
	return nil
}

// benchConfigs are the client configurations the benchmarks compare, each
// with a retry policy on the success path.
var benchConfigs = []struct {
	name string
	opts []ClientOption
}{
	{"retry", []ClientOption{WithRetryBudget(nil)}},
	{"retry+budget", nil}, // the default
	{"retry+budget+throttle", []ClientOption{WithServiceConfig(&serviceconfig.Config{
		RetryThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 0.1},
	})}},
	{"retry+budget+metrics", []ClientOption{WithMeterProvider(
		sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())))}},
	// The method config replaces the default retry policy for the
	// service, so it names one of its own.
	{"retry+budget+breaker+bulkhead", []ClientOption{WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: echoService}},
		RetryPolicy:    fastPolicy(4),
		CircuitBreaker: &serviceconfig.CircuitBreaker{},
		Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 1 << 20},
	})}},
	{"every feature", []ClientOption{WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: echoService}},
		RetryPolicy:    fastPolicy(4),
		CircuitBreaker: &serviceconfig.CircuitBreaker{},
		Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 1 << 20},
	}), WithServiceConfig(&serviceconfig.Config{
		RetryThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 0.1},
	}), WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))),
		WithOnRetry(func(context.Context, RetryEvent) {}), WithOnStop(func(context.Context, StopEvent) {}),
		WithOnStateChange(func(string, BreakerState, BreakerState) {})}},
}

func newConfiguredClient(tb testing.TB, opts ...ClientOption) *Client {
	tb.Helper()
	return newTestClient(tb, append([]ClientOption{WithRetryPolicy(fastPolicy(4))}, opts...)...)
}

// TestUnarySuccessPathAllocatesNothing pins the interceptor's own cost on
// the success path at 0 allocations, with a deadline on the context (as
// every real call has) and every configuration of benchConfigs, called as
// a generated stub calls (grpc.StaticMethod, so metrics name the method).
func TestUnarySuccessPathAllocatesNothing(t *testing.T) {
	for _, bc := range benchConfigs {
		t.Run(bc.name, func(t *testing.T) {
			ic := newConfiguredClient(t, bc.opts...).UnaryClientInterceptor()
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
			static := []grpc.CallOption{grpc.StaticMethod()}               // as grpc passes them: one slice
			_ = ic(ctx, echoMethod, req, reply, nil, okInvoker, static...) // resolve the method's policy once
			allocs := testing.AllocsPerRun(1000, func() {
				if err := ic(ctx, echoMethod, req, reply, nil, okInvoker, static...); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Errorf("UnaryClientInterceptor success path: %v allocs per call, want 0", allocs)
			}
		})
	}
}

// BenchmarkInterceptorOnly measures the interceptor around an invoker that
// does nothing, for each configuration, serially and in parallel.
func BenchmarkInterceptorOnly(b *testing.B) {
	for _, bc := range benchConfigs {
		ic := newConfiguredClient(b, bc.opts...).UnaryClientInterceptor()
		ctx := context.Background()
		b.Run(bc.name, func(b *testing.B) {
			req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
			b.ReportAllocs()
			for b.Loop() {
				_ = ic(ctx, echoMethod, req, reply, nil, okInvoker)
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
				for pb.Next() {
					_ = ic(ctx, echoMethod, req, reply, nil, okInvoker)
				}
			})
		})
	}
}

// BenchmarkUnaryBufconn compares a bare unary call over bufconn with the
// same call through the client's interceptor, retry configured, success
// path; every call carries a deadline, as real calls do.
func BenchmarkUnaryBufconn(b *testing.B) {
	run := func(b *testing.B, opts ...grpc.DialOption) {
		cc := testserver.Start(b, &testserver.Server{}, opts...)
		stub := echov1.NewEchoServiceClient(cc)
		req := &echov1.EchoRequest{Message: "bench"}
		unaryOnce(b, stub, req)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			unaryOnce(b, stub, req)
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, grpc.WithDisableRetry()) })
	b.Run("resilience", func(b *testing.B) { run(b, newConfiguredClient(b).DialOptions()...) })
}

// unavailableInvoker fails every attempt with UNAVAILABLE, a breaker
// failure.
func unavailableInvoker(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
	return errUnavailable
}

var errUnavailable = status.Error(codes.Unavailable, "down")

// openBreakerInterceptor returns the unary interceptor of a client whose
// Echo breaker has tripped (5 failures) and stays open for an hour; with
// retry, Echo has a retry policy too.
func openBreakerInterceptor(tb testing.TB, retry bool) grpc.UnaryClientInterceptor {
	mc := serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: echoService}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5, OpenDuration: time.Hour},
	}
	if retry {
		mc.RetryPolicy = fastPolicy(2)
	}
	c := newTestClient(tb, WithMethodConfig(mc), WithRetryBudget(nil))
	ic := c.UnaryClientInterceptor()
	for range 5 {
		_ = ic(context.Background(), echoMethod, &echov1.EchoRequest{}, &echov1.EchoResponse{}, nil, unavailableInvoker)
	}
	if st := c.Status(echoMethod); st.Breaker.State != BreakerOpen {
		tb.Fatalf("breaker %v after 5 failures, want open", st.Breaker.State)
	}
	return ic
}

// TestRejectionAllocatesNothing pins the cost of a call the open breaker
// rejects, as the caller sees it: the interceptor and status.Code of its
// error allocate nothing. A rejection used to cost 5 allocations.
func TestRejectionAllocatesNothing(t *testing.T) {
	for _, retry := range []bool{false, true} {
		ic := openBreakerInterceptor(t, retry)
		ctx := context.Background()
		req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
		allocs := testing.AllocsPerRun(1000, func() {
			err := ic(ctx, echoMethod, req, reply, nil, okInvoker)
			if !errors.Is(err, ErrCircuitOpen) || status.Code(err) != codes.Unavailable {
				t.Fatalf("rejected call = %v, want ErrCircuitOpen, UNAVAILABLE", err)
			}
		})
		if allocs != 0 {
			t.Errorf("rejected call (retry policy %v): %v allocs, want 0", retry, allocs)
		}
	}
}

// BenchmarkRejection measures a call the open breaker rejects, with the
// caller's status.Code of its error, serially and with every core spinning
// on rejections.
func BenchmarkRejection(b *testing.B) {
	for _, retry := range []bool{false, true} {
		name := "no-retry"
		if retry {
			name = "retry"
		}
		ic := openBreakerInterceptor(b, retry)
		ctx := context.Background()
		b.Run(name, func(b *testing.B) {
			req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
			b.ReportAllocs()
			for b.Loop() {
				_ = status.Code(ic(ctx, echoMethod, req, reply, nil, okInvoker))
			}
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
				for pb.Next() {
					_ = status.Code(ic(ctx, echoMethod, req, reply, nil, okInvoker))
				}
			})
		})
	}
}

// fullBulkheadInterceptor returns the unary interceptor of a client whose
// Echo bulkhead (one slot, no queue) is held by a call blocked in its
// invoker until the test ends.
func fullBulkheadInterceptor(tb testing.TB) grpc.UnaryClientInterceptor {
	c := newTestClient(tb, WithMethodConfig(serviceconfig.MethodConfig{
		Name:     []serviceconfig.Name{{Service: echoService}},
		Bulkhead: &serviceconfig.Bulkhead{MaxConcurrent: 1},
	}), WithRetryBudget(nil))
	ic := c.UnaryClientInterceptor()
	entered, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		_ = ic(context.Background(), echoMethod, &echov1.EchoRequest{}, &echov1.EchoResponse{}, nil,
			func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
				close(entered)
				<-release
				return nil
			})
	}()
	<-entered
	tb.Cleanup(func() {
		close(release)
		<-done
	})
	return ic
}

// TestBulkheadRejectionAllocatesNothing pins the cost of a call the full
// bulkhead rejects, as the caller sees it: the interceptor and status.Code
// of its error allocate nothing.
func TestBulkheadRejectionAllocatesNothing(t *testing.T) {
	ic := fullBulkheadInterceptor(t)
	ctx := context.Background()
	req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
	allocs := testing.AllocsPerRun(1000, func() {
		err := ic(ctx, echoMethod, req, reply, nil, okInvoker)
		if !errors.Is(err, ErrBulkheadFull) || status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("rejected call = %v, want ErrBulkheadFull, RESOURCE_EXHAUSTED", err)
		}
	})
	if allocs != 0 {
		t.Errorf("call rejected by the full bulkhead: %v allocs, want 0", allocs)
	}
}

// BenchmarkBulkheadRejection measures a call the full bulkhead rejects,
// with the caller's status.Code of its error.
func BenchmarkBulkheadRejection(b *testing.B) {
	ic := fullBulkheadInterceptor(b)
	ctx := context.Background()
	req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
	b.ReportAllocs()
	for b.Loop() {
		_ = status.Code(ic(ctx, echoMethod, req, reply, nil, okInvoker))
	}
}
