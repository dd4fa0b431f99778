package interceptor

import (
	"context"
	"testing"
	"time"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestAdaptiveHedgeDelayCostsNoAllocation pins the hot-path promise of the
// adaptive delay: reading it allocates nothing, and a hedged call under it
// allocates no more than one under a fixed delay.
func TestAdaptiveHedgeDelayCostsNoAllocation(t *testing.T) {
	hedgedCallAllocs := func(hp *serviceconfig.HedgingPolicy) (callAllocs float64, mp *methodPolicy) {
		c := newTestClient(t, WithRetryBudget(nil), WithMethodConfig(serviceconfig.MethodConfig{
			Name: []serviceconfig.Name{{Service: echoService}}, HedgingPolicy: hp,
		}))
		ic := c.UnaryClientInterceptor()
		ctx := context.Background()
		req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
		for range 200 { // past the minimum samples
			if err := ic(ctx, echoMethod, req, reply, nil, okInvoker); err != nil {
				t.Fatal(err)
			}
		}
		return testing.AllocsPerRun(500, func() {
			if err := ic(ctx, echoMethod, req, reply, nil, okInvoker); err != nil {
				t.Fatal(err)
			}
		}), policyOf(c, echoMethod)
	}
	fixed, _ := hedgedCallAllocs(&serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: time.Hour})
	adaptive, mp := hedgedCallAllocs(&serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.9, HedgingDelayFloor: time.Hour})
	if mp.hedgeWindow == nil || mp.hedgeWindow.Samples() < serviceconfig.DefaultHedgingDelayMinSamples {
		t.Fatalf("the adaptive policy has no window, or too few samples in it")
	}
	if d, _ := mp.hedgeDelay(); d != time.Hour {
		t.Errorf("hedgeDelay() = %v, want the floor, 1h", d)
	}
	if n := testing.AllocsPerRun(1000, func() { _, _ = mp.hedgeDelay() }); n != 0 {
		t.Errorf("hedgeDelay allocates %v times, want 0", n)
	}
	t.Logf("a hedged call allocates %v times with a fixed delay, %v with an adaptive one", fixed, adaptive)
	if adaptive > fixed+0.5 {
		t.Errorf("a hedged call allocates %v times with an adaptive delay, %v with a fixed one: want no more", adaptive, fixed)
	}
}

// TestHedgeDelayKeepsHedgesOnTheSlowCalls pins hedgeDelay's rules (issue
// 20, hedging that buys the tail) on windows fed known latencies: the
// adaptive delay is its quantile capped at cliffFactor (1.25) × the
// quantile with twice the tail share; a fixed delay is rationed under a
// retry budget of ratio 0.2 (raised to the capped p95) only when more than
// a fifth of the calls outlast it, and never without a budget.
func TestHedgeDelayKeepsHedgesOnTheSlowCalls(t *testing.T) {
	// feed returns latencies that are fast, or slow for a share of them
	// (every 100/share-th), 1000 of them.
	feed := func(fast, slow time.Duration, percentSlow int) []time.Duration {
		var ds []time.Duration
		for i := range 1000 {
			d := fast
			if i%100 < percentSlow {
				d = slow
			}
			ds = append(ds, d)
		}
		return ds
	}
	const ms = time.Millisecond
	edge2, edge6 := 2097152*time.Nanosecond, 6291456*time.Nanosecond // the buckets' upper edges of 2ms and 6ms
	tests := []struct {
		name   string
		policy serviceconfig.HedgingPolicy
		ratio  float64 // the retry budget's; 0: none
		seen   []time.Duration
		want   time.Duration
	}{
		{"adaptive p95, 4% slow: the quantile", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.95},
			0.2, feed(2*ms, 40*ms, 4), edge2},
		{"adaptive p95, 7% slow: past the cliff, capped at 1.25 × p90", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.95},
			0.2, feed(2*ms, 40*ms, 7), edge2 * 5 / 4},
		{"adaptive p95, 20% slow: p90 in the slow mode too", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.95},
			0.2, feed(2*ms, 40*ms, 20), 41943040},
		{"adaptive p50: no cap", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.5},
			0.2, feed(2*ms, 40*ms, 60), 41943040},
		{"fixed 5ms above the calls: as set", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 5 * ms},
			0.2, feed(2*ms, 40*ms, 5), 5 * ms},
		{"fixed 5ms below every call: rationed to the capped p95", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 5 * ms},
			0.2, feed(6*ms, 120*ms, 7), edge6 * 5 / 4},
		{"fixed 5ms below every call, no budget: as set", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 5 * ms},
			0, feed(6*ms, 120*ms, 7), 5 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mp := &methodPolicy{hedge: newHedgePolicy(&tt.policy, tt.ratio)}
			if qs := mp.hedge.windowQuantiles(); qs != nil {
				mp.hedgeWindow = hedgeWindowOf(nil, qs)
				for _, d := range tt.seen {
					mp.hedgeWindow.Observe(d)
				}
			}
			if got, _ := mp.hedgeDelay(); got != tt.want {
				t.Errorf("hedgeDelay() = %v, want %v", got, tt.want)
			}
		})
	}
}
