package interceptor

import (
	"context"
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

func adaptiveClient(t *testing.T) *Client {
	t.Helper()
	return newConfiguredClient(t, WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: echoService}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{Mode: serviceconfig.ModeAdaptive},
	}))
}

// TestAdaptiveSuccessPathAllocatesNothing: adaptive throttling adds no
// allocation to a successful call.
func TestAdaptiveSuccessPathAllocatesNothing(t *testing.T) {
	ic := adaptiveClient(t).UnaryClientInterceptor()
	ctx := context.Background()
	req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
	_ = ic(ctx, echoMethod, req, reply, nil, okInvoker)
	if n := testing.AllocsPerRun(1000, func() { _ = ic(ctx, echoMethod, req, reply, nil, okInvoker) }); n != 0 {
		t.Errorf("allocs per call = %v, want 0", n)
	}
}

// TestAdaptiveCountsOnlyBackendRefusals pins what counts as accepted:
// everything but the backend's RESOURCE_EXHAUSTED and UNAVAILABLE; and a
// local rejection is ErrCircuitOpen, not retried.
func TestAdaptiveCountsOnlyBackendRefusals(t *testing.T) {
	c := adaptiveClient(t)
	ic := c.UnaryClientInterceptor()
	ctx := context.Background()
	req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
	fail := func(code codes.Code) grpc.UnaryInvoker {
		return func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			return status.Error(code, "x")
		}
	}
	for _, code := range []codes.Code{codes.NotFound, codes.Internal, codes.InvalidArgument} {
		_ = ic(ctx, echoMethod, req, reply, nil, fail(code))
	}
	st := c.Status(echoMethod).Adaptive
	if st == nil || st.Requests != 3 || st.Accepts != 3 || st.RejectProbability != 0 {
		t.Fatalf("after three non-refusals: %+v, want 3 requests, 3 accepts, p 0", st)
	}
	// Refusals: RESOURCE_EXHAUSTED and UNAVAILABLE (retried up to 4
	// attempts each, fastPolicy) until the throttle rejects locally.
	var rejected error
	for range 50 {
		err := ic(ctx, echoMethod, req, reply, nil, fail(codes.ResourceExhausted))
		if errors.Is(err, ErrCircuitOpen) {
			rejected = err
			break
		}
		_ = ic(ctx, echoMethod, req, reply, nil, fail(codes.Unavailable))
	}
	if rejected == nil {
		t.Fatalf("no local rejection after 50 refused calls: %+v", c.Status(echoMethod).Adaptive)
	}
	if status.Code(rejected) != codes.Unavailable {
		t.Errorf("local rejection: %v, want UNAVAILABLE", rejected)
	}
	st = c.Status(echoMethod).Adaptive
	if st.Accepts != 3 || st.RejectProbability <= 0 {
		t.Errorf("after refusals: %+v, want 3 accepts and p > 0", st)
	}
}

// TestAdaptiveRejectionMetrics: a local rejection of adaptive throttling
// is a RejectedError (ErrCircuitOpen) that stops the call as
// StopAdaptiveThrottle, counts in
// resilience.client.rejections with reason adaptive_throttle, and the
// method's rejection
// probability is a gauge equal to MethodStatus's.
func TestAdaptiveRejectionMetrics(t *testing.T) {
	reader, mp := newMeterReader()
	var stops []StopReason
	c := newConfiguredClient(t, WithMeterProvider(mp), WithOnStop(func(_ context.Context, e StopEvent) {
		stops = append(stops, e.Reason)
	}), WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: echoService}},
		RetryPolicy:    fastPolicy(2), // no retryable codes: one attempt per call, no backoff
		CircuitBreaker: &serviceconfig.CircuitBreaker{Mode: serviceconfig.ModeAdaptive},
	}))
	ic := c.UnaryClientInterceptor()
	ctx := context.Background()
	req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
	refuse := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
		return status.Error(codes.ResourceExhausted, "x")
	}
	var rejected error
	for range 50 { // as a generated stub calls, so that grpc.method names Echo
		if err := ic(ctx, echoMethod, req, reply, nil, refuse, grpc.StaticMethod()); errors.Is(err, ErrCircuitOpen) {
			rejected = err
			break
		}
	}
	if rejected == nil {
		t.Fatalf("no local rejection after 50 refused calls: %+v", c.Status(echoMethod).Adaptive)
	}
	if _, ok := errors.AsType[*RejectedError](rejected); !ok {
		t.Errorf("rejection %v: want a *RejectedError", rejected)
	}
	if len(stops) == 0 || stops[len(stops)-1] != StopAdaptiveThrottle {
		t.Errorf("stop reasons %v, want the last %v", stops, StopAdaptiveThrottle)
	}
	p := c.Status(echoMethod).Adaptive.RejectProbability
	echo := echoMethodAttr
	got := collect(t, reader)
	got.Expect(t, metricRejections, "{attempt}", map[string]float64{echo + ",resilience.reason=adaptive_throttle": 1})
	// The probability decays with time between answers (package
	// internal/adaptive): the gauge, read a moment after Status, is within
	// a hair of it.
	if _, pts := got.Points(t, metricRejectProbability); len(pts) != 1 || math.Abs(pts[echo]-p) > 1e-6 {
		t.Errorf("%s = %v, want {%s: %v}", metricRejectProbability, pts, echo, p)
	}
	if p <= 0 {
		t.Errorf("reject probability %v, want > 0", p)
	}
}

// TestAdaptiveCountsNothingForCancelledStreams: a stream the caller cancels
// with no call at work on it is no answer of the backend's, as a cancelled
// unary call is not: it counts nothing and moves nothing. Before a fix its
// attempt was never released, so every such stream counted as refused and
// the second was already at a reject probability of 1/2; it then counted
// as accepted, which now lowers the probability: neither is what the
// backend said.
func TestAdaptiveCountsNothingForCancelledStreams(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: time.Hour} })
		stub, c := newEcho(t, srv, WithMethodConfig(serviceconfig.MethodConfig{
			Name:           []serviceconfig.Name{{Service: echoService}},
			CircuitBreaker: &serviceconfig.CircuitBreaker{Mode: serviceconfig.ModeAdaptive},
		}))
		const method = "/resilience.echo.v1.EchoService/ServerStream"
		for i := range 10 {
			ctx, cancel := context.WithCancel(t.Context())
			if _, err := stub.ServerStream(ctx, &echov1.ServerStreamRequest{Count: 1}); err != nil {
				t.Fatalf("stream %d: ServerStream() error = %v", i, err)
			}
			cancel()
			synctest.Wait()
			if st := c.Status(method).Adaptive; st.Requests != 0 || st.RejectProbability != 0 {
				t.Fatalf("after %d cancelled streams: %+v, want nothing counted", i+1, st)
			}
		}
	})
}
