package interceptor

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
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// attemptSpans is a stats.Handler in the style of otelgrpc's client
// handler: a span per attempt, a child of the span in the attempt's
// context, ended with the attempt's status.
type attemptSpans struct{ tracer trace.Tracer }

type attemptSpanKey struct{}

func (h attemptSpans) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	ctx, span := h.tracer.Start(ctx, info.FullMethodName, trace.WithSpanKind(trace.SpanKindClient))
	return context.WithValue(ctx, attemptSpanKey{}, span)
}

func (h attemptSpans) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if end, ok := s.(*stats.End); ok {
		span := ctx.Value(attemptSpanKey{}).(trace.Span)
		if end.Error != nil {
			span.SetStatus(codes.Error, end.Error.Error())
		}
		span.End()
	}
}

func (attemptSpans) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (attemptSpans) HandleConn(context.Context, stats.ConnStats)                       {}

// eventAttrs returns an event's attributes by key.
func eventAttrs(e sdktrace.Event) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range e.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestTraceEventsOnTheCallersSpan retries, hedges and rejects calls under a
// span the test starts around each call, with an otelgrpc-style stats
// handler below that starts a span per attempt: the events land on the
// caller's span, and the attempts' spans are its children.
func TestTraceEventsOnTheCallersSpan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		tracer := tp.Tracer("test")
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			switch {
			case a.Method == echoMethod && a.N == 1:
				return testserver.Outcome{Err: status.Error(grpccodes.Unavailable, "down")}
			case a.Method == lookupMethod && a.N == 1:
				return testserver.Outcome{Delay: time.Hour}
			}
			return testserver.Outcome{}
		})
		c := newTestClient(t, WithRandSource(zeroSource{}), WithMethodConfig(serviceconfig.MethodConfig{
			Name:           []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
			RetryPolicy:    fastPolicy(3),
			CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 10},
		}, serviceconfig.MethodConfig{
			Name:          []serviceconfig.Name{{Service: echoService, Method: "Lookup"}},
			HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 100 * time.Millisecond},
		}))
		cc := testserver.Start(t, srv, append(c.DialOptions(), grpc.WithStatsHandler(attemptSpans{tracer}))...)
		stub := echov1.NewEchoServiceClient(cc)

		run := func(name string, call func(ctx context.Context) error) (sdktrace.ReadOnlySpan, error) {
			ctx, span := tracer.Start(t.Context(), name)
			err := call(ctx)
			span.End()
			// A losing hedge's attempt span may end at any moment (its
			// cancellation races the answer): find the caller's by name.
			ended := rec.Ended()
			for i := len(ended) - 1; i >= 0; i-- {
				if ended[i].Name() == name {
					return ended[i], err
				}
			}
			t.Fatalf("no ended span %q", name)
			return nil, err
		}
		retried, err := run("retried", func(ctx context.Context) error {
			_, err := stub.Echo(ctx, &echov1.EchoRequest{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		hedged, err := run("hedged", func(ctx context.Context) error {
			_, err := stub.Lookup(ctx, &echov1.LookupRequest{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.ForceOpen(echoMethod); err != nil {
			t.Fatal(err)
		}
		rejected, err := run("rejected", func(ctx context.Context) error {
			_, err := stub.Echo(ctx, &echov1.EchoRequest{})
			return err
		})
		if !errors.Is(err, ErrCircuitOpen) {
			t.Fatalf("rejected call: %v, want ErrCircuitOpen", err)
		}
		synctest.Wait()

		type want struct {
			name  string
			attrs map[attribute.Key]attribute.Value
		}
		tests := []struct {
			span sdktrace.ReadOnlySpan
			want []want
		}{
			{retried, []want{{eventRetry, map[attribute.Key]attribute.Value{
				attrAttempt: attribute.IntValue(1), attrCode: attribute.IntValue(int(grpccodes.Unavailable)),
				attrDelay: attribute.Float64Value(0.008), attrPushback: attribute.BoolValue(false),
			}}}},
			{hedged, []want{{eventHedge, map[attribute.Key]attribute.Value{
				attrAttempt: attribute.IntValue(2), attrDelay: attribute.Float64Value(0.1),
			}}}},
			{rejected, []want{
				{eventRejected, map[attribute.Key]attribute.Value{
					attrAttempt: attribute.IntValue(1), attrReason: attribute.StringValue("circuit_open"),
				}},
				{eventStop, map[attribute.Key]attribute.Value{
					attrAttempt: attribute.IntValue(0), attrCode: attribute.IntValue(int(grpccodes.Unavailable)),
					attrReason: attribute.StringValue("circuit_open"),
				}},
			}},
		}
		for _, tt := range tests {
			events := tt.span.Events()
			if len(events) != len(tt.want) {
				t.Errorf("span %s: %d events %v, want %d", tt.span.Name(), len(events), events, len(tt.want))
				continue
			}
			for i, w := range tt.want {
				if events[i].Name != w.name {
					t.Errorf("span %s event %d: %q, want %q", tt.span.Name(), i, events[i].Name, w.name)
				}
				got := eventAttrs(events[i])
				for k, v := range w.attrs {
					if got[k] != v {
						t.Errorf("span %s event %s: %s = %v, want %v", tt.span.Name(), w.name, k, got[k].String(), v.String())
					}
				}
			}
		}
		// The attempts' spans (two per retried or hedged call, none for
		// the rejected one) are children of the callers' spans.
		children := map[string]int{}
		for _, s := range rec.Ended() {
			if s.Parent().IsValid() {
				for _, p := range []sdktrace.ReadOnlySpan{retried, hedged, rejected} {
					if s.Parent().SpanID() == p.SpanContext().SpanID() {
						children[p.Name()]++
					}
				}
			}
		}
		if children["retried"] != 2 || children["hedged"] != 2 || children["rejected"] != 0 {
			t.Errorf("attempt spans under the callers' spans = %v, want retried:2 hedged:2 rejected:0", children)
		}
	})
}

// TestObservabilityOffAllocatesNothing pins "no cost when off": with no
// meter provider, with the no-op one, and with a span that does not record,
// a call allocates exactly what it allocates with observability absent, on
// the success path (nothing at all) and on a path with a retry.
func TestObservabilityOffAllocatesNothing(t *testing.T) {
	sdk := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	configs := []struct {
		name string
		opts []ClientOption
		ctx  func() context.Context
	}{
		{"none", nil, context.Background},
		{"noop provider", []ClientOption{WithMeterProvider(metricnoop.NewMeterProvider())}, context.Background},
		{"sdk provider", []ClientOption{WithMeterProvider(sdk)}, context.Background},
		{"span not recording", nil, func() context.Context {
			_, span := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())).Tracer("t").
				Start(context.Background(), "x")
			return trace.ContextWithSpan(context.Background(), span)
		}},
	}
	unavailable := status.Error(grpccodes.Unavailable, "down")
	var baseline [2]float64
	for i, tc := range configs {
		synctest.Test(t, func(t *testing.T) {
			ic := newConfiguredClient(t, append([]ClientOption{WithRandSource(zeroSource{}), WithRetryBudget(nil)}, tc.opts...)...).
				UnaryClientInterceptor()
			ctx := tc.ctx()
			req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
			n := 0
			failOnce := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
				n++
				if n%2 == 1 {
					return unavailable
				}
				return nil
			}
			_ = ic(ctx, echoMethod, req, reply, nil, okInvoker)
			_ = ic(ctx, echoMethod, req, reply, nil, failOnce)
			got := [2]float64{
				testing.AllocsPerRun(200, func() { _ = ic(ctx, echoMethod, req, reply, nil, okInvoker) }),
				testing.AllocsPerRun(200, func() { _ = ic(ctx, echoMethod, req, reply, nil, failOnce) }),
			}
			t.Logf("%s: success path %v allocs, one retry %v allocs", tc.name, got[0], got[1])
			if i == 0 {
				baseline = got
			}
			if got[0] != 0 {
				t.Errorf("%s: success path %v allocs, want 0", tc.name, got[0])
			}
			if got[1] != baseline[1] {
				t.Errorf("%s: call with one retry %v allocs, want %v as without observability", tc.name, got[1], baseline[1])
			}
		})
	}
}

// TestMetricsAlternatingConnectionsAllocateNothing: a method called on
// connections in turn (a pool) finds its A96 attribute sets by target
// without allocating.
func TestMetricsAlternatingConnectionsAllocateNothing(t *testing.T) {
	sdk := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	ic := newConfiguredClient(t, WithMeterProvider(sdk)).UnaryClientInterceptor()
	var conns []*grpc.ClientConn
	for _, target := range []string{"passthrough:///a", "passthrough:///b", "passthrough:///c"} {
		cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		conns = append(conns, cc)
	}
	ctx := context.Background()
	req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
	for _, cc := range conns {
		_ = ic(ctx, echoMethod, req, reply, cc, okInvoker)
	}
	i := 0
	if a := testing.AllocsPerRun(300, func() {
		_ = ic(ctx, echoMethod, req, reply, conns[i%len(conns)], okInvoker)
		i++
	}); a != 0 {
		t.Errorf("calls alternating between connections: %v allocs, want 0", a)
	}
}
