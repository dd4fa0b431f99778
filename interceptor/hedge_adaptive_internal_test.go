package interceptor

import (
	"context"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/grpc-resilience/resilience/internal/budget"
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
	if mp.tail == nil || mp.tail.window.Samples() < serviceconfig.DefaultHedgingDelayMinSamples {
		t.Fatalf("the adaptive policy has no window, or too few samples in it")
	}
	if d := mp.tail.delayOf(mp.hedge); d != time.Hour {
		t.Errorf("delayOf() = %v, want the floor, 1h", d)
	}
	if n := testing.AllocsPerRun(1000, func() { _ = mp.tail.delayOf(mp.hedge) }); n != 0 {
		t.Errorf("delayOf allocates %v times, want 0", n)
	}
	t.Logf("a hedged call allocates %v times with a fixed delay, %v with an adaptive one", fixed, adaptive)
	if adaptive > fixed+0.5 {
		t.Errorf("a hedged call allocates %v times with an adaptive delay, %v with a fixed one: want no more", adaptive, fixed)
	}
}

// TestHedgingDelayRule pins the rule of hedge_delay.go on windows fed
// known latencies, with budgets of known shares b: delay = max(base,
// min(L(1 − s), 1.25 × L(1 − m))), s the policy's share and at most ¾·b, m
// twice the policy's share and at most b, the second term when m ≤ 0.5;
// no timed copy under a budget that pays for none.
func TestHedgingDelayRule(t *testing.T) {
	// feed returns latencies that are fast, or slow for a share of them
	// (percentSlow in every 100, spread evenly), 1000 of them.
	feed := func(fast, slow time.Duration, percentSlow int) []time.Duration {
		var ds []time.Duration
		for i := range 1000 {
			d := fast
			if i*percentSlow%100 < percentSlow {
				d = slow
			}
			ds = append(ds, d)
		}
		return ds
	}
	const ms = time.Millisecond
	// The buckets' upper edges of 2ms, 5ms, 6ms and 40ms.
	edge2, edge5, edge6, edge40, edge250 := 2097152*time.Nanosecond, 5242880*time.Nanosecond, 6291456*time.Nanosecond,
		41943040*time.Nanosecond, 251658240*time.Nanosecond
	type bg struct {
		ratio, min float64
		calls      int // requests in the window (TTL 10s): the share is ratio + 10·min/calls
	}
	tests := []struct {
		name   string
		policy serviceconfig.HedgingPolicy
		budget *bg // nil: none
		seen   []time.Duration
		want   time.Duration
	}{
		{"adaptive p95, 4% slow: the quantile", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.95},
			nil, feed(2*ms, 40*ms, 4), edge2},
		{"adaptive p95, 7% slow: in the gap, its fast edge, 1.25 × p90", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.95},
			nil, feed(2*ms, 40*ms, 7), edge2 * 5 / 4},
		{"adaptive p95, 20% slow: p90 in the slow mode too", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.95},
			nil, feed(2*ms, 40*ms, 20), edge40},
		{"adaptive p50: no gap rule past a share of 0.25", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.5},
			nil, feed(2*ms, 40*ms, 60), edge40},
		{"adaptive p90 under a budget paying for 5%, 12% slow: the budget's share, past the gap", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.9},
			&bg{0.05, 0, 1000}, feed(2*ms, 40*ms, 12), edge40},
		{"fixed 5ms above the calls' 80%: as set", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 5 * ms},
			&bg{0.2, 0, 1000}, feed(2*ms, 40*ms, 5), 5 * ms},
		{"fixed 5ms below every call, budget 20%: raised to the slow calls' edge", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 5 * ms},
			&bg{0.2, 0, 1000}, feed(6*ms, 120*ms, 7), edge6},
		{"fixed 5ms below every call, no budget: as set", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 5 * ms},
			nil, feed(6*ms, 120*ms, 7), 5 * ms},
		{"a third slow, budget paying for 40% (50 calls/s): past the gap, its fast edge, 1.25 × L(0.6)", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 5 * ms},
			&bg{0.2, 10, 500}, feed(5*ms, 250*ms, 33), edge5 * 5 / 4},
		{"a third slow, budget paying for 20%: above the slow calls, which it cannot pay for", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 5 * ms},
			&bg{0.2, 0, 1000}, feed(5*ms, 250*ms, 33), edge250},
		{"a budget paying for nothing: no timed copy", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 5 * ms},
			&bg{0, 0, 1000}, feed(2*ms, 40*ms, 5), noTimedCopies},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b *budget.Budget
			if tt.budget != nil {
				now := time.Now()
				var err error
				if b, err = budget.New(budget.Config{Ratio: tt.budget.ratio, MinRetriesPerSecond: tt.budget.min, TTL: 10 * time.Second}, now); err != nil {
					t.Fatal(err)
				}
				for range tt.budget.calls {
					b.OnRequest(now)
				}
			}
			hp := newHedgePolicy(&tt.policy)
			tail := newHedgeTail()
			tail.configure(hp, b)
			for _, d := range tt.seen {
				tail.observe(d, false)
			}
			tail.maybeRecompute(tail.window.Samples(), true)
			if got := tail.delayOf(hp); got != tt.want {
				t.Errorf("delay = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestBudgetShareCountsOnlyTheCallsThatMayRetry pins the calls the hedging
// rule's share b counts (package documentation, What a hedge may spend):
// those that deposit in the retry budget, the calls of methods under a
// retry or hedging policy, not every call of the client. 1000 calls of a
// method with no policy leave the share at +Inf (no request counted); 100
// hedged calls make it Ratio + MinRetriesPerSecond × TTL / 100.
func TestBudgetShareCountsOnlyTheCallsThatMayRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const plain = "/resilience.echo.v1.EchoService/ServerStream" // any name: it has no entry
		c := newTestClient(t,
			WithRetryBudget(&serviceconfig.RetryBudget{Ratio: 0.2, MinRetriesPerSecond: 10, TTL: 10 * time.Second}),
			WithMethodConfig(serviceconfig.MethodConfig{
				Name:          []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
				HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: time.Hour},
			}))
		ic := c.UnaryClientInterceptor()
		ctx := context.Background()
		req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
		b := c.state.Load().storm.budget
		for range 1000 {
			if err := ic(ctx, plain, req, reply, nil, okInvoker); err != nil {
				t.Fatal(err)
			}
		}
		if s := b.Share(time.Now()); !math.IsInf(s, 1) {
			t.Errorf("Share after 1000 calls with no policy = %v, want +Inf: they deposit nothing", s)
		}
		for range 100 {
			if err := ic(ctx, echoMethod, req, reply, nil, okInvoker); err != nil {
				t.Fatal(err)
			}
		}
		if s, want := b.Share(time.Now()), 0.2+10*10.0/100; math.Abs(s-want) > 1e-9 {
			t.Errorf("Share after 100 hedged calls = %v, want 0.2 + 10/s × 10s / 100 = %v", s, want)
		}
	})
}
