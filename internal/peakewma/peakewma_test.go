package peakewma

import (
	"math"
	"sync"
	"testing"
	"time"
)

const (
	ms  = int64(time.Millisecond)
	sec = int64(time.Second)
	tau = 10 * time.Second
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(math.Abs(a), math.Abs(b)) }

// TestObserveFormulas pins the doc's formulas at chosen instants: a peak is
// taken at once, a lower latency moves the estimate by w = e^(−td/τ), and a
// read decays it toward zero by e^(−(t−stamp)/τ).
func TestObserveFormulas(t *testing.T) {
	var e Estimator
	if got := e.Estimate(sec, tau); got != 0 {
		t.Fatalf("Estimate of a new estimator = %v, want 0", got)
	}
	e.Observe(sec, 10*time.Millisecond, tau)
	if got := e.Estimate(sec, tau); got != 10*time.Millisecond {
		t.Fatalf("first observation: Estimate = %v, want 10ms", got)
	}
	e.Observe(sec+1*ms, 50*time.Millisecond, tau) // a peak
	if got := e.Estimate(sec+1*ms, tau); got != 50*time.Millisecond {
		t.Fatalf("after a peak: Estimate = %v, want 50ms", got)
	}
	// 10 s later (td = τ), 5 ms: c = 50·e^−1 + 5·(1 − e^−1).
	e.Observe(11*sec+1*ms, 5*time.Millisecond, tau)
	want := 50*float64(ms)*math.Exp(-1) + 5*float64(ms)*(1-math.Exp(-1))
	if got := float64(e.Estimate(11*sec+1*ms, tau)); !near(got, want) {
		t.Fatalf("EWMA step: Estimate = %v, want %v", got, want)
	}
	// Read 20 s later: decayed by e^−2.
	if got := float64(e.Estimate(31*sec+1*ms, tau)); !near(got, want*math.Exp(-2)) {
		t.Fatalf("decay: Estimate = %v, want %v", got, want*math.Exp(-2))
	}
	// Reading does not move the state: at the stamp it is unchanged.
	if got := float64(e.Estimate(11*sec+1*ms, tau)); !near(got, want) {
		t.Fatalf("a read changed the estimate: %v, want %v", got, want)
	}
}

// TestObservePeakNeverLowers pins ObservePeak: a timeout's latency raises
// the estimate when above it, and a shorter one leaves the (decayed)
// estimate as it is.
func TestObservePeakNeverLowers(t *testing.T) {
	var e Estimator
	e.Observe(sec, 20*time.Millisecond, tau)
	e.ObservePeak(sec, 5*time.Millisecond, tau)
	if got := e.Estimate(sec, tau); got != 20*time.Millisecond {
		t.Fatalf("a shorter timeout lowered the estimate to %v", got)
	}
	e.ObservePeak(sec, 100*time.Millisecond, tau)
	if got := e.Estimate(sec, tau); got != 100*time.Millisecond {
		t.Fatalf("a longer timeout: Estimate = %v, want 100ms", got)
	}
	var fresh Estimator
	fresh.ObservePeak(sec, 30*time.Millisecond, tau)
	if got := fresh.Estimate(sec, tau); got != 30*time.Millisecond {
		t.Fatalf("first observation a timeout: Estimate = %v, want 30ms", got)
	}
}

// TestCostWeighsOutstandingAndPenalizesTheUnmeasured pins Cost: estimate ×
// (1 + perAttempt × outstanding); an endpoint with requests outstanding and no
// observation within τ costs Penalty + outstanding, so it gets one request
// at a time until measured.
func TestCostWeighsOutstandingAndPenalizesTheUnmeasured(t *testing.T) {
	var e Estimator
	tests := []struct {
		name        string
		now         int64
		outstanding int
		want        float64
	}{
		{"never measured, idle", sec, 0, 0},
		{"never measured, one out", sec, 1, Penalty + 1},
	}
	for _, tt := range tests {
		if got := e.Cost(tt.now, tt.outstanding, 1, tau); got != tt.want {
			t.Errorf("%s: Cost = %v, want %v", tt.name, got, tt.want)
		}
	}
	e.Observe(sec, 10*time.Millisecond, tau)
	tests = []struct {
		name        string
		now         int64
		outstanding int
		want        float64
	}{
		{"measured, idle", sec, 0, 10 * float64(ms)},
		{"measured, 3 out", sec, 3, 40 * float64(ms)},
		{"τ later, idle: decayed", 11 * sec, 0, 10 * float64(ms) * math.Exp(-1)},
		{"τ later, 1 out: still recent", 11 * sec, 1, 2 * 10 * float64(ms) * math.Exp(-1)},
		{"past τ, 1 out: stale", 11*sec + 1, 1, Penalty + 1},
	}
	for _, tt := range tests {
		if got := e.Cost(tt.now, tt.outstanding, 1, tau); !near(got, tt.want) {
			t.Errorf("%s: Cost = %v, want %v", tt.name, got, tt.want)
		}
	}
	// Each attempt outstanding weighs perAttempt of the latency; the
	// penalty of the unmeasured is the same whatever it is.
	for _, tt := range []struct {
		name        string
		now         int64
		outstanding int
		perAttempt  float64
		want        float64
	}{
		{"a quarter, 8 out", sec, 8, 0.25, 30 * float64(ms)},
		{"a quarter, idle", sec, 0, 0.25, 10 * float64(ms)},
		{"none, 8 out", sec, 8, 0, 10 * float64(ms)},
		{"a quarter, past τ, 1 out: stale", 11*sec + 1, 1, 0.25, Penalty + 1},
	} {
		if got := e.Cost(tt.now, tt.outstanding, tt.perAttempt, tau); !near(got, tt.want) {
			t.Errorf("%s: Cost = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestSlowEndpointIsProbedAgainAfterTauLnRatio pins the doc's recovery
// arithmetic: an idle endpoint measured at 10× a competitor's latency
// costs less than the competitor again after τ·ln(10) ≈ 23 s.
func TestSlowEndpointIsProbedAgainAfterTauLnRatio(t *testing.T) {
	var slow, fast Estimator
	slow.Observe(sec, 50*time.Millisecond, tau)
	fast.Observe(sec, 5*time.Millisecond, tau)
	cross := sec + int64(float64(tau)*math.Log(10))
	for _, tt := range []struct {
		now     int64
		cheaper bool
	}{{sec, false}, {cross - 100*ms, false}, {cross + 100*ms, true}} {
		fast.Observe(tt.now, 5*time.Millisecond, tau) // the competitor keeps serving
		if got := slow.Cost(tt.now, 0, 1, tau) < fast.Cost(tt.now, 0, 1, tau); got != tt.cheaper {
			t.Errorf("at %v: slow cheaper = %v, want %v", time.Duration(tt.now-sec), got, tt.cheaper)
		}
	}
}

func TestCostAndObserveAllocateNothing(t *testing.T) {
	var e Estimator
	now := sec
	if n := testing.AllocsPerRun(1000, func() {
		now += ms
		e.Observe(now, 5*time.Millisecond, tau)
		_ = e.Cost(now, 2, 0.25, tau)
	}); n != 0 {
		t.Fatalf("Observe+Cost: %v allocs, want 0", n)
	}
}

func TestConcurrentObserveAndCost(t *testing.T) {
	var e Estimator
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				now := int64(g*1000+i+1) * ms
				e.Observe(now, time.Duration(1+i%7)*time.Millisecond, tau)
				if c := e.Cost(now, i%3, 0.25, tau); c < 0 || math.IsNaN(c) {
					t.Errorf("Cost = %v", c)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := e.Estimate(8000*ms, tau); got <= 0 || got > 7*time.Millisecond {
		t.Fatalf("Estimate after concurrent observations = %v, want within (0, 7ms]", got)
	}
}

// TestLateObservationKeepsTheNewestInstant pins the instant an estimate is
// stamped with when observations arrive out of order (two attempts end
// together; the one whose end was read first takes the lock second): the
// estimate stays stamped with the newest instant, so a read at that instant
// is not decayed by the late arrival's age. Before, the late observation
// moved the stamp back, and the estimate decayed again over time it had
// already decayed through.
func TestLateObservationKeepsTheNewestInstant(t *testing.T) {
	var e Estimator
	e.Observe(20*sec, 10*time.Millisecond, tau)
	e.Observe(10*sec, 5*time.Millisecond, tau) // ended 10 s earlier, delivered late
	if got := e.Estimate(20*sec, tau); got != 10*time.Millisecond {
		t.Fatalf("Estimate at the newest observation's instant = %v, want 10ms (the late, lower sample weighs nothing at w = 1)", got)
	}
	// A late peak is taken, at the newest instant.
	e.Observe(10*sec, 30*time.Millisecond, tau)
	if got := e.Estimate(20*sec, tau); got != 30*time.Millisecond {
		t.Fatalf("Estimate after a late peak = %v, want 30ms", got)
	}
	// A late timeout's lower bound below the estimate changes nothing.
	e.ObservePeak(10*sec, 20*time.Millisecond, tau)
	if got := e.Estimate(20*sec, tau); got != 30*time.Millisecond {
		t.Fatalf("Estimate after a late, lower timeout = %v, want 30ms", got)
	}
}
