package outlier

import (
	"sync"
	"testing"
	"time"
)

// ejectN records failures on e at t until it is ejected, at most 20.
func ejectN(t *testing.T, e *Endpoint, now time.Time, o Outcome) Change {
	t.Helper()
	for range 20 {
		if ch := e.Record(now, o); ch.Ejected() {
			return ch
		}
	}
	t.Fatalf("no ejection after 20 outcomes %v", o)
	return Change{}
}

// TestLocalOriginFailuresCountApart pins Envoy's split of local-origin
// failures (the connection refused or reset before a response) from the
// endpoint's own: they eject after ConsecutiveLocalFailures in a row, are
// not in the failure-rate window, neither add to nor break a run of the
// endpoint's own failures, and an answer (even a failing one) ends their
// run.
func TestLocalOriginFailuresCountApart(t *testing.T) {
	cfg := testConfig()
	cfg.ConsecutiveLocalFailures = 4
	_, eps := newGroup(t, cfg, 4)
	a := eps[0]
	a.Record(at(0), Failure)
	a.Record(at(0), Failure)
	for range 3 {
		if a.Record(at(0), LocalFailure).Ejected() {
			t.Fatal("3 local failures ejected at ConsecutiveLocalFailures 4")
		}
	}
	// The run of the endpoint's own failures went on through them: the
	// third failure ejects (ConsecutiveFailures 3).
	if ch := a.Record(at(0), Failure); ch.Cause != ConsecutiveFailures {
		t.Fatalf("third failure with local ones between: %+v, want an ejection for consecutive_failures", ch)
	}

	b := eps[1]
	for range 3 {
		b.Record(at(0), LocalFailure)
	}
	b.Record(at(0), Failure) // an answer: the connection works
	for range 3 {
		if b.Record(at(0), LocalFailure).Ejected() {
			t.Fatal("an answer did not end the run of local failures")
		}
	}
	if s := b.State(at(0)); s.Calls != 1 || s.Failures != 1 || s.ConsecutiveLocalFailures != 3 {
		t.Fatalf("State = %+v: want 1 outcome in the window (local failures stay out) and a run of 3", s)
	}
	if ch := b.Record(at(0), LocalFailure); ch.Cause != LocalOrigin || ch.Duration != time.Second || ch.Count != 1 {
		t.Fatalf("4th local failure in a row: %+v, want a first ejection (1s) for local_origin", ch)
	}

	// Off by default (0): local failures alone never eject.
	cfg.ConsecutiveLocalFailures = 0
	_, eps = newGroup(t, cfg, 4)
	for range 100 {
		if eps[0].Record(at(0), LocalFailure).Ejected() {
			t.Fatal("local failures ejected with ConsecutiveLocalFailures 0")
		}
	}
}

// TestReconnectedEndsALocalOriginEjectionOnly pins the return of a
// backend restarted in place: ejected for resets of its old connection, it
// is back as soon as it has a working connection, on probation; an
// ejection for its own failures waits its time.
func TestReconnectedEndsALocalOriginEjectionOnly(t *testing.T) {
	cfg := testConfig()
	cfg.ConsecutiveLocalFailures = 2
	cfg.BaseEjectionTime, cfg.MaxEjectionTime = time.Minute, time.Hour
	_, eps := newGroup(t, cfg, 4)
	local, own := eps[0], eps[1]
	ejectN(t, local, at(0), LocalFailure)
	ejectN(t, own, at(0), Failure)
	if ch := own.Reconnected(at(time.Second)); ch != (Change{}) || !own.Ejected(at(time.Second)) {
		t.Fatalf("Reconnected ended an ejection for the endpoint's own failures: %+v", ch)
	}
	ch := local.Reconnected(at(time.Second))
	if ch.Return != Reconnected || ch.EjectedFor != time.Second || local.Ejected(at(time.Second)) {
		t.Fatalf("Reconnected = %+v, ejected %v; want a return after 1s", ch, local.Ejected(at(time.Second)))
	}
	if s := local.State(at(time.Second)); !s.Probation {
		t.Fatalf("back after a reconnection without probation: %+v", s)
	}
	// On probation: one local failure ejects it again, for twice as long.
	if ch := local.Record(at(2*time.Second), LocalFailure); ch.Cause != LocalOrigin || ch.Duration != 2*time.Minute {
		t.Fatalf("a local failure on probation: %+v, want a second ejection (2m)", ch)
	}
	if got := local.State(at(2 * time.Second)).Multiplier; got != 2 {
		t.Fatalf("multiplier = %d after a reconnection, want 2: the ejections in a row are remembered", got)
	}
	// A repeat (a crash loop): a new connection does not end it.
	if ch := local.Reconnected(at(3 * time.Second)); ch != (Change{}) || !local.Ejected(at(3*time.Second)) {
		t.Fatalf("Reconnected ended a repeated local-origin ejection: %+v", ch)
	}
}

// TestLastResortSuccessReturnsAtOnce pins REVIEW class 12: with every
// endpoint ejected, the outcomes of the attempts sent to them anyway
// count, so an endpoint that answers again returns at once instead of at
// the end of its ejection; a failure of such an attempt changes nothing,
// and an outcome of an attempt in flight when it was ejected is still
// dropped.
func TestLastResortSuccessReturnsAtOnce(t *testing.T) {
	cfg := testConfig()
	cfg.MaxEjectionPercent = 100
	cfg.BaseEjectionTime = time.Hour
	g, eps := newGroup(t, cfg, 2)
	for _, e := range eps {
		ejectN(t, e, at(0), Failure)
	}
	if n, _ := g.EjectedCount(at(time.Second)); n != 2 {
		t.Fatalf("%d ejected, want 2", n)
	}
	if ch := eps[0].Record(at(time.Second), Success); ch != (Change{}) || !eps[0].Ejected(at(time.Second)) {
		t.Fatalf("a success in flight at the ejection returned it: %+v", ch)
	}
	if ch := eps[0].RecordLastResort(at(time.Second), Failure); ch != (Change{}) || !eps[0].Ejected(at(time.Second)) {
		t.Fatalf("a last-resort failure changed the ejection: %+v", ch)
	}
	ch := eps[1].RecordLastResort(at(2*time.Second), Success)
	if ch.Return != Answered || ch.EjectedFor != 2*time.Second || eps[1].Ejected(at(2*time.Second)) {
		t.Fatalf("last-resort success = %+v, want a return (answered) after 2s", ch)
	}
	if s := eps[1].State(at(2 * time.Second)); s.Probation || s.Calls != 1 {
		t.Fatalf("after answering: %+v, want no probation and the success counted", s)
	}
	if g.Returns(Answered) != 1 {
		t.Fatalf("Returns(Answered) = %d, want 1", g.Returns(Answered))
	}
}

// TestRemoveKeepsTheBoundOverTheEndpointsLeft pins REVIEW class 12 for
// scale-down: with 4 endpoints and 2 ejected at 50%, the resolver dropping
// a healthy one leaves 2 of 3 out (67%): the longest-ejected returns, and
// Remove reports it.
func TestRemoveKeepsTheBoundOverTheEndpointsLeft(t *testing.T) {
	cfg := testConfig()
	cfg.BaseEjectionTime = time.Hour
	g, eps := newGroup(t, cfg, 4)
	ejectN(t, eps[1], at(0), Failure)
	ejectN(t, eps[0], at(time.Second), Failure)
	got := g.Remove(eps[3], at(2*time.Second))
	if len(got) != 1 || got[0].Endpoint != eps[1] || got[0].Change.Return != Bound || got[0].Change.EjectedFor != 2*time.Second {
		t.Fatalf("Remove = %+v, want eps[1] (the longest-ejected) back for max_ejection_percent after 2s", got)
	}
	if n, total := g.EjectedCount(at(2 * time.Second)); n != 1 || total != 3 {
		t.Fatalf("EjectedCount = %d/%d, want 1/3", n, total)
	}
	if !eps[0].Ejected(at(2 * time.Second)) {
		t.Fatal("the later ejection ended instead")
	}
	// Down to one endpoint: 0 of 1 may be out at 50%.
	g.Remove(eps[2], at(3*time.Second))
	if got := g.Remove(eps[1], at(3*time.Second)); len(got) != 1 || got[0].Endpoint != eps[0] {
		t.Fatalf("Remove to one endpoint = %+v, want eps[0] back", got)
	}
}

// TestSetConfigKeepsEjectionsAndMultipliers pins that a new configuration
// keeps each endpoint's state where it allows: an ejection goes on with
// its end, the multiplier grows on, a run of failures continues; a lower
// MaxEjectionTime shortens an ejection, and a lower MaxEjectionPercent
// returns the longest-ejected first. Before: any change started every
// endpoint afresh, un-ejecting all and forgetting the multipliers.
func TestSetConfigKeepsEjectionsAndMultipliers(t *testing.T) {
	cfg := testConfig()
	cfg.BaseEjectionTime, cfg.MaxEjectionTime, cfg.MaxEjectionPercent = time.Minute, time.Hour, 100
	g, eps := newGroup(t, cfg, 4)
	ejectN(t, eps[0], at(0), Failure)
	ejectN(t, eps[1], at(time.Second), Failure)
	eps[2].Record(at(0), Failure)
	eps[2].Record(at(0), Failure)

	next := cfg
	next.ConsecutiveFailures = 4
	if got, err := g.SetConfig(next, at(2*time.Second)); err != nil || len(got) != 0 {
		t.Fatalf("SetConfig(threshold 4) = %+v, %v; want nothing ended", got, err)
	}
	if u := eps[0].EjectedUntil(at(2 * time.Second)); !u.Equal(at(time.Minute)) {
		t.Fatalf("ejection's end moved to %v, want t0+1m", u.Sub(t0))
	}
	if eps[2].Record(at(2*time.Second), Failure).Ejected() || !eps[2].Record(at(2*time.Second), Failure).Ejected() {
		t.Fatal("the run of failures did not carry over: want the 4th failure in a row to eject")
	}

	// Back from its ejection at 1m, eps[0] fails on probation: its second
	// ejection lasts 2m, so the multiplier was kept.
	if ch := eps[0].Record(at(time.Minute), Failure); ch.Cause != Probation || ch.Duration != 2*time.Minute {
		t.Fatalf("after the change: %+v, want a second ejection of 2m", ch)
	}

	// MaxEjectionTime 90s: eps[0]'s 2m ejection (from 1m) ends at 2m30s.
	next.MaxEjectionTime = 90 * time.Second
	if got, _ := g.SetConfig(next, at(time.Minute+time.Second)); len(got) != 0 {
		t.Fatalf("SetConfig(max 90s) ended %+v, want none yet", got)
	}
	if u := eps[0].EjectedUntil(at(time.Minute + time.Second)); !u.Equal(at(150 * time.Second)) {
		t.Fatalf("shortened end = %v, want t0+2m30s", u.Sub(t0))
	}
	// A max of 1s ends it at once: it began 10s ago. (eps[1] and eps[2]
	// have expired by now, at 61s and 62s.)
	next.MaxEjectionTime, next.BaseEjectionTime = time.Second, time.Second
	got, _ := g.SetConfig(next, at(70*time.Second))
	if len(got) != 1 || got[0].Endpoint != eps[0] || got[0].Change.Return != Shortened || got[0].Change.EjectedFor != 10*time.Second {
		t.Fatalf("SetConfig(max 1s) = %+v, want eps[0] back (max_ejection_time) after 10s", got)
	}

	// MaxEjectionPercent 25 of 4 with 3 ejected: the two longest-ejected
	// return.
	g2, e2 := newGroup(t, cfg, 4)
	for i := range 3 {
		ejectN(t, e2[i], at(time.Duration(i)*time.Second), Failure)
	}
	cfg.MaxEjectionPercent = 25
	got, _ = g2.SetConfig(cfg, at(10*time.Second))
	if len(got) != 2 || got[0].Endpoint != e2[0] || got[1].Endpoint != e2[1] || got[0].Change.Return != Bound {
		t.Fatalf("SetConfig(25%%) = %+v, want e2[0] then e2[1] back", got)
	}
	// 0 ejects nothing, and returns every ejection.
	cfg.MaxEjectionPercent = 0
	if got, _ = g2.SetConfig(cfg, at(10*time.Second)); len(got) != 1 || got[0].Endpoint != e2[2] {
		t.Fatalf("SetConfig(0%%) = %+v, want e2[2] back", got)
	}
	if ejectN2 := e2[3]; func() bool {
		for range 20 {
			if ejectN2.Record(at(10*time.Second), Failure).Ejected() {
				return true
			}
		}
		return false
	}() {
		t.Fatal("MaxEjectionPercent 0 ejected an endpoint")
	}
	if _, err := g2.SetConfig(Config{}, at(0)); err == nil {
		t.Fatal("SetConfig(invalid) = nil error")
	}
}

// TestSweepReportsEachExpiryOnce pins that the end of an ejection by time
// is reported once, whether a sweep (a snapshot, the metrics) or the
// endpoint's next outcome notices it first.
func TestSweepReportsEachExpiryOnce(t *testing.T) {
	g, eps := newGroup(t, testConfig(), 4)
	ejectN(t, eps[0], at(0), Failure)
	ejectN(t, eps[1], at(0), Failure)
	if got := g.Sweep(at(500 * time.Millisecond)); len(got) != 0 {
		t.Fatalf("Sweep before the end = %+v", got)
	}
	got := g.Sweep(at(time.Second))
	if len(got) != 2 || got[0].Change.Return != Expired || got[0].Change.EjectedFor != time.Second {
		t.Fatalf("Sweep = %+v, want both back, expired after 1s", got)
	}
	if got := g.Sweep(at(2 * time.Second)); len(got) != 0 {
		t.Fatalf("second Sweep = %+v, want nothing", got)
	}
	if ch := eps[0].Record(at(2*time.Second), Success); ch.Return != NotReturned {
		t.Fatalf("Record after the sweep reported the return again: %+v", ch)
	}
	ejectN(t, eps[2], at(3*time.Second), Failure)
	if ch := eps[2].Record(at(5*time.Second), Success); ch.Return != Expired || ch.EjectedFor != time.Second {
		t.Fatalf("Record after the end = %+v, want the return, expired after 1s", ch)
	}
	if got := g.Sweep(at(5 * time.Second)); len(got) != 0 {
		t.Fatalf("Sweep after Record noticed it = %+v", got)
	}
	if n := g.Returns(Expired); n != 3 {
		t.Fatalf("Returns(Expired) = %d, want 3", n)
	}
}

// TestConcurrentRemoveSetConfigAndRecordsKeepTheBound runs ejections,
// removals, sweeps and configuration changes at once: at the end, the
// ejected endpoints are within the bound, and nothing deadlocks (Record
// takes the endpoint's lock then the group's; so do the group's returns).
func TestConcurrentRemoveSetConfigAndRecordsKeepTheBound(t *testing.T) {
	cfg := testConfig()
	cfg.ConsecutiveFailures, cfg.BaseEjectionTime = 1, time.Hour
	g, eps := newGroup(t, cfg, 16)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for k := range 200 {
				e := eps[(i*7+k)%len(eps)]
				if k%3 == 0 {
					e.RecordLastResort(at(time.Duration(k)*time.Millisecond), Success)
				} else {
					e.Record(at(time.Duration(k)*time.Millisecond), Failure)
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 6 {
			g.Remove(eps[i], at(time.Duration(i)*time.Millisecond))
			c := cfg
			c.MaxEjectionPercent = 50 - 5*i
			if _, err := g.SetConfig(c, at(time.Duration(i)*time.Millisecond)); err != nil {
				t.Error(err)
			}
			g.Sweep(at(time.Duration(i) * time.Millisecond))
		}
	})
	wg.Wait()
	n, total := g.EjectedCount(at(time.Second))
	if total != 10 || n*100 > 25*total {
		t.Fatalf("%d of %d ejected at 25%%", n, total)
	}
}
