package interceptor

import (
	"context"
	"testing"

	"google.golang.org/grpc"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// okInvoker is a grpc.UnaryInvoker that succeeds at once, so a measurement
// sees the interceptor alone.
func okInvoker(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
	return nil
}

func newBenchClient(tb testing.TB) *Client {
	tb.Helper()
	c, err := NewClient(WithRetryPolicy(fastPolicy(4)))
	if err != nil {
		tb.Fatalf("NewClient: %v", err)
	}
	return c
}

func TestUnarySuccessPathAllocatesNothing(t *testing.T) {
	c := newBenchClient(t)
	ic := c.UnaryClientInterceptor()
	ctx := context.Background()
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
}

// BenchmarkInterceptorOnly measures the interceptor around an invoker that
// does nothing.
func BenchmarkInterceptorOnly(b *testing.B) {
	c := newBenchClient(b)
	ic := c.UnaryClientInterceptor()
	ctx := context.Background()
	req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
	b.ReportAllocs()
	for b.Loop() {
		_ = ic(ctx, echoMethod, req, reply, nil, okInvoker)
	}
}

func BenchmarkInterceptorOnlyParallel(b *testing.B) {
	c := newBenchClient(b)
	ic := c.UnaryClientInterceptor()
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
		for pb.Next() {
			_ = ic(ctx, echoMethod, req, reply, nil, okInvoker)
		}
	})
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
	b.Run("resilience", func(b *testing.B) { run(b, newBenchClient(b).DialOptions()...) })
}
