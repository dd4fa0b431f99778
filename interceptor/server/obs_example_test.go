//go:build splittodo

package server_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// attributeEncoder writes attribute sets as k=v,k=v.
var attributeEncoder = attribute.DefaultEncoder()

// printSums prints the sum and histogram points of the instruments named,
// in the order given.
// WithServerMeterProvider: a first execution and its replay.
func ExampleWithServerMeterProvider() {
	reader := sdkmetric.NewManualReader()
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		log.Fatal(err)
	}
	srv, err := interceptor.NewServer(
		interceptor.WithIdempotencyStore(store),
		interceptor.WithIdempotencySharedScope(),
		interceptor.WithServerMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
	)
	if err != nil {
		log.Fatal(err)
	}
	unary := srv.UnaryServerInterceptor()
	handler := func(context.Context, any) (any, error) { return &echov1.EchoResponse{Message: "done"}, nil }
	info := &grpc.UnaryServerInfo{FullMethod: "/resilience.echo.v1.EchoService/Echo"}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", "k-1"))
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
