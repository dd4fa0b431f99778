package interceptor

import (
	"context"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// echoMethodAttr is the grpc.method attribute of echoMethod.
const echoMethodAttr = "grpc.method=resilience.echo.v1.EchoService/Echo"

// zeroSource makes every jitter draw 0.
type zeroSource struct{}

func (zeroSource) Uint64() uint64 { return 0 }

// TestMetricsAfterAScriptedSequence runs retried, plain, deadline-skipped,
// hedged and rejected calls over real gRPC and reads every instrument
// through the SDK's ManualReader: names, units, attributes and values.
func TestMetricsAfterAScriptedSequence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, mp := newMeterReader()
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			switch {
			case a.Method == echoMethod && (a.N <= 2 || a.N == 5): // call 1 twice, call 3 once
				return testserver.Outcome{Err: status.Error(codes.Unavailable, "down")}
			case a.Method == lookupMethod && a.N == 1: // the first copy stalls
				return testserver.Outcome{Delay: time.Hour}
			}
			return testserver.Outcome{}
		})
		var mu sync.Mutex
		var delays time.Duration
		stub, c := newEcho(t, srv, WithMeterProvider(mp), WithRandSource(zeroSource{}),
			WithOnRetry(func(_ context.Context, e RetryEvent) {
				mu.Lock()
				defer mu.Unlock()
				if !e.Hedge {
					delays += e.Delay
				}
			}),
			WithMethodConfig(serviceconfig.MethodConfig{
				Name:           []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
				RetryPolicy:    fastPolicy(3),
				CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 10},
				Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 4},
			}, serviceconfig.MethodConfig{
				Name:          []serviceconfig.Name{{Service: echoService, Method: "Lookup"}},
				HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 100 * time.Millisecond},
			}))
		ctx := t.Context()
		if _, err := stub.Echo(ctx, &echov1.EchoRequest{}); err != nil { // 2 retries, then OK
			t.Fatalf("call 1: %v", err)
		}
		if _, err := stub.Echo(ctx, &echov1.EchoRequest{}); err != nil { // at once
			t.Fatalf("call 2: %v", err)
		}
		short, cancel := context.WithTimeout(ctx, 5*time.Millisecond) // a retry after 8ms does not fit
		_, err := stub.Echo(short, &echov1.EchoRequest{})
		cancel()
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("call 3: %v, want UNAVAILABLE", err)
		}
		if _, err := stub.Lookup(ctx, &echov1.LookupRequest{}); err != nil { // one hedge wins
			t.Fatalf("call 4: %v", err)
		}
		if err := c.ForceOpen(echoMethod); err != nil {
			t.Fatal(err)
		}
		if _, err := stub.Echo(ctx, &echov1.EchoRequest{}); status.Code(err) != codes.Unavailable {
			t.Fatalf("call 5: %v, want the open breaker's UNAVAILABLE", err)
		}
		synctest.Wait() // the losing copy of call 4 settles

		got := collect(t, reader)
		const (
			echo   = "grpc.method=resilience.echo.v1.EchoService/Echo"
			lookup = "grpc.method=resilience.echo.v1.EchoService/Lookup"
			target = "grpc.target=passthrough:///bufnet"
		)
		if delays != 24*time.Millisecond { // 10ms and 20ms, each × 0.8 (A6 jitter at 0)
			t.Fatalf("retry delays = %v, want 24ms", delays)
		}
		// gRFC A96: retries recorded only for the call that had some;
		// hedges for the hedged call; the delay for every call.
		got.Expect(t, metricCallRetries, "{retry}", map[string]float64{
			"count:" + echo + "," + target: 1, "sum:" + echo + "," + target: 2,
		})
		got.Expect(t, metricCallHedges, "{hedge}", map[string]float64{
			"count:" + lookup + "," + target: 1, "sum:" + lookup + "," + target: 1,
		})
		got.Expect(t, metricCallRetryDelay, "s", map[string]float64{
			"count:" + echo + "," + target: 4, "sum:" + echo + "," + target: delays.Seconds(),
			"count:" + lookup + "," + target: 1, "sum:" + lookup + "," + target: 0,
		})
		got.Expect(t, metricAttempts, "{attempt}", map[string]float64{
			echo + ",grpc.status=UNAVAILABLE": 3, echo + ",grpc.status=OK": 2,
			lookup + ",grpc.status=OK": 1, lookup + ",grpc.status=CANCELLED": 1,
		})
		got.Expect(t, metricRetries, "{retry}", map[string]float64{echo: 2, lookup: 1})
		got.Expect(t, metricStops, "{call}", map[string]float64{
			echo + ",resilience.stop_reason=deadline": 1, echo + ",resilience.stop_reason=circuit_open": 1,
		})
		got.Expect(t, metricDeadlineSkips, "{retry}", map[string]float64{echo: 1})
		got.Expect(t, metricRejections, "{attempt}", map[string]float64{echo + ",resilience.reason=circuit_open": 1})
		got.Expect(t, metricTransitions, "{transition}", map[string]float64{
			echo + ",resilience.breaker.from=closed,resilience.breaker.to=forced-open": 1,
		})
		got.Expect(t, metricBreakerState, "{state}", map[string]float64{echo: float64(BreakerForcedOpen)})
		got.Expect(t, metricInFlight, "{attempt}", map[string]float64{echo: 0})
		got.Expect(t, metricQueued, "{attempt}", map[string]float64{echo: 0})
		if _, ok := got[metricDenials]; ok {
			t.Errorf("%s recorded without a budget or throttle", metricDenials)
		}
	})
}

// TestMetricsCountThrottleDenials checks that a retry A6 throttling
// withholds is counted as a denial, and the call as stopped by it.
func TestMetricsCountThrottleDenials(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, mp := newMeterReader()
		srv := &testserver.Server{}
		srv.SetScript(failFirst(1, codes.Unavailable))
		cfg := &serviceconfig.Config{
			MethodConfig: []serviceconfig.MethodConfig{{
				Name: []serviceconfig.Name{{Service: echoService}}, RetryPolicy: fastPolicy(3),
			}},
			// Two tokens: the first failure leaves 1, not above half.
			RetryThrottling: &serviceconfig.RetryThrottling{MaxTokens: 2, TokenRatio: 0.1},
		}
		stub, _ := newEcho(t, srv, WithMeterProvider(mp), WithServiceConfig(cfg))
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); status.Code(err) != codes.Unavailable {
			t.Fatalf("Echo() = %v, want UNAVAILABLE, not retried", err)
		}
		got := collect(t, reader)
		echo := echoMethodAttr
		got.Expect(t, metricDenials, "{retry}", map[string]float64{echo + ",resilience.reason=throttled": 1})
		got.Expect(t, metricStops, "{call}", map[string]float64{echo + ",resilience.stop_reason=throttled": 1})
		if _, ok := got[metricCallRetries]; ok {
			t.Errorf("%s recorded for a call without retries (gRFC A96: 0 is not reported)", metricCallRetries)
		}
	})
}

// TestMetricsMethodIsOtherWithoutStaticMethod pins gRFC A66's rule for
// clients: a call without grpc.StaticMethod (not from a generated stub) is
// recorded with grpc.method "other".
func TestMetricsMethodIsOtherWithoutStaticMethod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, mp := newMeterReader()
		srv := &testserver.Server{}
		srv.SetScript(failFirst(1, codes.Unavailable))
		c := newTestClient(t, WithMeterProvider(mp), WithRandSource(zeroSource{}), WithRetryPolicy(fastPolicy(2)))
		cc := testserver.Start(t, srv, c.DialOptions()...)
		var reply echov1.EchoResponse
		if err := cc.Invoke(t.Context(), echoMethod, &echov1.EchoRequest{}, &reply); err != nil {
			t.Fatal(err)
		}
		got := collect(t, reader)
		got.Expect(t, metricCallRetries, "{retry}", map[string]float64{
			"count:grpc.method=other,grpc.target=passthrough:///bufnet": 1,
			"sum:grpc.method=other,grpc.target=passthrough:///bufnet":   1,
		})
	})
}

// TestMetricsStateChangesAndBudgetGauge checks the budget gauge of a fresh
// client and a transition forced by hand, of a method the config names
// exactly (so grpc.method names it before any call).
func TestMetricsStateChangesAndBudgetGauge(t *testing.T) {
	reader, mp := newMeterReader()
	c := newTestClient(t, WithMeterProvider(mp), WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{},
	}))
	if err := c.ForceOpen(echoMethod); err != nil {
		t.Fatal(err)
	}
	got := collect(t, reader)
	echo := echoMethodAttr
	got.Expect(t, metricTransitions, "{transition}", map[string]float64{
		echo + ",resilience.breaker.from=closed,resilience.breaker.to=forced-open": 1,
	})
	got.Expect(t, metricBudget, "{retry}", map[string]float64{"": 100}) // the default reserve
}

// TestMetricsRetriedStream checks gRFC A96's per-call metrics of a
// server-streaming call retried twice before its first message: recorded
// once, when the stream ends, with the retries and the delay between
// attempts.
func TestMetricsRetriedStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, mp := newMeterReader()
		srv := &testserver.Server{}
		srv.SetScript(failFirst(2, codes.Unavailable))
		stub, _ := newEcho(t, srv, WithMeterProvider(mp), WithRandSource(zeroSource{}), WithRetryPolicy(fastPolicy(4)))
		stream, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Message: "m", Count: 2})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := collect(t, reader)[metricCallRetries]; ok {
			t.Errorf("%s recorded before the stream ended", metricCallRetries)
		}
		for {
			if _, err := stream.Recv(); err != nil {
				if err != io.EOF {
					t.Fatalf("Recv() = %v, want io.EOF at the end", err)
				}
				break
			}
		}
		synctest.Wait()
		const attrs = "grpc.method=resilience.echo.v1.EchoService/ServerStream,grpc.target=passthrough:///bufnet"
		got := collect(t, reader)
		got.Expect(t, metricCallRetries, "{retry}", map[string]float64{"count:" + attrs: 1, "sum:" + attrs: 2})
		got.Expect(t, metricCallRetryDelay, "s", map[string]float64{"count:" + attrs: 1, "sum:" + attrs: 0.024})
	})
}

// TestMetricsHedgeRetryDelayIsTimeWithNoCopyRunning pins gRFC A96's
// retry_delay for a hedged call: the first copy fails non-fatally with a
// 50ms pushback, no copy runs until the second starts, which succeeds.
func TestMetricsHedgeRetryDelayIsTimeWithNoCopyRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, mp := newMeterReader()
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.N == 1 {
				return testserver.Outcome{Err: status.Error(codes.Unavailable, "busy"),
					Trailer: metadata.Pairs("grpc-retry-pushback-ms", "50")}
			}
			return testserver.Outcome{}
		})
		stub, _ := newEcho(t, srv, WithMeterProvider(mp), hedging(3, time.Hour, codes.Unavailable))
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatal(err)
		}
		const attrs = "grpc.method=resilience.echo.v1.EchoService/Echo,grpc.target=passthrough:///bufnet"
		got := collect(t, reader)
		got.Expect(t, metricCallHedges, "{hedge}", map[string]float64{"count:" + attrs: 1, "sum:" + attrs: 1})
		got.Expect(t, metricCallRetryDelay, "s", map[string]float64{"count:" + attrs: 1, "sum:" + attrs: 0.05})
		if _, ok := got[metricCallRetries]; ok {
			t.Errorf("%s recorded for a hedged call (A96 counts its copies as hedges)", metricCallRetries)
		}
	})
}

// TestMetricsBulkheadRejection counts a full bulkhead's rejection, and
// reads its occupancy while a call holds the only slot.
func TestMetricsBulkheadRejection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, mp := newMeterReader()
		srv := &testserver.Server{}
		srv.SetScript(stallFirst())
		stub, _ := newEcho(t, srv, WithMeterProvider(mp), WithMethodConfig(serviceconfig.MethodConfig{
			Name:     []serviceconfig.Name{{Service: echoService}},
			Bulkhead: &serviceconfig.Bulkhead{MaxConcurrent: 1},
		}))
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = stub.Echo(ctx, &echov1.EchoRequest{}) // holds the slot until cancelled
		}()
		synctest.Wait()
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("second call: %v, want RESOURCE_EXHAUSTED", err)
		}
		echo := echoMethodAttr
		got := collect(t, reader)
		got.Expect(t, metricRejections, "{attempt}", map[string]float64{echo + ",resilience.reason=bulkhead_full": 1})
		got.Expect(t, metricInFlight, "{attempt}", map[string]float64{echo: 1})
		got.Expect(t, metricQueued, "{attempt}", map[string]float64{echo: 0})
		cancel()
		<-done
	})
}

// TestMetricsTargetPerConnection calls one method on two connections: each
// call is recorded with its own connection's grpc.target.
func TestMetricsTargetPerConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, mp := newMeterReader()
		srv := &testserver.Server{}
		srv.SetScript(failFirst(2, codes.Unavailable))
		c := newTestClient(t, WithMeterProvider(mp), WithRandSource(zeroSource{}), WithRetryPolicy(fastPolicy(2)))
		dial, stop := testserver.Listen(func(gs *grpc.Server) { echov1.RegisterEchoServiceServer(gs, srv) })
		defer stop()
		for _, target := range []string{"passthrough:///one", "passthrough:///two", "passthrough:///one"} {
			cc, err := grpc.NewClient(target, append(dial, c.DialOptions()...)...)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = echov1.NewEchoServiceClient(cc).Echo(t.Context(), &echov1.EchoRequest{})
			_ = cc.Close()
		}
		const m = "grpc.method=resilience.echo.v1.EchoService/Echo"
		collect(t, reader).Expect(t, metricCallRetryDelay, "s", map[string]float64{
			// The first call fails twice, with one backoff of 10ms × 0.8.
			"count:" + m + ",grpc.target=passthrough:///one": 2, "sum:" + m + ",grpc.target=passthrough:///one": 0.008,
			"count:" + m + ",grpc.target=passthrough:///two": 1, "sum:" + m + ",grpc.target=passthrough:///two": 0,
		})
	})
}

// TestMetricsTargetIsCanonical pins gRFC A66's grpc.target: the canonical
// target, with the resolver scheme grpc.NewClient adds.
func TestMetricsTargetIsCanonical(t *testing.T) {
	cc, err := grpc.NewClient("localhost:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sets := newMethodMetrics(echoMethod).connSets(cc)
	cfg := metric.NewRecordConfig(sets.set)
	got := testserver.AttrKey(cfg.Attributes())
	if want := "grpc.method=resilience.echo.v1.EchoService/Echo,grpc.target=dns:///localhost:1"; got != want {
		t.Errorf("A96 attributes of a call on %q = %s, want %s", cc.Target(), got, want)
	}
}

// The metric readers of both packages' tests (see testserver.Collect).
type collected = testserver.Collected

func newMeterReader() (*sdkmetric.ManualReader, *sdkmetric.MeterProvider) {
	return testserver.NewMeterReader()
}

func collect(t *testing.T, r *sdkmetric.ManualReader) collected { return testserver.Collect(t, r) }
