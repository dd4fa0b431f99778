package server

import (
	"context"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/internal/limit"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// BenchmarkServerLimit measures what the concurrency limit and the CPU
// shedder add to a call: compare with "bare interceptor" (a Server with no
// option, which only reads the caller-retries mark) and "handler only".
func BenchmarkServerLimit(b *testing.B) {
	info := &grpc.UnaryServerInfo{FullMethod: idemEchoMethod}
	req := &echov1.EchoRequest{Message: "m"}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-other", "v"))
	crit := metadata.NewIncomingContext(context.Background(), metadata.Pairs(wire.CriticalityKey, "SHEDDABLE"))
	b.Run("handler only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = benchHandlerVar(ctx, req)
		}
	})
	run := func(name string, ctx context.Context, opts ...Option) {
		s, err := New(opts...)
		if err != nil {
			b.Fatal(err)
		}
		if strings.HasPrefix(name, "shed") {
			s.limits.server.Acquire(time.Now(), limit.Request{Crit: limit.CriticalPlus, Left: limit.NoDeadline}) // holds the only slot
		}
		icpt := s.UnaryServerInterceptor()
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					_, _ = icpt(ctx, req, info, benchHandler)
				}
			})
		})
	}
	run("bare interceptor", ctx)
	wide := WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{MaxLimit: 1000, InitialLimit: 1000}))
	one := WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{MinLimit: 1, MaxLimit: 1, InitialLimit: 1}))
	run("concurrency limit", ctx, wide)
	run("concurrency limit, criticality", crit, wide)
	run("cpu shedding", ctx, WithLimits(Limits{CPU: &CPUShedding{CPU: func() float64 { return 0.5 }}}))
	run("shed", ctx, one)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	run("concurrency limit, SDK metrics", ctx, wide, WithMeterProvider(mp))
	run("shed, SDK metrics", ctx, one, WithMeterProvider(mp))
}
