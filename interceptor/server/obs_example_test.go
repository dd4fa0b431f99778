package server_test

import (
	"context"
	"fmt"
	"log"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// attributeEncoder writes attribute sets as k=v,k=v.
var attributeEncoder = attribute.DefaultEncoder()

// printSums prints the sum and histogram points of the instruments named,
// in the order given.
func printSums(rm *metricdata.ResourceMetrics, names ...string) {
	for _, name := range names {
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != name {
					continue
				}
				switch d := m.Data.(type) {
				case metricdata.Sum[int64]:
					for _, p := range d.DataPoints {
						fmt.Printf("%s %s = %d\n", m.Name, p.Attributes.Encoded(attributeEncoder), p.Value)
					}
				case metricdata.Histogram[int64]:
					for _, p := range d.DataPoints {
						fmt.Printf("%s %s: %d call(s), sum %d\n", m.Name, p.Attributes.Encoded(attributeEncoder), p.Count, p.Sum)
					}
				}
			}
		}
	}
}

// WithMeterProvider with the SDK: a first execution and its replay. A real
// program would give a provider with an exporter (Prometheus, OTLP); the
// package documentation lists every instrument.
func ExampleWithMeterProvider() {
	reader := sdkmetric.NewManualReader()
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		log.Fatal(err)
	}
	srv, err := server.New(
		server.WithIdempotency(server.Idempotency{Store: store, Scope: server.SharedScope}),
		server.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
	)
	if err != nil {
		log.Fatal(err)
	}
	unary := srv.UnaryServerInterceptor()
	handler := func(context.Context, any) (any, error) { return &echov1.EchoResponse{Message: "done"}, nil }
	info := &grpc.UnaryServerInfo{FullMethod: "/resilience.echo.v1.EchoService/Echo"}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(wire.IdempotencyKeyHeader, "k-1"))
	for range 2 {
		if _, err := unary(ctx, &echov1.EchoRequest{Message: "x"}, info, handler); err != nil {
			log.Fatal(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	printSums(&rm, "resilience.server.idempotency.executions", "resilience.server.idempotency.replays")
	// Output:
	// resilience.server.idempotency.executions grpc.method=resilience.echo.v1.EchoService/Echo = 1
	// resilience.server.idempotency.replays grpc.method=resilience.echo.v1.EchoService/Echo,resilience.idempotency.source=store = 1
}
