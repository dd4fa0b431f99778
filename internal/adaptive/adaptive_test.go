package adaptive

import (
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustNew(t *testing.T, cfg Config) *Throttle {
	t.Helper()
	th, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return th
}

func TestValidate(t *testing.T) {
	tests := []struct {
		cfg Config
		ok  bool
	}{
		{Config{}, true},
		{Config{K: 1, Window: time.Second}, true},
		{Config{K: 0.5}, false},
		{Config{K: 101}, false},
		{Config{K: math.NaN()}, false},
		{Config{Window: -1}, false},
		{Config{Window: 15}, false},
	}
	for _, tt := range tests {
		if err := tt.cfg.Validate(); (err == nil) != tt.ok {
			t.Errorf("Validate(%+v) = %v, want ok %v", tt.cfg, err, tt.ok)
		}
	}
}

// TestFormula pins p = max(0, (requests − K·accepts)/(requests + 1)), at
// most MaxRejectProbability, over a window of one second (no short window).
func TestFormula(t *testing.T) {
	tests := []struct {
		k                 float64
		requests, accepts int
		want              float64
	}{
		{2, 0, 0, 0},
		{2, 10, 10, 0},
		{2, 10, 5, 0},
		{2, 10, 4, 2.0 / 11},
		{2, 99, 0, 99.0 / 100}, // capped at MaxRejectProbability
		{1, 10, 5, 5.0 / 11},
		{3, 100, 30, 10.0 / 101},
	}
	for _, tt := range tests {
		th := mustNew(t, Config{K: tt.k, Window: time.Second})
		th.long.sum = bucket{float64(tt.requests), float64(tt.accepts)}
		if got := th.probLocked(t0); math.Abs(got-min(tt.want, MaxRejectProbability)) > 1e-12 {
			t.Errorf("p(K=%v, requests %d, accepts %d) = %v, want %v", tt.k, tt.requests, tt.accepts, got, tt.want)
		}
	}
}

// TestWindowForgets pins the window: counts leave it between 15/16 and 16/16
// of Window after they were made.
func TestWindowForgets(t *testing.T) {
	th := mustNew(t, Config{Window: 16 * time.Second})
	for range 10 {
		th.Done(t0, false)
	}
	tests := []struct {
		at   time.Duration
		want float64
	}{
		{0, 10},
		{14 * time.Second, 10},
		{15*time.Second - 1, 10},
		{16 * time.Second, 0},
	}
	for _, tt := range tests {
		if got := th.Snapshot(t0.Add(tt.at)).Requests; got != tt.want {
			t.Errorf("requests at %v = %v, want %v", tt.at, got, tt.want)
		}
	}
	// A long silence clears everything at once.
	th.Done(t0.Add(20*time.Second), true)
	if got := th.Snapshot(t0.Add(time.Hour)).Requests; got != 0 {
		t.Errorf("requests an hour later = %v, want 0", got)
	}
}

// simulate offers rate requests per second for d to a backend that accepts
// at most capacity per second (a token bucket of one second) and returns
// the share of requests that went out.
func simulate(th *Throttle, start time.Time, d time.Duration, rate, capacity float64) (sent float64, end time.Time) {
	gap := time.Duration(float64(time.Second) / rate)
	tokens := capacity
	n, out := 0, 0
	now := start
	for ; now.Sub(start) < d; now = now.Add(gap) {
		tokens = min(capacity, tokens+capacity*gap.Seconds())
		n++
		if !th.Allow(now) {
			continue
		}
		out++
		accepted := tokens >= 1
		if accepted {
			tokens--
		}
		th.Done(now, accepted)
	}
	return float64(out) / float64(n), now
}

// TestSettlesNearKTimesAccepts: a backend that can accept 30% of the
// offered load sees about K·30% = 60% of it (within 20%), and after it
// recovers the client returns to sending everything within one window.
func TestSettlesNearKTimesAccepts(t *testing.T) {
	const rate, window = 1000.0, 10 * time.Second
	th := mustNew(t, Config{K: 2, Window: window, Seed: 1})
	_, now := simulate(th, t0, 2*window, rate, 0.3*rate) // settle
	sent, now := simulate(th, now, window, rate, 0.3*rate)
	t.Logf("at 30%% capacity: %.3f of the requests sent (K·accepts = 0.6)", sent)
	if math.Abs(sent-0.6) > 0.6*0.2 {
		t.Errorf("sent %.3f of the offered load, want 0.6 ± 20%%", sent)
	}
	// Recovery: full capacity; after one window every request goes out.
	_, now = simulate(th, now, window, rate, 2*rate)
	sent, _ = simulate(th, now, time.Second, rate, 2*rate)
	if sent != 1 {
		t.Errorf("one window after recovery, sent %.3f, want 1", sent)
	}
	if p := th.Snapshot(now).RejectProbability; p != 0 {
		t.Errorf("one window after recovery, p = %v, want 0", p)
	}
}

func TestAllocs(t *testing.T) {
	th := mustNew(t, Config{})
	now := t0
	if n := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond)
		if th.Allow(now) {
			th.Done(now, true)
		}
	}); n != 0 {
		t.Errorf("allocs = %v, want 0", n)
	}
}

// TestInFlightRequestsDoNotCount: requests let out but not yet answered
// are not counted, so a fresh client sends all of them (issue 19, defect
// 7: before, 64 concurrent requests to a slow method looked refused and
// most were rejected before any answer came).
func TestInFlightRequestsDoNotCount(t *testing.T) {
	th := mustNew(t, Config{Seed: 1})
	for i := range 64 {
		if !th.Allow(t0) {
			t.Fatalf("request %d rejected with nothing answered", i)
		}
	}
	if s := th.Snapshot(t0); s.Requests != 0 || s.RejectProbability != 0 {
		t.Errorf("with 64 in flight: %+v, want nothing counted", s)
	}
	for range 64 {
		th.Done(t0.Add(500*time.Millisecond), true)
	}
	if s := th.Snapshot(t0.Add(500 * time.Millisecond)); s.Requests != 64 || s.Accepts != 64 {
		t.Errorf("after the answers: %+v, want 64 requests and accepts", s)
	}
}

// sendShare is the share of the requests offered at rate per second over
// [from, from+d) that a backend accepts, accepting all of them when up.
func sendShare(th *Throttle, from time.Time, d time.Duration, rate float64, up bool) float64 {
	gap := time.Duration(float64(time.Second) / rate)
	n, ok := 0, 0
	for now := from; now.Before(from.Add(d)); now = now.Add(gap) {
		n++
		if th.Allow(now) {
			th.Done(now, up)
			if up {
				ok++
			}
		}
	}
	return float64(ok) / float64(n)
}

// TestRecoversWithinSeconds: a fresh client (default window, 60s), 200
// requests a second, a backend down for 1.5s then up: a tenth of the
// requests still go out while it is down (MaxRejectProbability), and from
// 3s after it is back, every 250ms has 90% of its requests accepted (issue
// 19, defect 7: before, the minute-long window remembered the outage and
// the client kept rejecting most requests for most of a minute).
func TestRecoversWithinSeconds(t *testing.T) {
	th := mustNew(t, Config{Seed: 1})
	const rate, step = 200.0, 250 * time.Millisecond
	now := t0
	var down []float64
	for range 6 {
		down = append(down, sendShare(th, now, step, rate, false))
		now = now.Add(step)
	}
	if s := 1 - th.Snapshot(now).RejectProbability; s < 0.1-1e-9 {
		t.Errorf("after 1.5s down, %.3f of the requests go out, want at least 0.1", s)
	}
	recovered := time.Duration(-1)
	var shares []float64
	for i := range 24 {
		share := sendShare(th, now, step, rate, true)
		shares = append(shares, share)
		now = now.Add(step)
		switch {
		case share < 0.9:
			recovered = -1
		case recovered < 0:
			recovered = time.Duration(i) * step
		}
	}
	t.Logf("down: %.2f; after recovery, accepted per 250ms: %.2f; back for good after %v", down, shares, recovered)
	if recovered < 0 || recovered > 3*time.Second {
		t.Errorf("back to 90%% for good after %v, want within 3s", recovered)
	}
}
