package peakewma

import (
	"math"
	"slices"
	"testing"
	"time"
)

// TestObserveCutExpectsMoreThanTheCut pins ObserveCut: a request cut short
// unanswered after x, sent under the estimate b, raises the estimate to
// x + min(b, x), never lowers it, and a fresh estimate (b = 0) to x; cuts
// of requests sent one after another's cut build up to twice the cut.
func TestObserveCutExpectsMoreThanTheCut(t *testing.T) {
	const x = 13 * time.Millisecond
	const xn = int64(x)
	var fresh Estimator
	fresh.ObserveCut(sec, x, 0, tau)
	if got := fresh.Estimate(sec, tau); got != x {
		t.Fatalf("first observation a cut: Estimate = %v, want %v", got, x)
	}

	// The bench's hedged-away copy: a slow endpoint estimated at 10 ms,
	// cut at 13 ms: 23 ms, where ObservePeak leaves 13 (and the endpoint
	// is tried again τ·ln(23/13) ≈ 5.7 s later at the same fast cost).
	var e Estimator
	e.Observe(sec, 10*time.Millisecond, tau)
	e.ObserveCut(sec+xn, x, e.Estimate(sec, tau), tau) // sent at sec
	if got := e.Estimate(sec+xn, tau); got != 23*time.Millisecond {
		t.Fatalf("cut at 13ms of a request sent under 10ms: Estimate = %v, want 23ms", got)
	}
	var p Estimator
	p.Observe(sec, 10*time.Millisecond, tau)
	p.ObservePeak(sec+xn, x, tau)
	if got := p.Estimate(sec+xn, tau); got != x {
		t.Fatalf("ObservePeak at 13ms over 10ms: Estimate = %v, want 13ms", got)
	}

	// Requests sent with that one, under the same 10 ms, cut 1 to 5 ms
	// later: the last gives 18 + 10 = 28 ms, where weighing the estimate
	// the cuts before them raised would give 36 ms.
	for i := int64(1); i <= 5; i++ {
		e.ObserveCut(sec+xn+i*ms, time.Duration(xn+i*ms), 10*time.Millisecond, tau)
	}
	if got := e.Estimate(sec+xn+5*ms, tau); got != 28*time.Millisecond {
		t.Fatalf("six requests sent together under 10ms, the last cut at 18ms: Estimate = %v, want 28ms", got)
	}

	// Cuts in a row (each request sent after the cut before it) build on
	// each other, up to twice the cut.
	var row Estimator
	now := int64(sec)
	row.ObserveCut(now, x, 0, tau)
	for range 10 {
		sent := now
		now += xn
		row.ObserveCut(now, x, row.Estimate(sent, tau), tau)
	}
	if got := row.Estimate(now, tau); got != 2*x {
		t.Fatalf("eleven cuts of 13ms in a row: Estimate = %v, want %v (twice the cut)", got, 2*x)
	}

	// A cut shorter than half the estimate changes nothing but the decay:
	// the endpoint is known to be slower than that.
	var slow Estimator
	slow.Observe(sec, 50*time.Millisecond, tau)
	slow.ObserveCut(sec+xn, x, slow.Estimate(sec, tau), tau)
	if got := slow.Estimate(sec+xn, tau); !near(float64(got), 50e6*math.Exp(-float64(xn)/float64(tau))) {
		t.Fatalf("cut at 13ms over 50ms: Estimate = %v, want 50ms decayed by 13ms (unchanged)", got)
	}

	// A negative elapsed or estimate counts as 0.
	var neg Estimator
	neg.ObserveCut(sec, -x, -x, tau)
	if got := neg.Estimate(sec, tau); got != 0 {
		t.Fatalf("cut of −13ms sent under −13ms: Estimate = %v, want 0", got)
	}
}

// TestSimultaneousCutsOfANewEndpointCountOnce pins the first adversary's
// black hole (stop 43): sixteen requests sent together to an endpoint
// never measured, all cut by a timeout T, price it at T, as one cut does.
// Each weighing the estimate the previous cut raised, they priced it at
// 2T, and a healed endpoint was tried again τ·ln 2 ≈ 7 s later.
func TestSimultaneousCutsOfANewEndpointCountOnce(t *testing.T) {
	const T = 500 * time.Millisecond
	var e Estimator
	for i := range 16 {
		e.ObserveCut(sec+int64(T)+int64(i)*ms/10, T+time.Duration(i)*100*time.Microsecond, 0, tau)
	}
	if got := e.Estimate(sec+int64(T)+2*ms, tau); got > T+2*time.Millisecond {
		t.Fatalf("16 requests sent together, cut at %v: Estimate = %v, want about %v", T, got, T)
	}
}

// cutEvent is a request of a simulated run: sent at sent, cut x later.
type cutEvent struct{ sent, x int64 }

// runCuts sends and cuts the requests on e in time order, each sent under
// the estimate at its sending (as the balancer reads it at the pick), and
// returns the instant of the last cut.
func runCuts(e *Estimator, reqs []cutEvent) int64 {
	type ev struct {
		at   int64
		req  int
		send bool
	}
	var evs []ev
	for i, r := range reqs {
		evs = append(evs, ev{r.sent, i, true}, ev{r.sent + r.x, i, false})
	}
	slices.SortStableFunc(evs, func(a, b ev) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		if a.send != b.send { // a cut at the instant of a send lands first
			if a.send {
				return 1
			}
			return -1
		}
		return 0
	})
	under := make([]time.Duration, len(reqs))
	var last int64
	for _, v := range evs {
		if v.send {
			under[v.req] = e.Estimate(v.at, tau)
			continue
		}
		e.ObserveCut(v.at, time.Duration(reqs[v.req].x), under[v.req], tau)
		last = max(last, v.at)
	}
	return last
}

// TestOverlappingCutsInALongRunBuildUp (the second adversary, stop 43): an
// endpoint at 5 ms turns slow and is reached only by hedged copies cut at
// 12 ms, one sent every 13 ms or every 11 ms (each in flight when the one
// before it is cut). Every request after the first was sent under an
// estimate the cuts before it raised, and a minute later the estimate is
// twice the cut. A rule that grouped a cut with the latest cut before it
// never ended the group under the 11 ms cadence, weighed every cut
// against the 5 ms from before it, decayed toward 0, and left the bare
// cut, 12 ms.
func TestOverlappingCutsInALongRunBuildUp(t *testing.T) {
	const x = int64(12 * time.Millisecond)
	for _, gap := range []int64{13 * ms, 11 * ms} {
		var e Estimator
		e.Observe(sec, 5*time.Millisecond, tau)
		var reqs []cutEvent
		for s := int64(sec); s < sec+int64(time.Minute); s += gap {
			reqs = append(reqs, cutEvent{s, x})
		}
		now := runCuts(&e, reqs)
		if got := e.Estimate(now, tau); got < 2*time.Duration(x)-time.Millisecond {
			t.Errorf("a minute of 12ms cuts, one sent every %v: Estimate = %v, want about %v (twice the cut)",
				time.Duration(gap), got, 2*time.Duration(x))
		}
	}
}

// TestAShortCutInsideAGroupDoesNotRecountIt (the second adversary, stop
// 43): sixteen requests sent over 100 ms to an endpoint at 5 ms meet a
// black hole and are cut by a 500 ms timeout, 500-600 ms after the first
// was sent; one short cut among them (a hedged copy of another method,
// sent at 519 ms under the estimate the first cuts raised, cut 5 ms later).
// Each request weighs the estimate it was sent under: the sixteen the
// 5 ms, the short one changes nothing, and the estimate is about T + 5 ms.
// A rule that grouped cuts by the latest cut started a new group at the
// short cut, and the rest of the sixteen weighed the ~505 ms the first had
// raised: twice T.
func TestAShortCutInsideAGroupDoesNotRecountIt(t *testing.T) {
	const T = int64(500 * time.Millisecond)
	var e Estimator
	e.Observe(sec, 5*time.Millisecond, tau)
	reqs := []cutEvent{{sec + 519*ms, 5 * ms}}
	for i := int64(0); i < 16; i++ {
		reqs = append(reqs, cutEvent{sec + i*ms*100/16, T})
	}
	now := runCuts(&e, reqs)
	if got := e.Estimate(now, tau); got > time.Duration(T)+10*time.Millisecond {
		t.Fatalf("16 requests sent together cut at %v, one short cut among them: Estimate = %v, want about %v",
			time.Duration(T), got, time.Duration(T)+5*time.Millisecond)
	}
}
