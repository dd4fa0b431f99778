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

// TestFormula pins p = max(0, (requests − K·accepts)/(requests + 1)).
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
		{2, 99, 0, 99.0 / 100},
		{1, 10, 5, 5.0 / 11},
		{3, 100, 30, 10.0 / 101},
	}
	for _, tt := range tests {
		th := mustNew(t, Config{K: tt.k})
		th.sum = bucket{float64(tt.requests), float64(tt.accepts)}
		if got := th.probLocked(); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("p(K=%v, requests %d, accepts %d) = %v, want %v", tt.k, tt.requests, tt.accepts, got, tt.want)
		}
	}
}

// TestWindowForgets pins the window: counts leave it between 15/16 and 16/16
// of Window after they were made.
func TestWindowForgets(t *testing.T) {
	th := mustNew(t, Config{Window: 16 * time.Second})
	for range 10 {
		th.Allow(t0)
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
	th.Allow(t0.Add(20 * time.Second))
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
		if tokens >= 1 {
			tokens--
			th.Accepted(now)
		}
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
			th.Accepted(now)
		}
	}); n != 0 {
		t.Errorf("allocs = %v, want 0", n)
	}
}
