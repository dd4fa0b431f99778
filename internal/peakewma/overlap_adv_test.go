package peakewma

import (
	"testing"
	"time"
)

// TestOverlappingCutsInALongRunBuildUp (adv43b): an endpoint at 5 ms
// turns slow and is reached only by hedged copies cut at 12 ms, one sent
// every 11 ms, so each is in flight when the one before it is cut. Every
// attempt after the first was sent after the first cut, under the estimate
// it raised: by ObserveCut's doc ("in flight together (sent before the
// first of them was cut)") they are cuts in a row and build up to 24 ms,
// as they do one every 13 ms. The code groups a cut with the latest cut
// instead, so the group never ends, each cut weighs the 5 ms from before
// it decayed toward 0, and a minute later the estimate is the bare cut.
func TestOverlappingCutsInALongRunBuildUp(t *testing.T) {
	const x = 12 * time.Millisecond
	for _, gap := range []time.Duration{13 * time.Millisecond, 11 * time.Millisecond} {
		var e Estimator
		e.Observe(sec, 5*time.Millisecond, tau)
		now := int64(sec)
		for s := int64(sec); s < sec+int64(time.Minute); s += int64(gap) {
			now = s + int64(x)
			e.ObserveCut(now, x, tau)
		}
		if got := e.Estimate(now, tau); got < 2*x-time.Millisecond {
			t.Errorf("a minute of 12ms cuts, one sent every %v: Estimate = %v, want about %v (twice the cut)", gap, got, 2*x)
		}
	}
}

// TestAShortCutInsideAGroupDoesNotRecountIt (adv43b): sixteen requests
// sent over 100 ms to an endpoint at 5 ms meet a black hole and are cut by
// a 500 ms timeout, 500-600 ms after the first was sent. One short cut
// among them (a hedged copy of another method, sent at 519 ms, after the
// latest cut, and cut 5 ms later) makes its own group, whose "before" is
// the estimate the first cuts raised (~505 ms): the requests of the first
// group still in flight then weigh that, not the 5 ms they were sent under,
// and price the endpoint at twice the timeout, as if no group rule.
func TestAShortCutInsideAGroupDoesNotRecountIt(t *testing.T) {
	const T = 500 * time.Millisecond
	var e Estimator
	e.Observe(sec, 5*time.Millisecond, tau)
	cut := func(sent, x int64) { e.ObserveCut(sent+x, time.Duration(x), tau) }
	for i := int64(0); i < 16; i++ {
		if i == 4 { // sent after the cut at 518.75 ms, cut before the one at 525
			cut(sec+519*ms, 5*ms)
		}
		cut(sec+i*ms*100/16, int64(T))
	}
	now := sec + 100*ms + int64(T)
	if got := e.Estimate(now, tau); got > T+10*time.Millisecond {
		t.Fatalf("16 requests sent together cut at %v, one short cut among them: Estimate = %v, want about %v", T, got, T+5*time.Millisecond)
	}
}
