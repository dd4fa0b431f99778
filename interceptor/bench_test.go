package interceptor

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"

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
	{"retry+budget+breaker+bulkhead", []ClientOption{WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: echoService}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{},
		Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 1 << 20},
	})}},
}

func newConfiguredClient(tb testing.TB, opts ...ClientOption) *Client {
	tb.Helper()
	return newTestClient(tb, append([]ClientOption{WithRetryPolicy(fastPolicy(4))}, opts...)...)
}

func TestUnarySuccessPathAllocatesNothing(t *testing.T) {
	for _, bc := range benchConfigs {
		t.Run(bc.name, func(t *testing.T) {
			ic := newConfiguredClient(t, bc.opts...).UnaryClientInterceptor()
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
			_ = ic(ctx, echoMethod, req, reply, nil, okInvoker) // resolve the method's policy once
			allocs := testing.AllocsPerRun(1000, func() {
				if err := ic(ctx, echoMethod, req, reply, nil, okInvoker); err != nil {
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
// path.
func BenchmarkUnaryBufconn(b *testing.B) {
	run := func(b *testing.B, opts ...grpc.DialOption) {
		cc := testserver.Start(b, &testserver.Server{}, opts...)
		stub := echov1.NewEchoServiceClient(cc)
		ctx := context.Background()
		req := &echov1.EchoRequest{Message: "bench"}
		if _, err := stub.Echo(ctx, req); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if _, err := stub.Echo(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, grpc.WithDisableRetry()) })
	b.Run("resilience", func(b *testing.B) { run(b, newConfiguredClient(b).DialOptions()...) })
}
