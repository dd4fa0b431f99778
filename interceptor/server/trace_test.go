//go:build splittodo

package server

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// attemptSpans is a stats.Handler in the style of otelgrpc's client
// handler: a span per attempt, a child of the span in the attempt's
// context, ended with the attempt's status.
type attemptSpans struct{ tracer trace.Tracer }

type attemptSpanKey struct{}

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
	if len(ev) != 1 || ev[0].Name != eventReplay {
		t.Fatalf("duplicate: events %v, want one %s", ev, eventReplay)
	}
	got := eventAttrs(ev[0])
	if got[attrIdemSource] != attribute.StringValue("store") || got[attrCode] != attribute.IntValue(0) {
		t.Errorf("replay event attributes = %v, want source store, code 0", ev[0].Attributes)
	}
}

// TestServerMetricsOffAllocatesNothing pins the server's side of "no cost
// when off": a replay allocates as much with the no-op provider, and with
// the SDK's, as with none.
func TestServerMetricsOffAllocatesNothing(t *testing.T) {
	providers := []struct {
		name string
		opts []ServerOption
	}{
		{"none", nil},
		{"noop provider", []ServerOption{WithServerMeterProvider(metricnoop.NewMeterProvider())}},
		{"sdk provider", []ServerOption{WithServerMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())))}},
	}
	var baseline float64
	for i, p := range providers {
		store, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewServer(append([]ServerOption{WithIdempotencyStore(store), WithIdempotencySharedScope()}, p.opts...)...)
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
