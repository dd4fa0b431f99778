package backoff

import (
	"testing"
	"time"
)

func TestDelayPinsEveryFormulaAtItsBounds(t *testing.T) {
	ms := time.Millisecond
	base := Config{Initial: 100 * ms, Max: 1000 * ms, Multiplier: 2}
	with := func(j Jitter) Config { c := base; c.Jitter = j; return c }
	tests := []struct {
		name string
		c    Config
		n    int
		prev time.Duration
		r    float64
		want time.Duration
	}{
		{"a6 low", with(A6), 0, 0, 0, 80 * ms},
		{"a6 high", with(A6), 0, 0, 1, 120 * ms},
		{"a6 grows", with(A6), 2, 0, 0.5, 400 * ms},
		{"a6 capped then jittered", with(A6), 10, 0, 1, 1200 * ms},
		{"full low", with(Full), 1, 0, 0, 0},
		{"full high", with(Full), 1, 0, 1, 200 * ms},
		{"full mid", with(Full), 3, 0, 0.5, 400 * ms},
		{"equal low", with(Equal), 1, 0, 0, 100 * ms},
		{"equal high", with(Equal), 1, 0, 1, 200 * ms},
		{"none", with(None), 2, 0, 0.7, 400 * ms},
		{"none capped", with(None), 4, 0, 0, 1000 * ms},
		{"decorrelated first low", with(Decorrelated), 0, 0, 0, 100 * ms},
		{"decorrelated first high", with(Decorrelated), 0, 0, 1, 300 * ms},
		{"decorrelated from prev", with(Decorrelated), 3, 200 * ms, 1, 600 * ms},
		{"decorrelated low ignores prev", with(Decorrelated), 3, 200 * ms, 0, 100 * ms},
		{"decorrelated capped", with(Decorrelated), 5, 900 * ms, 1, 1000 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.c.Delay(tt.n, tt.prev, tt.r); got != tt.want {
				t.Errorf("Delay(%d, %v, %v) = %v, want %v", tt.n, tt.prev, tt.r, got, tt.want)
			}
		})
	}
}

func TestExponentialDoesNotOverflow(t *testing.T) {
	c := Config{Initial: time.Second, Max: time.Minute, Multiplier: 10}
	for _, n := range []int{30, 300, 3000} {
		if got := c.Exponential(n); got != time.Minute {
			t.Errorf("Exponential(%d) = %v, want %v", n, got, time.Minute)
		}
	}
}

func TestBounds(t *testing.T) {
	c := Config{Initial: 50 * time.Millisecond, Max: time.Second, Multiplier: 3, Jitter: A6}
	lo, hi := c.Bounds(1, 0)
	if lo != 120*time.Millisecond || hi != 180*time.Millisecond {
		t.Errorf("Bounds(1, 0) = %v, %v, want 120ms, 180ms", lo, hi)
	}
}

func TestDelayNearTheLongestDurationDoesNotWrapNegative(t *testing.T) {
	max := time.Duration(1<<63 - 1)
	for _, j := range []Jitter{A6, Full, Equal, Decorrelated, None} {
		c := Config{Initial: max / 2, Max: max, Multiplier: 10, Jitter: j}
		for _, r := range []float64{0, 0.5, 0.999999} {
			for n := range 4 {
				if got := c.Delay(n, max, r); got < 0 {
					t.Errorf("jitter %d: Delay(%d, max, %v) = %v, want a non-negative delay", j, n, r, got)
				}
			}
		}
	}
}

func TestJitterNamed(t *testing.T) {
	tests := []struct {
		name string
		want Jitter
		ok   bool
	}{
		{"", A6, true}, {"a6", A6, true}, {"full", Full, true}, {"equal", Equal, true},
		{"decorrelated", Decorrelated, true}, {"none", None, true}, {"Full", A6, false}, {"x", A6, false},
	}
	for _, tt := range tests {
		if got, ok := JitterNamed(tt.name); got != tt.want || ok != tt.ok {
			t.Errorf("JitterNamed(%q) = %v, %v, want %v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}
