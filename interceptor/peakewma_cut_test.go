package interceptor

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
)

// TestPeakEWMABringsBackABlackHoledEndpointAsSoonAsItsTimeoutSays pins how
// soon peak_ewma tries again an endpoint that it knows only by attempts the
// Client's per-attempt timeout T cut: once per about τ·ln(T / the others'
// latency), as the endpoint package documents. One backend of three
// black-holed for 30 s (the others answer in 5 ms), perAttemptRecvTimeout
// 500 ms, 16 callers: the first calls land on the unmeasured backend
// together and are all cut at T. Counted as its bare time (ObservePeak),
// the estimate was T and the healed backend got a call again 7.0–10.8 s
// after it healed. The first ObserveCut (stop 43's adversary) made each
// cut build on the estimate the one before it raised, though they were
// sent together: 2T at once, and the healed backend waited τ·ln 2 ≈ 7 s
// more (15.9–17.5 s). Each cut now weighs the estimate its attempt was
// sent under, so attempts sent together count once: 7.0–10.3 s.
func TestPeakEWMABringsBackABlackHoledEndpointAsSoonAsItsTimeoutSays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rg := timedOutPeakEWMARig(t)
		var healed atomic.Bool
		var back atomic.Int64 // when the healed backend first got an attempt
		for i, b := range rg.backends {
			b.OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
				if i == 1 {
					if !healed.Load() {
						return resiliencetest.Step{Delay: time.Hour}
					}
					back.CompareAndSwap(0, time.Now().UnixNano())
				}
				return resiliencetest.Step{Delay: 5 * time.Millisecond}
			})
		}
		start := time.Now()
		stop := start.Add(90 * time.Second)
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					_, _ = rg.echo().Echo(t.Context(), &echov1.EchoRequest{Message: "x"})
					time.Sleep(800 * time.Millisecond)
				}
			})
		}
		time.Sleep(30 * time.Second)
		healedAt := time.Now()
		healed.Store(true)
		wg.Wait()
		synctest.Wait()
		if back.Load() == 0 {
			t.Fatalf("the healed backend got no call in the %v after it healed", stop.Sub(healedAt))
		}
		after := time.Duration(back.Load() - healedAt.UnixNano())
		t.Logf("the healed backend got a call again %v after it healed", after)
		if after > 12500*time.Millisecond {
			t.Fatalf("the healed backend got a call again %v after it healed, want within 12.5s (7.0–10.8s when a cut counted its bare time): cuts of attempts sent together counted more than once", after)
		}
	})
}

// TestPeakEWMABringsBackAWholeClusterAfterABlackHole pins the recovery
// of a cluster-wide outage under the cut rule (REVIEW class 1): every
// backend black-holed for 30 s under 16 callers, each attempt cut by the
// 500 ms per-attempt timeout, so every estimate is raised to about twice
// the timeout, then all healed. No endpoint may be left out for its high
// price: each is picked for a call's first attempt within 2 s of healing
// (the third adversary of stop 43 measured 348–361 ms for any attempt),
// from 5 s after healing each takes at least 15% of the first attempts
// (21–46% in four runs), and calls succeed. With every endpoint priced
// alike, power-of-two choices spreads the picks by itself (a run with
// the decay on reads turned off spread them too): this pins the outcome
// end to end, as a wedge anywhere on the path (the picker, the ranks,
// the estimator) would show it.
func TestPeakEWMABringsBackAWholeClusterAfterABlackHole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rg := timedOutPeakEWMARig(t)
		var healed atomic.Bool
		back := make([]atomic.Int64, len(rg.backends)) // when each first got a call's first attempt after healing
		var late atomic.Bool                           // from 5 s after healing
		lateFirst := make([]atomic.Int64, len(rg.backends))
		for i, b := range rg.backends {
			b.OnCall(func(a resiliencetest.Attempt) resiliencetest.Step {
				if !healed.Load() {
					return resiliencetest.Step{Delay: time.Hour}
				}
				if a.Previous <= 0 { // a retry goes to an untried endpoint whatever it costs: not the price's choice
					back[i].CompareAndSwap(0, time.Now().UnixNano())
					if late.Load() {
						lateFirst[i].Add(1)
					}
				}
				return resiliencetest.Step{Delay: 5 * time.Millisecond}
			})
		}
		stop := time.Now().Add(40 * time.Second)
		var okAfter atomic.Int64
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					_, err := rg.echo().Echo(t.Context(), &echov1.EchoRequest{Message: "x"})
					if err == nil && healed.Load() {
						okAfter.Add(1)
					}
					time.Sleep(100 * time.Millisecond)
				}
			})
		}
		time.Sleep(30 * time.Second)
		healedAt := time.Now()
		healed.Store(true)
		time.Sleep(5 * time.Second)
		late.Store(true)
		wg.Wait()
		synctest.Wait()
		t.Logf("first attempts per backend from 5 s after healing: %d %d %d", lateFirst[0].Load(), lateFirst[1].Load(), lateFirst[2].Load())
		for i := range back {
			if back[i].Load() == 0 {
				t.Fatalf("backend %d got no first attempt in the %v after the cluster healed", i, stop.Sub(healedAt))
			}
			if after := time.Duration(back[i].Load() - healedAt.UnixNano()); after > 2*time.Second {
				t.Errorf("backend %d got a first attempt again %v after the cluster healed, want within 2s", i, after)
			}
		}
		var total int64
		for i := range lateFirst {
			total += lateFirst[i].Load()
		}
		for i := range lateFirst {
			if n := lateFirst[i].Load(); float64(n) < 0.15*float64(total) {
				t.Errorf("backend %d got %d of %d first attempts from 5 s after the cluster healed, want at least 15%%", i, n, total)
			}
		}
		if okAfter.Load() == 0 {
			t.Errorf("no call succeeded in the %v after the cluster healed", stop.Sub(healedAt))
		}
	})
}

// timedOutPeakEWMARig starts three READY backends behind the endpoint
// policy with the peak_ewma child and no ejection, called with 3 attempts,
// a per-attempt timeout of 500 ms (retried) and no retry budget.
func timedOutPeakEWMARig(t *testing.T) *rig {
	t.Helper()
	p := fastPolicy(3)
	p.PerAttemptRecvTimeout = 500 * time.Millisecond
	p.RetryableStatusCodes = []codes.Code{codes.Unavailable, codes.DeadlineExceeded}
	c := newTestClient(t, WithRetryPolicy(p), WithRetryBudget(nil))
	rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"childPolicy": [{"peak_ewma": {}}], `+noEjection[1:]))...)
	rg.waitReady(3)
	return rg
}

// TestPeakEWMAPricesABusyHedgedAwayEndpointAboveTheCut (the second
// adversary, stop 43): one backend of three turns from 5 ms to 40 ms under
// 32 closed-loop callers, hedging after 7 ms, so its copies are cut at
// 12 ms with attempts on it in flight at every moment. Each cut weighs the
// estimate its attempt was sent under, so the cuts build up to twice the
// cut, 24 ms, and it gets 1.38% of the first attempts; counted as the bare
// cut it is priced at 12 ms and gets 6.1–6.2%. A rule that grouped each
// cut with the latest cut before it never ended the group under such
// traffic and weighed every cut against the 5 ms from before it, decayed
// toward nothing: about 15 ms and 5.5% at 96 callers (7 of 7 runs).
func TestPeakEWMAPricesABusyHedgedAwayEndpointAboveTheCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rg := hedgedPeakEWMARig(t, 7*time.Millisecond)
		var slow atomic.Bool
		var slowFirst, calls atomic.Int64
		for i, b := range rg.backends {
			b.OnCall(func(a resiliencetest.Attempt) resiliencetest.Step {
				if i == 1 && slow.Load() {
					if a.Previous <= 0 {
						slowFirst.Add(1)
					}
					return resiliencetest.Step{Delay: 40 * time.Millisecond}
				}
				return resiliencetest.Step{Delay: 5 * time.Millisecond}
			})
		}
		stop := time.Now().Add(5 * time.Second)
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					_, _ = rg.echo().Echo(t.Context(), &echov1.EchoRequest{Message: "x"})
					if slow.Load() {
						calls.Add(1)
					}
				}
			})
		}
		time.Sleep(2 * time.Second)
		slow.Store(true)
		wg.Wait()
		est := rg.snapshot().Endpoints[1].Latency
		synctest.Wait()
		share := float64(slowFirst.Load()) / float64(calls.Load())
		t.Logf("slow backend: %d first attempts of %d calls (%.2f%%), estimate %v", slowFirst.Load(), calls.Load(), 100*share, est)
		if est < 20*time.Millisecond || share > 0.042 {
			t.Fatalf("the slow backend got %.2f%% of the first attempts, estimate %v, want at least 20ms (twice the 12ms cut) and at most 4.2%%: its cuts priced it near the bare cut", 100*share, est)
		}
	})
}
