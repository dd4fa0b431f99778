package interceptor

import (
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestHedgingDelayUnderABudgetThatPaysForEveryCallStaysThePolicys pins the
// bench's endpoint-hedge workload on fake time, where the machine's load
// cannot reach it: one backend of three 10× slower (5 ms, 50 ms), a fixed
// hedgingDelay of 7 ms, a retry budget of ratio 1, 16 closed-loop callers
// under resilience_endpoint. The hedge rule (hedge_delay.go) leaves the
// delay at 7 ms (the budget pays for every call, so the latency three
// quarters of the calls outlast, a fast call's, is below it), every slow
// call is hedged to a fast backend, and the p99 falls to (7 + 5)/50 of the
// unhedged one: the real-time runs' 1-2.6× under a load average of 20 and
// more were the machine's, not the rule's.
func TestHedgingDelayUnderABudgetThatPaysForEveryCallStaysThePolicys(t *testing.T) {
	run := func(t *testing.T, hedged bool) (p99 time.Duration, delay time.Duration, copies, calls int) {
		mc := serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: echoService}}}
		if hedged {
			mc.HedgingPolicy = &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 7 * time.Millisecond,
				NonFatalStatusCodes: []codes.Code{codes.Unavailable}}
		}
		c := newTestClient(t, WithMethodConfig(mc),
			WithRetryBudget(&serviceconfig.RetryBudget{Ratio: 1, MinRetriesPerSecond: 10, TTL: 10 * time.Second}))
		cl := startCluster(t, 3, c, noEjection)
		for i, b := range cl.Backends {
			d := 5 * time.Millisecond
			if i == 1 {
				d = 50 * time.Millisecond
			}
			b.OnCall(func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Delay: d} })
		}
		client := cl.EchoClient()
		var mu sync.Mutex
		var lat []time.Duration
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Go(func() {
				for i := range 100 {
					ctx := metadata.AppendToOutgoingContext(t.Context(), "call-id", strconv.Itoa(g*1000+i))
					start := time.Now()
					if _, err := client.Echo(ctx, &echov1.EchoRequest{Message: "x"}); err != nil {
						t.Errorf("call %d/%d: %v", g, i, err)
						return
					}
					mu.Lock()
					lat = append(lat, time.Since(start))
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		time.Sleep(100 * time.Millisecond) // the losers end
		synctest.Wait()
		for _, b := range cl.Backends {
			copies += len(b.Attempts(resiliencetest.EchoMethod))
		}
		delay, _ = c.HedgingDelay(resiliencetest.EchoMethod)
		slices.Sort(lat)
		return lat[len(lat)*99/100], delay, copies, len(lat)
	}
	var unhedged time.Duration
	synctest.Test(t, func(t *testing.T) { unhedged, _, _, _ = run(t, false) })
	synctest.Test(t, func(t *testing.T) {
		p99, delay, copies, calls := run(t, true)
		if delay != 7*time.Millisecond {
			t.Errorf("HedgingDelay = %v, want the policy's 7ms: a budget of ratio 1 pays for every call", delay)
		}
		if r := float64(p99) / float64(unhedged); r > 0.25 {
			t.Errorf("hedged p99 %v = %.2f× the unhedged %v, want ≤ 0.25× (the floor is (7+5)/50 = 0.24)", p99, r, unhedged)
		}
		// Every slow call is hedged, and nothing else: the slow backend's
		// first attempts, a third of the calls (the hedges take no turn of
		// the rotation).
		if extra := float64(copies-calls) / float64(calls); extra < 0.3 || extra > 0.34 {
			t.Errorf("%d copies for %d calls: %.0f%% extra, want the slow third (30%%-34%%)", copies, calls, 100*extra)
		}
	})
}

// TestPeakEWMAMeasuresTheEndpointItsHedgesOutrun pins that a hedged copy
// cancelled because another copy answered first tells peak_ewma its
// endpoint had not answered in that time. One backend of three 200× slower
// than the others (1 ms, 200 ms), hedging after 10 ms, sequential calls:
// every call sent first to the slow backend is answered by its hedge on a
// fast one, and its own attempt is cancelled. Before, that cancellation
// said nothing (as a caller's does), the slow backend was never measured,
// its estimate stayed empty (cost 0), and peak_ewma sent it a first attempt
// whenever it was one of the two candidates: 26–30 of 60 calls, where
// round_robin sends it 20. Now its first call measures it (at least 10 ms)
// and it gets almost none.
func TestPeakEWMAMeasuresTheEndpointItsHedgesOutrun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rg := hedgedPeakEWMARig(t, 10*time.Millisecond)
		rg.slowBackend(1, time.Millisecond, 200*time.Millisecond)
		for i := range 60 {
			if _, err := rg.echo().Echo(t.Context(), &echov1.EchoRequest{Message: "x"}); err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
		}
		synctest.Wait()
		if n := rg.counts()[1]; n > 3 {
			t.Fatalf("the slow backend got %d of 60 first attempts: its hedged-away attempts did not measure it", n)
		}
		s := rg.snapshot()
		if est := s.Endpoints[1].Latency; est < 10*time.Millisecond {
			t.Fatalf("slow backend's estimate %v, want at least the hedging delay:\n%s", est, s)
		}
	})
}

// TestPeakEWMATriesAHedgedAwayEndpointRarelyAtALowRate pins how often
// peak_ewma tries again an endpoint it knows only through copies its
// hedges outran, when calls are few (bench/'s endpoint-hedge runs each row
// a sixth of the time, and a client at a few calls a second is the same):
// the estimate decays with time, not with calls, so the fewer the calls,
// the larger the share that meets the slow endpoint. One backend of three
// 10× slower (50 ms), the fast ones at 5 ms with every fifth answer at
// 10 ms (a fast endpoint's cost peaks, as on a busy machine), hedging
// after 7 ms, one call every 100 ms for 60 s. A hedged-away copy is cut at
// about 12 ms (the delay plus a fast answer); counted as its endpoint's
// latency (ObservePeak), the slow endpoint was tried again whenever its
// decayed 12 ms fell below a fast one's peak: 18–22 first attempts of 600
// (3.0–3.7%), so the p99 was a hedged call's. Counted as a latency cut
// short (ObserveCut: the cut plus the estimate it was sent under), it gets
// 8–9 (40 runs).
func TestPeakEWMATriesAHedgedAwayEndpointRarelyAtALowRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rg := hedgedPeakEWMARig(t, 7*time.Millisecond)
		for i, b := range rg.backends {
			var n atomic.Int64
			b.OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
				if i == 1 {
					return resiliencetest.Step{Delay: 50 * time.Millisecond}
				}
				if n.Add(1)%5 == 0 {
					return resiliencetest.Step{Delay: 10 * time.Millisecond}
				}
				return resiliencetest.Step{Delay: 5 * time.Millisecond}
			})
		}
		const calls = 600
		for i := range calls {
			if _, err := rg.echo().Echo(t.Context(), &echov1.EchoRequest{Message: "x"}); err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		synctest.Wait()
		first := 0
		for _, a := range rg.backends[1].Attempts(resiliencetest.EchoMethod) {
			if a.Previous <= 0 {
				first++
			}
		}
		t.Logf("first attempts on the slow backend: %d of %d", first, calls)
		if first > calls/50 {
			t.Fatalf("the slow backend got %d of %d first attempts (%.1f%%), want at most 2%%: its hedged-away copies priced it at the cut",
				first, calls, 100*float64(first)/calls)
		}
	})
}

// hedgedPeakEWMARig starts three READY backends behind the endpoint policy
// with the peak_ewma child and no ejection, called with one hedge after
// delay and no retry budget.
func hedgedPeakEWMARig(t *testing.T, delay time.Duration) *rig {
	t.Helper()
	mc := serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: echoService}},
		HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: delay,
			NonFatalStatusCodes: []codes.Code{codes.Unavailable}}}
	c := newTestClient(t, WithMethodConfig(mc), WithRetryBudget(nil))
	rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"childPolicy": [{"peak_ewma": {}}], `+noEjection[1:]))...)
	rg.waitReady(3)
	return rg
}
