package interceptor

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-resilience/resilience/internal/budget"
	"github.com/grpc-resilience/resilience/internal/latency"
)

// What a hedge may spend: one rule.
//
// A hedged call sends a timed copy when it has run for the method's
// hedging delay, and the delay is chosen so that the copies go to the
// slowest calls, and to no more of them than the retry budget pays for:
//
//	delay = max(base, min(L(1 − s), cliffFactor × L(1 − m)))
//
// where L(q) is the q-quantile of the method's latency, read from the
// window of its last 256 to 512 copies; base is the policy's HedgingDelay
// (fixed) or HedgingDelayFloor (hedgingDelayQuantile); s, the share of
// calls to hedge, is the policy's (1 − hedgingDelayQuantile; every call
// past HedgingDelay for a fixed delay) and at most three quarters of the
// budget's share b (the share of calls the retry budget pays a retry for:
// budget.Share, Ratio + MinRetriesPerSecond ÷ the calls per second that
// deposit in it, those under a retry or hedging policy; no limit without a
// budget, none at all with a zero one), the
// quarter left for retries and for the noise of a window; and m, the most
// the delay may hedge, is twice the policy's share and at most b. The
// second term is the fast edge of a gap: where L(1 − s) falls past a gap
// into a cluster of slow calls (a slow backend, a cache miss) that holds
// between s and m of them, the delay stays just above the fast calls and
// the cluster is hedged whole rather than its own tail; it applies when
// m ≤ 0.5. Until the window holds minSamples copies (100 by default, or
// latency.FixedDelayMinSamples, 32, for a fixed delay, which
// the rule only raises), the delay is the policy's
// HedgingDelay (none: copies go only after failures). Each copy takes a
// retry budget token, as a retry does, and is not sent when the budget
// cannot pay (the call goes on: the next delay, a failure, may still send
// one); a copy after a non-fatal failure is gRFC A6's, a retry: it is sent
// when A6 throttling and the budget allow it, whatever became of the
// timed ones. A6 throttling applies to every copy after the first, timed
// or not, as A6 specifies for hedging.
//
// A drift up. A window of 256 to 512 copies follows a change of the
// method's latency only once the new latencies are a share of it: until
// then a delay read from it sits below the new fast calls, and every call
// is hedged (bench/'s drift scenario, the base latency ×4 halfway: about 45
// calls of 3,200 hedged, 1.4% extra load, before the window turned). So the tail also counts the
// copies recorded at or above the delay in force: when driftOver (12) of
// them come before the next recompute, within 16 copies (in a steady state
// their share is about the share hedged, at most half: a hedged call
// records its cut-off copy above the delay and its answer below), the
// latency has moved up past the delay, and the window is restarted at once
// from the last 16 copies alone, which the delay is read from until the
// window fills again. A burst of slow calls (a pause of the server: a few
// calls, both copies of each past the delay) passes for one; its copies,
// at least 12 of a window of 16, would then outweigh the tail for hundreds
// of calls after it (at a share of 5%, until the window held 250 more),
// leaving the tail unhedged. So a restart keeps the delay it left behind,
// and when driftOver of the copies recorded before the next recompute are
// below it again, the latency is back where it was: the window restarts
// again from those of the last 16 copies below it, the calls after the
// burst, not the burst's last ones (and, after a true drift up, follows
// the latency when it comes back down). The tail's copies among them are
// left out with the burst's, and come back within the next copies.
//
// So hedging cannot lower a percentile above 1 − m: when more of the calls
// are slow than the budget pays for, the delay stays above them (their
// hedges would be refused at random, the budget's share spent for nothing
// while retries go without), and if they are more than 1%, so is the p99.

// cliffFactor bounds the delay at the fast edge of a gap: at most this many
// times the latency that the most the delay may hedge outlasts (see above).
const cliffFactor = 1.25

// recomputeEvery is how often, in copies observed, a method's delay is
// recomputed (with the budget's share as it is then).
const recomputeEvery = 16

// driftOver is how many of the recomputeEvery copies recorded since the
// last recompute must be at or above the delay in force for the delay to
// count as left behind by a drift up (see above).
const driftOver = 12

// hedgeTail is a method's hedging state: the window of its copies'
// durations, and the delay read from it. It belongs to the method's row
// and outlives configs (a method's latency does not change with its
// config); in holds what the config in force says.
type hedgeTail struct {
	window *latency.Window
	in     atomic.Pointer[tailInputs]
	// delay is the delay in force once ready, in nanoseconds, or
	// noTimedCopies.
	delay atomic.Int64
	ready atomic.Bool
	// mu orders the writes of in, delay and ready: a recompute reads in
	// and stores its delay under it, so that one racing a config update
	// (configure) cannot store the old config's delay, and ready, after
	// the update's. Taken only to write: every 16 copies, and on updates.
	mu sync.Mutex
	// recent holds the last recomputeEvery copies recorded, in
	// nanoseconds, at the window's count modulo recomputeEvery; over
	// counts those recorded at or above the delay in force since the last
	// recompute (the drift detector, see above).
	recent [recomputeEvery]atomic.Int64
	over   atomic.Uint32
	// left is the delay in force before the last restart after a drift up,
	// in nanoseconds, or 0 (none, or the window restarted since because the
	// latency came back below it); under counts the copies recorded below
	// it since the last recompute.
	left  atomic.Int64
	under atomic.Uint32
}

// tailInputs are what the delay is computed from under one config.
type tailInputs struct {
	base       time.Duration // HedgingDelay, or HedgingDelayFloor with a quantile
	share      float64       // the policy's share: 1 − quantile, or 1 for a fixed delay
	minSamples uint64
	budget     *budget.Budget // the client's retry budget; nil: none
}

// newHedgeTail returns a method's hedging state with an empty window.
func newHedgeTail() *hedgeTail {
	// The window's own quantile is not read (QuantileOf is).
	w, _ := latency.NewWindow(latency.DefaultWindowSize, 0.5)
	return &hedgeTail{window: w}
}

// configure sets what the delay is computed from under hp and the budget
// b (nil: none), and recomputes it when the window is ready.
func (t *hedgeTail) configure(hp *hedgePolicy, b *budget.Budget) {
	in := &tailInputs{base: hp.delay, share: 1, minSamples: hp.minSamples, budget: b}
	if hp.quantile > 0 {
		in.base, in.share = hp.floor, 1-hp.quantile
	}
	in.base = max(in.base, 0)
	t.mu.Lock()
	t.in.Store(in)
	t.ready.Store(false)
	t.mu.Unlock()
	t.maybeRecompute(t.window.Samples(), true)
}

// delayOf returns the delay of a call of a method with hedging policy hp
// and state t (nil: none, an untracked method): t's once ready, else hp's.
// One or two atomic loads; no lock.
func (t *hedgeTail) delayOf(hp *hedgePolicy) time.Duration {
	if t == nil || !t.ready.Load() {
		return hp.delay
	}
	return time.Duration(t.delay.Load())
}

// observe records a copy's duration d: a success's, or, when atLeast, a
// lower bound of it (a copy a sibling's answer or the caller cut off),
// kept only when at or above the delay in force, where it is known to be
// on the slow side.
func (t *hedgeTail) observe(d time.Duration, atLeast bool) {
	ready, delay := t.ready.Load(), time.Duration(t.delay.Load())
	if atLeast && ready && d < delay {
		return
	}
	// With no timed copies (delay < 0), or every copy at once (0), nothing
	// is above the delay: no drift to follow, and no recompute forced every
	// driftOver copies.
	above := ready && delay > 0 && d >= delay
	// The count this observation made, not Samples read after it: two
	// copies observed at once would both read past a multiple of
	// recomputeEvery, and neither would recompute.
	n := t.window.Observe(d)
	t.recent[n%recomputeEvery].Store(int64(d))
	// The driftOver-th copy above the delay, or below the delay a restart
	// left, recomputes it at once, not at the next multiple of
	// recomputeEvery.
	back := false
	if l := t.left.Load(); l > 0 && d < time.Duration(l) {
		back = t.under.Add(1) == driftOver
	}
	t.maybeRecompute(n, above && t.over.Add(1) == driftOver || back)
}

// maybeRecompute recomputes the delay once the window holds minSamples
// copies, then every recomputeEvery of them (or now, when force).
func (t *hedgeTail) maybeRecompute(n uint64, force bool) {
	if !t.due(t.in.Load(), n, force) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if in := t.in.Load(); t.due(in, n, force) { // the config in force now, not the one read above
		now := time.Now()
		up, down := t.over.Swap(0) >= driftOver, t.under.Swap(0) >= driftOver
		if (up || down) && t.ready.Load() {
			if s, _ := in.shares(now); s > 0 && s < 1 { // the delay is read from the window
				left := t.left.Swap(0) // down: the latency is back below it
				if up {
					left = 0
					t.left.Store(t.delay.Load())
				}
				t.restart(time.Duration(left))
			}
		}
		t.delay.Store(int64(t.compute(in, now)))
		t.ready.Store(true)
	}
}

// restart empties the window and records in it the last recomputeEvery
// copies alone, after a drift up, or those below below (> 0) when the
// latency came back below the delay a drift up left (see above). When none
// is (copies observed meanwhile took their places), the window is kept as
// it is: an empty one would read a delay of 0. Called with mu held.
func (t *hedgeTail) restart(below time.Duration) {
	var keep [recomputeEvery]time.Duration
	n := 0
	for i := range t.recent {
		if d := time.Duration(t.recent[i].Load()); d > 0 && (below <= 0 || d < below) {
			keep[n], n = d, n+1
		}
	}
	if n > 0 {
		t.window.Restart(keep[:n]...)
	}
}

// due reports whether the n-th copy (or a config update, force) must
// recompute the delay under in.
func (t *hedgeTail) due(in *tailInputs, n uint64, force bool) bool {
	if in == nil || n < max(in.minSamples, 1) {
		return false
	}
	return force || !t.ready.Load() || n%recomputeEvery == 0
}

// budgetMargin is the part of the budget's share the delay aims at: the
// rest is left for retries and for the window's noise.
const budgetMargin = 0.75

// shares returns s and m of the rule above at now: the share of calls to
// hedge, and the most the delay may hedge.
func (in *tailInputs) shares(now time.Time) (s, m float64) {
	s, m = in.share, min(2*in.share, 1)
	if in.budget != nil {
		b := in.budget.Share(now)
		s, m = min(s, budgetMargin*b), min(m, b)
	}
	return s, m
}

// compute returns the delay of the rule above at now.
func (t *hedgeTail) compute(in *tailInputs, now time.Time) time.Duration {
	s, m := in.shares(now)
	switch {
	case s <= 0:
		return noTimedCopies
	case s >= 1:
		return in.base
	}
	d := t.window.QuantileOf(1 - s)
	if m > s && m <= 0.5 {
		d = min(d, time.Duration(cliffFactor*float64(t.window.QuantileOf(1-m))))
	}
	return max(d, in.base)
}
