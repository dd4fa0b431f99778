package server

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestLimitMetricsAfterAScriptedSequence runs a server-wide limit of one
// call with a queue of one (50ms) and a method limit of two through
// admissions, a queued call admitted, a call shed over the limit, one shed
// from the queue, one rejected at the door for its deadline, and reads the
// instruments through the SDK's ManualReader, mid-way and at the end.
func TestLimitMetricsAfterAScriptedSequence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, mp := newMeterReader()
		l := limitsOf(serviceconfig.ConcurrencyLimit{InitialLimit: 1, MinLimit: 1, MaxLimit: 1,
			MaxQueue: 1, MaxQueueWait: 50 * time.Millisecond})
		l.Config.MethodConfig = []serviceconfig.ServerMethodConfig{
			methodLimitOf(t, "/pkg.S/Other", serviceconfig.ConcurrencyLimit{InitialLimit: 2, MinLimit: 2, MaxLimit: 2})}
		srv := newLimitServer(t, l, WithMeterProvider(mp))
		icpt := srv.UnaryServerInterceptor()
		results := make(chan error, 3)
		run := func(ctx context.Context, method, crit string, hold time.Duration) {
			if crit != "" {
				ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(wire.CriticalityKey, crit))
			}
			go func() {
				_, err := icpt(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, func(context.Context, any) (any, error) {
					time.Sleep(hold)
					return "ok", nil
				})
				results <- err
			}()
			synctest.Wait()
		}
		wantCodes := func(want ...codes.Code) {
			t.Helper()
			got := map[codes.Code]int{}
			for range want {
				got[status.Code(<-results)]++
			}
			for _, c := range want {
				got[c]--
			}
			for c, n := range got {
				if n != 0 {
					t.Errorf("%d more calls ended with %v than expected", n, c)
				}
			}
		}
		const m, other = "/pkg.S/M", "/pkg.S/Other"
		run(t.Context(), m, "", 30*time.Millisecond)               // admitted
		run(t.Context(), m, "SHEDDABLE_PLUS", 10*time.Millisecond) // queued, admitted after 30ms
		mid := collect(t, reader)
		mid.Expect(t, metricSrvLimitCurrent, "{call}", map[string]float64{"resilience.limiter=server": 1, "resilience.limiter=pkg.S/Other": 2})
		mid.Expect(t, metricSrvLimitInFlight, "{call}", map[string]float64{"resilience.limiter=server": 1, "resilience.limiter=pkg.S/Other": 0})
		mid.Expect(t, metricSrvLimitQueued, "{call}", map[string]float64{"resilience.limiter=server": 1, "resilience.limiter=pkg.S/Other": 0})
		run(t.Context(), m, "SHEDDABLE_PLUS", time.Millisecond) // the queue is full of as critical a call: shed
		wantCodes(codes.ResourceExhausted, codes.OK, codes.OK)

		run(t.Context(), m, "", 200*time.Millisecond)      // admitted
		run(t.Context(), m, "SHEDDABLE", time.Millisecond) // queued, shed after 50ms
		wantCodes(codes.ResourceExhausted, codes.OK)

		// The base RTT is now 10ms: 5ms left is rejected at the door, but
		// for one call per service time, which it lets through to see
		// whether the service has become fast again (this one outlives its
		// deadline: no sample).
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
		run(ctx, m, "", 20*time.Millisecond) // let through
		run(ctx, m, "", 0)
		wantCodes(codes.DeadlineExceeded, codes.OK)
		cancel()
		run(t.Context(), other, "", time.Millisecond)
		wantCodes(codes.OK)

		got := collect(t, reader)
		const gm, gother = "grpc.method=pkg.S/M", "grpc.method=pkg.S/Other"
		got.Expect(t, metricSrvLimitAdmitted, "{call}", map[string]float64{
			gm + ",resilience.criticality=CRITICAL":       3,
			gm + ",resilience.criticality=SHEDDABLE_PLUS": 1,
			gother + ",resilience.criticality=CRITICAL":   1,
		})
		got.Expect(t, metricSrvLimitShed, "{call}", map[string]float64{
			gm + ",resilience.criticality=SHEDDABLE_PLUS,resilience.reason=limit":    1,
			gm + ",resilience.criticality=SHEDDABLE,resilience.reason=queue_timeout": 1,
			gm + ",resilience.criticality=CRITICAL,resilience.reason=deadline":       1,
		})
		got.Expect(t, metricSrvLimitQueueWait, "s", map[string]float64{"count:" + gm: 2, "sum:" + gm: 0.080})
		got.Expect(t, metricSrvLimitCurrent, "{call}", map[string]float64{"resilience.limiter=server": 1, "resilience.limiter=pkg.S/Other": 2})
		got.Expect(t, metricSrvLimitInFlight, "{call}", map[string]float64{"resilience.limiter=server": 0, "resilience.limiter=pkg.S/Other": 0})
		got.Expect(t, metricSrvLimitQueued, "{call}", map[string]float64{"resilience.limiter=server": 0, "resilience.limiter=pkg.S/Other": 0})
	})
}

// TestLimitMetricsCPUShedding: the CPU shedder's admissions and sheds
// (reason cpu) and its gauges, under resilience.limiter=cpu.
func TestLimitMetricsCPUShedding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, mp := newMeterReader()
		srv := newLimitServer(t, Limits{CPU: &CPUShedding{CPU: func() float64 { return 1 }}}, WithMeterProvider(mp))
		icpt := srv.UnaryServerInterceptor()
		info := &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"}
		// One call of 10ms fills a bucket (500ms): the bandwidth-delay
		// product is then 1 × 10ms / 500ms, rounded up to 1 call.
		if _, err := icpt(t.Context(), nil, info, sleepHandler(10*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(600 * time.Millisecond)
		done := make(chan error)
		go func() { _, err := icpt(t.Context(), nil, info, sleepHandler(100*time.Millisecond)); done <- err }()
		synctest.Wait()
		ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(wire.CriticalityKey, "SHEDDABLE"))
		if _, err := icpt(ctx, nil, info, sleepHandler(0)); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("hot CPU, one call in flight: %v, want RESOURCE_EXHAUSTED", err)
		}
		mid := collect(t, reader)
		mid.Expect(t, metricSrvLimitCurrent, "{call}", map[string]float64{"resilience.limiter=cpu": 1})
		mid.Expect(t, metricSrvLimitInFlight, "{call}", map[string]float64{"resilience.limiter=cpu": 1})
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		got := collect(t, reader)
		const gm = "grpc.method=pkg.S/M"
		got.Expect(t, metricSrvLimitAdmitted, "{call}", map[string]float64{gm + ",resilience.criticality=CRITICAL": 2})
		got.Expect(t, metricSrvLimitShed, "{call}", map[string]float64{gm + ",resilience.criticality=SHEDDABLE,resilience.reason=cpu": 1})
		got.Expect(t, metricSrvLimitInFlight, "{call}", map[string]float64{"resilience.limiter=cpu": 0})
	})
}

// TestLimitMetricsAllocateNothing: an admitted call under a limit
// allocates nothing with no provider, the no-op provider or the SDK's
// (its attribute sets are built on the method's first call).
func TestLimitMetricsAllocateNothing(t *testing.T) {
	tests := []struct {
		name string
		mp   metric.MeterProvider
	}{
		{"no provider", nil},
		{"no-op provider", noop.NewMeterProvider()},
		{"SDK provider", sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := []Option{WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{}))}
			if tt.mp != nil {
				opts = append(opts, WithMeterProvider(tt.mp))
			}
			srv, err := New(opts...)
			if err != nil {
				t.Fatal(err)
			}
			icpt := srv.UnaryServerInterceptor()
			info := &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"}
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-other", "v"))
			h := func(context.Context, any) (any, error) { return nil, nil }
			_, _ = icpt(ctx, nil, info, h) // builds the method's sets
			if n := testing.AllocsPerRun(1000, func() { _, _ = icpt(ctx, nil, info, h) }); n != 0 {
				t.Errorf("allocs per admitted call = %v, want 0", n)
			}
		})
	}
}
