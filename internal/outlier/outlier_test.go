package outlier

import (
	"math"
	"sync"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func at(d time.Duration) time.Time { return t0.Add(d) }

func testConfig() Config {
	return Config{ConsecutiveFailures: 3, MinimumCalls: 10, Window: 10 * time.Second,
		BaseEjectionTime: time.Second, MaxEjectionTime: 4 * time.Second, MaxEjectionPercent: 50}
}

func newGroup(t *testing.T, cfg Config, n int) (*Group, []*Endpoint) {
	t.Helper()
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	eps := make([]*Endpoint, n)
	for i := range eps {
		eps[i] = g.Add()
	}
	return g, eps
}

func TestConsecutiveFailuresEjectForBaseTime(t *testing.T) {
	_, eps := newGroup(t, testConfig(), 3)
	e := eps[0]
	for i, want := range []bool{false, false, true} {
		if got := e.Record(at(0), Failure).Ejected(); got != want {
			t.Fatalf("failure %d: Record = %v, want %v", i+1, got, want)
		}
	}
	tests := []struct {
		at   time.Duration
		want bool
	}{{0, true}, {999 * time.Millisecond, true}, {time.Second, false}, {time.Hour, false}}
	for _, tt := range tests {
		if got := e.Ejected(at(tt.at)); got != tt.want {
			t.Errorf("Ejected(t0+%v) = %v, want %v", tt.at, got, tt.want)
		}
	}
}

func TestSuccessBreaksTheRunButBusyDoesNot(t *testing.T) {
	_, eps := newGroup(t, testConfig(), 3)
	a, b := eps[0], eps[1]
	a.Record(at(0), Failure)
	a.Record(at(0), Failure)
	a.Record(at(0), Success)
	if a.Record(at(0), Failure).Ejected() {
		t.Fatal("a success did not reset the run of failures")
	}
	b.Record(at(0), Failure)
	b.Record(at(0), Failure)
	for range 100 {
		b.Record(at(0), Busy) // loaded, not broken: ignored, and no reset
		b.Record(at(0), Ignored)
	}
	if b.Ejected(at(0)) {
		t.Fatal("busy outcomes ejected an endpoint")
	}
	if !b.Record(at(0), Failure).Ejected() {
		t.Fatal("busy outcomes broke the run of failures")
	}
}

func TestFailureRateOverWindow(t *testing.T) {
	cfg := testConfig()
	cfg.ConsecutiveFailures, cfg.FailureRate = 0, 0.5
	_, eps := newGroup(t, cfg, 2)
	e := eps[0]
	// 9 outcomes, alternating: under MinimumCalls.
	for i := range 9 {
		o := Success
		if i%2 == 0 {
			o = Failure
		}
		if e.Record(at(time.Duration(i)*time.Millisecond), o).Ejected() {
			t.Fatalf("outcome %d ejected under MinimumCalls", i+1)
		}
	}
	// The 10th: 5 failures of 10 reach 0.5.
	if !e.Record(at(10*time.Millisecond), Failure).Ejected() {
		t.Fatal("5 failures in 10 outcomes with FailureRate 0.5 did not eject")
	}
	// Old outcomes leave the window: 20 s later, one failure alone is under
	// MinimumCalls (after the ejection ended, it is on probation: use another).
	f := eps[1]
	for i := range 9 {
		f.Record(at(time.Duration(i)*time.Millisecond), Failure)
		f.Record(at(time.Duration(i)*time.Millisecond), Success)
	}
	if f.Record(at(20*time.Second), Failure).Ejected() {
		t.Fatal("outcomes older than the window counted")
	}
}

func TestRepeatedEjectionsGrowToMaxAndDecay(t *testing.T) {
	_, eps := newGroup(t, testConfig(), 2)
	e := eps[0]
	eject := func(now time.Time) time.Duration {
		t.Helper()
		for range 3 {
			if e.Record(now, Failure).Ejected() {
				return e.EjectedUntil(now).Sub(now)
			}
		}
		t.Fatalf("no ejection at %v", now.Sub(t0))
		return 0
	}
	// First ejection: base 1 s. Back at 1 s on probation: its first
	// failure ejects at once, for 2 s, then 3 s, then 4 s (the max), 4 s.
	now := at(0)
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, 4 * time.Second} {
		if got := eject(now); got != want {
			t.Fatalf("ejection %d lasts %v, want %v", i+1, got, want)
		}
		now = now.Add(want)
	}
	// In rotation with a success (probation over), then 2.5 s: the
	// multiplier (5) decays by 2, so the next ejection is the 4th: 4 s.
	e.Record(now, Success)
	if got := eject(now.Add(2500 * time.Millisecond)); got != 4*time.Second {
		t.Fatalf("after 2.5 s in rotation: ejection lasts %v, want 4s", got)
	}
	// A long time in rotation: back to the base.
	now = now.Add(2500*time.Millisecond + 4*time.Second)
	e.Record(now, Success)
	if got := eject(now.Add(time.Hour)); got != time.Second {
		t.Fatalf("after an hour in rotation: ejection lasts %v, want 1s", got)
	}
}

func TestProbationEjectsOnFirstFailureOnly(t *testing.T) {
	_, eps := newGroup(t, testConfig(), 2)
	e := eps[0]
	for range 3 {
		e.Record(at(0), Failure)
	}
	if e.Record(at(time.Second), Success); e.Record(at(time.Second), Failure).Ejected() {
		t.Fatal("a failure after a success on return ejected at once: probation outlived the success")
	}
}

func TestOutcomesWhileEjectedAreDropped(t *testing.T) {
	_, eps := newGroup(t, testConfig(), 2)
	e := eps[0]
	for range 3 {
		e.Record(at(0), Failure)
	}
	for range 10 {
		if e.Record(at(500*time.Millisecond), Failure).Ejected() {
			t.Fatal("an in-flight failure re-ejected an ejected endpoint")
		}
	}
	if got := e.EjectedUntil(at(0)); !got.Equal(at(time.Second)) {
		t.Fatalf("EjectedUntil = %v, want t0+1s", got.Sub(t0))
	}
}

// TestMaxEjectionPercentIsAStrictBound pins that a whole-cluster outage
// never ejects more than the configured share: (ejected+1)×100 ≤ percent ×
// endpoints.
func TestMaxEjectionPercentIsAStrictBound(t *testing.T) {
	tests := []struct {
		n, percent, want int
	}{
		{1, 50, 0}, {2, 50, 1}, {3, 50, 1}, {3, 10, 0}, {3, 34, 1}, {3, 67, 2}, {3, 100, 3}, {10, 10, 1}, {10, 0, 0},
	}
	for _, tt := range tests {
		cfg := testConfig()
		cfg.MaxEjectionPercent = tt.percent
		g, eps := newGroup(t, cfg, tt.n)
		for _, e := range eps {
			for range 10 {
				e.Record(at(0), Failure)
			}
		}
		ejected, total := g.EjectedCount(at(0))
		if ejected != tt.want || total != tt.n {
			t.Errorf("%d endpoints all failing, MaxEjectionPercent %d: %d/%d ejected, want %d", tt.n, tt.percent, ejected, total, tt.want)
		}
		if _, refused := g.Ejections(); tt.want < tt.n && refused == 0 {
			t.Errorf("%d endpoints, %d%%: no refusal counted", tt.n, tt.percent)
		}
	}
}

// TestEjectedEndpointReturnsWithoutTraffic pins that an ejection ends with
// time alone (REVIEW class 1): no outcome is needed to bring it back.
func TestEjectedEndpointReturnsWithoutTraffic(t *testing.T) {
	g, eps := newGroup(t, testConfig(), 2)
	for range 3 {
		eps[0].Record(at(0), Failure)
	}
	if n, _ := g.EjectedCount(at(time.Second)); n != 0 || eps[0].Ejected(at(time.Second)) {
		t.Fatal("an ejection outlived its time without traffic")
	}
	// and the slot is free for another ejection
	for range 3 {
		eps[1].Record(at(time.Second), Failure)
	}
	if !eps[1].Ejected(at(time.Second)) {
		t.Fatal("an expired ejection still counted against MaxEjectionPercent")
	}
}

func TestRemovedEndpointFreesItsShare(t *testing.T) {
	g, eps := newGroup(t, testConfig(), 2)
	g.Remove(eps[1], at(0))
	for range 10 {
		eps[0].Record(at(0), Failure)
	}
	if eps[0].Ejected(at(0)) {
		t.Fatal("the last endpoint of a group was ejected")
	}
	if eps[1].Record(at(0), Failure); eps[1].Ejected(at(0)) {
		t.Fatal("a removed endpoint was ejected")
	}
}

func TestEjectionTimeFormula(t *testing.T) {
	c := Config{BaseEjectionTime: 30 * time.Second, MaxEjectionTime: 300 * time.Second}
	tests := []struct {
		k    int
		want time.Duration
	}{{1, 30 * time.Second}, {2, 60 * time.Second}, {10, 300 * time.Second}, {11, 300 * time.Second}, {maxMultiplier, 300 * time.Second}}
	for _, tt := range tests {
		if got := EjectionTime(c, tt.k); got != tt.want {
			t.Errorf("EjectionTime(k=%d) = %v, want %v", tt.k, got, tt.want)
		}
	}
	c.MaxEjectionTime = time.Second // below the base: the base
	if got := EjectionTime(c, 3); got != 30*time.Second {
		t.Errorf("EjectionTime with max < base = %v, want the base", got)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := testConfig()
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"negative consecutive", func(c *Config) { c.ConsecutiveFailures = -1 }},
		{"rate above 1", func(c *Config) { c.FailureRate = 1.5 }},
		{"rate NaN", func(c *Config) { c.FailureRate = nan() }},
		{"no minimum", func(c *Config) { c.MinimumCalls = 0 }},
		{"no window", func(c *Config) { c.Window = 0 }},
		{"no base", func(c *Config) { c.BaseEjectionTime = 0 }},
		{"negative max", func(c *Config) { c.MaxEjectionTime = -1 }},
		{"percent 101", func(c *Config) { c.MaxEjectionPercent = 101 }},
	}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate(testConfig) = %v", err)
	}
	for _, tt := range tests {
		c := ok
		tt.mod(&c)
		if _, err := New(c); err == nil {
			t.Errorf("%s: New = nil error", tt.name)
		}
	}
}

func nan() float64 { z := 0.0; return z / z }

func TestConcurrentRecordsEjectOnce(t *testing.T) {
	g, eps := newGroup(t, testConfig(), 4)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for _, e := range eps {
				for range 100 {
					e.Record(at(0), Failure)
					e.Ejected(at(0))
				}
			}
		})
	}
	wg.Wait()
	if n, _ := g.EjectedCount(at(0)); n != 2 {
		t.Fatalf("%d ejected, want 2 (50%% of 4)", n)
	}
	if ej, _ := g.Ejections(); ej != 2 {
		t.Fatalf("%d ejections counted, want 2", ej)
	}
}

func TestRecordAndEjectedAllocateNothing(t *testing.T) {
	_, eps := newGroup(t, testConfig(), 2)
	if n := testing.AllocsPerRun(1000, func() {
		eps[0].Record(at(0), Success)
		_ = eps[0].Ejected(at(0))
	}); n != 0 {
		t.Errorf("Record+Ejected: %v allocs, want 0", n)
	}
}

// TestHugeEjectionTimeSaturatesInsteadOfOverflowing pins that an ejection
// whose end lies past what a Unix nanosecond count holds (a
// baseEjectionTime or maxEjectionTime of centuries, which the service
// config clamps to time.Duration's ~292 years) ejects until the end of
// time, instead of wrapping to a negative instant that ejects nothing
// while Ejections counts one. Before: Ejected = false right after the
// ejection.
func TestHugeEjectionTimeSaturatesInsteadOfOverflowing(t *testing.T) {
	const century = 100 * 365 * 24 * time.Hour
	for _, cfg := range []Config{
		{ConsecutiveFailures: 1, MinimumCalls: 1, Window: time.Second, BaseEjectionTime: math.MaxInt64, MaxEjectionPercent: 100},
		{ConsecutiveFailures: 1, MinimumCalls: 1, Window: time.Second, BaseEjectionTime: century, MaxEjectionTime: math.MaxInt64, MaxEjectionPercent: 100},
	} {
		g, eps := newGroup(t, cfg, 1)
		e := eps[0]
		now := time.Now()
		// The second config passes the end of time as k grows (k = 3:
		// past maxEjectionTime/base, so maxEjectionTime): eject, return,
		// fail on probation, and again.
		for range 3 {
			if !e.Record(now, Failure).Ejected() {
				t.Fatalf("base %v max %v: a failure did not eject", cfg.BaseEjectionTime, cfg.MaxEjectionTime)
			}
			if !e.Ejected(now) || !e.Ejected(now.Add(century/2)) {
				t.Fatalf("base %v max %v: ejection %d ended at once or within a century (until %v)",
					cfg.BaseEjectionTime, cfg.MaxEjectionTime, e.State(now).Ejections, e.EjectedUntil(now))
			}
			if n, _ := g.EjectedCount(now); n != 1 {
				t.Fatalf("EjectedCount = %d, want 1", n)
			}
			if cfg.MaxEjectionTime != math.MaxInt64 {
				break
			}
			// Force a return by hand, as time cannot run past the end.
			e.mu.Lock()
			e.returnLocked(g.ns(now), Expired)
			e.mu.Unlock()
		}
	}
}

// TestOutcomeOfARemovedEndpointIsNotAnOverflow pins that a failure
// reported after its endpoint left the group (an attempt in flight when the
// resolver removed it) is not counted as an ejection refused by
// MaxEjectionPercent: the metric ejections_overflow says the bound held
// back an ejection, which a removal is not. Before: refused = 1.
func TestOutcomeOfARemovedEndpointIsNotAnOverflow(t *testing.T) {
	cfg := testConfig()
	cfg.ConsecutiveFailures = 1
	g, eps := newGroup(t, cfg, 4)
	g.Remove(eps[0], at(0))
	if eps[0].Record(at(0), Failure).Ejected() {
		t.Fatal("a removed endpoint was ejected")
	}
	if ej, refused := g.Ejections(); ej != 0 || refused != 0 {
		t.Fatalf("Ejections() = %d, %d; want 0, 0", ej, refused)
	}
}

// TestRefusalCountsOncePerHeldBackEjection pins what the refused count
// (the policy's ejections_overflow metric) measures: ejections
// MaxEjectionPercent held back, one per endpoint each time it crosses its
// threshold, not one per failure while it stays over it. Before: an
// endpoint failing 10 times in a row with the bound reached counted 8
// refusals (every failure from the 3rd).
func TestRefusalCountsOncePerHeldBackEjection(t *testing.T) {
	cfg := testConfig()
	cfg.MaxEjectionPercent = 25
	g, eps := newGroup(t, cfg, 4) // one ejection at most
	for range 3 {
		eps[0].Record(at(0), Failure)
	}
	if !eps[0].Ejected(at(0)) {
		t.Fatal("eps[0] not ejected")
	}
	for range 10 {
		eps[1].Record(at(0), Failure)
	}
	if _, refused := g.Ejections(); refused != 1 {
		t.Fatalf("refused = %d after one endpoint over its threshold, want 1", refused)
	}
	eps[1].Record(at(0), Success) // under its threshold again
	for range 5 {
		eps[1].Record(at(0), Failure)
	}
	if _, refused := g.Ejections(); refused != 2 {
		t.Fatalf("refused = %d after it crossed its threshold again, want 2", refused)
	}
}

// TestStateAtAFutureInstantLeavesTheWindowAlone pins that State, a read
// (the policy's Snapshots(now), with a time the operator chooses), does
// not move the failure-rate window: a snapshot taken "an hour ahead" froze
// the window there, so for the next hour no outcome aged out and old
// failures kept counting. Before: 9 failures 30s old plus 1 failure and 9
// successes now ejected (10/19 ≥ 50%); after: 1/10, no ejection.
func TestStateAtAFutureInstantLeavesTheWindowAlone(t *testing.T) {
	cfg := testConfig()
	cfg.ConsecutiveFailures, cfg.FailureRate, cfg.MinimumCalls = 0, 0.5, 10
	_, eps := newGroup(t, cfg, 2)
	e := eps[0]
	if s := e.State(at(time.Hour)); s.Calls != 0 {
		t.Fatalf("State = %+v, want an empty window", s)
	}
	for range 9 {
		e.Record(at(0), Failure)
	}
	if s := e.State(at(time.Hour)); s.Calls != 0 {
		t.Fatalf("State an hour ahead = %+v, want an empty window (all aged out)", s)
	}
	e.Record(at(30*time.Second), Failure)
	for range 9 {
		e.Record(at(30*time.Second), Success)
	}
	if e.Ejected(at(30 * time.Second)) {
		t.Fatalf("ejected with 1 failure in 10 over the window: %+v", e.State(at(30*time.Second)))
	}
	for _, tt := range []struct {
		at              time.Duration
		calls, failures int
	}{{30 * time.Second, 10, 1}, {39 * time.Second, 10, 1}, {40 * time.Second, 0, 0}, {time.Hour, 0, 0}} {
		if s := e.State(at(tt.at)); s.Calls != tt.calls || s.Failures != tt.failures {
			t.Errorf("State(t0+%v) = %d calls, %d failures; want %d, %d", tt.at, s.Calls, s.Failures, tt.calls, tt.failures)
		}
	}
}
