package interceptor_test

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

	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
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

// WithMeterProvider with the SDK: a call that needed two retries records
// gRFC A96's grpc.client.call.retries and this library's own series. A
// real program would give a provider with an exporter (Prometheus, OTLP).
func ExampleWithMeterProvider() {
	dial, stop := serve(&flakyEcho{})
	defer stop()

	reader := sdkmetric.NewManualReader()
	c, err := interceptor.NewClient(
		interceptor.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
		interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{MaxAttempts: 4, InitialBackoff: time.Millisecond}),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close() // after conn.Close: unregisters its gauges from the provider
	conn := connect(c, dial)
	defer conn.Close()
	if _, err := echov1.NewEchoServiceClient(conn).Echo(context.Background(), &echov1.EchoRequest{Message: "hi"}); err != nil {
		log.Fatal(err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	printSums(&rm, "grpc.client.call.retries", "resilience.client.retries")
	// Output:
	// grpc.client.call.retries grpc.method=resilience.echo.v1.EchoService/Echo,grpc.target=passthrough:///echo: 1 call(s), sum 2
	// resilience.client.retries grpc.method=resilience.echo.v1.EchoService/Echo = 2
}

// Retries appear as events on the span the caller started around the call
// (here with the SDK's recorder; otelgrpc's or grpc's own tracing adds a
// span per attempt below it).
func Example_tracing() {
	dial, stop := serve(&flakyEcho{})
	defer stop()
	c, err := interceptor.NewClient(interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{
		MaxAttempts: 4, InitialBackoff: time.Millisecond,
	}))
	if err != nil {
		log.Fatal(err)
	}
	conn := connect(c, dial)
	defer conn.Close()

	rec := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("example")
	ctx, span := tracer.Start(context.Background(), "checkout")
	_, err = echov1.NewEchoServiceClient(conn).Echo(ctx, &echov1.EchoRequest{Message: "hi"})
	span.End()
	fmt.Println("call:", err)
	for _, e := range rec.Ended()[0].Events() {
		for _, kv := range e.Attributes {
			if kv.Key == "resilience.attempt" {
				fmt.Println(e.Name, "after attempt", kv.Value.AsInt64())
			}
		}
	}
	// Output:
	// call: <nil>
	// resilience.retry after attempt 1
	// resilience.retry after attempt 2
}
