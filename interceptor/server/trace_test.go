package server

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/internal/telemetry"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestTraceReplayEventOnTheServersSpan checks the server's replay event:
// a duplicate's span gets it, with the source and the replayed code.
func TestTraceReplayEventOnTheServersSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
	_, unary := newMemoryIdempotency(t)
	info := &grpc.UnaryServerInfo{FullMethod: idemEchoMethod}
	h := func(context.Context, any) (any, error) { return &echov1.EchoResponse{Message: "m"}, nil }
	req := &echov1.EchoRequest{Message: "m"}
	for _, name := range []string{"first", "duplicate"} {
		ctx, span := tracer.Start(metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", "k")), name)
		if _, err := unary(ctx, req, info, h); err != nil {
			t.Fatal(err)
		}
		span.End()
	}
	ended := rec.Ended()
	if n := len(ended[0].Events()); n != 0 {
		t.Errorf("first call: %d events, want none", n)
	}
	ev := ended[1].Events()
	if len(ev) != 1 || ev[0].Name != telemetry.EventReplay {
		t.Fatalf("duplicate: events %v, want one %s", ev, telemetry.EventReplay)
	}
	got := eventAttrs(ev[0])
	if got[attrIdemSource] != attribute.StringValue("store") || got[telemetry.AttrCode] != attribute.IntValue(0) {
		t.Errorf("replay event attributes = %v, want source store, code 0", ev[0].Attributes)
	}
}

// TestServerMetricsOffAllocatesNothing pins the server's side of "no cost
// when off": a replay allocates as much with the no-op provider, and with
// the SDK's, as with none.
func TestServerMetricsOffAllocatesNothing(t *testing.T) {
	providers := []struct {
		name string
		opts []Option
	}{
		{"none", nil},
		{"noop provider", []Option{WithMeterProvider(metricnoop.NewMeterProvider())}},
		{"sdk provider", []Option{WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())))}},
	}
	var baseline float64
	for i, p := range providers {
		store, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(append([]Option{WithIdempotency(Idempotency{Store: store, Scope: SharedScope})}, p.opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		unary := s.UnaryServerInterceptor()
		info := &grpc.UnaryServerInfo{FullMethod: idemEchoMethod}
		req := &echov1.EchoRequest{Message: "m"}
		h := func(context.Context, any) (any, error) { return &echov1.EchoResponse{Message: "m"}, nil }
		keyed := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", "k"))
		if _, err := unary(keyed, req, info, h); err != nil {
			t.Fatal(err)
		}
		a := testing.AllocsPerRun(200, func() { _, _ = unary(keyed, req, info, h) })
		t.Logf("%s: replay %v allocs", p.name, a)
		if i == 0 {
			baseline = a
		}
		if a != baseline {
			t.Errorf("%s: replay %v allocs, want %v as without metrics", p.name, a, baseline)
		}
	}
}

// eventAttrs returns an event's attributes by key.
func eventAttrs(e sdktrace.Event) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range e.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}
