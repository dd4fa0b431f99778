package peakewma

import (
	"slices"
	"testing"
	"time"
)

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
