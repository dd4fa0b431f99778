package bench

import (
	"math"
	"testing"
	"time"
)

func TestCells(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"signed rounds a small negative to +0.0", signed(-0.01), "+0.0"},
		{"signed keeps the sign", signed(-1.04), "-1.0"},
		{"signed positive", signed(2), "+2.0"},
		{"ratio", ratio(1.234), "1.23×"},
		{"pct", pct(0.998), "99.8%"},
		{"pct NaN", pct(math.NaN()), "n/a"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, tt.got, tt.want)
		}
	}
}

func TestQuantileNearestRank(t *testing.T) {
	ds := make([]time.Duration, 100)
	for i := range ds {
		ds[i] = time.Duration(100-i) * time.Millisecond
	}
	for _, tt := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}, {0, time.Millisecond}} {
		if got := quantile(ds, tt.q); got != tt.want {
			t.Errorf("quantile(1..100 ms, %v) = %v, want %v", tt.q, got, tt.want)
		}
	}
}

// TestPairedRatio pins the paired measurement: a peer that does the bare
// call twice measures about 2× whatever the machine's speed.
func TestPairedRatio(t *testing.T) {
	spin := func() error {
		x := 0
		for i := range 20000 {
			x += i
		}
		if x < 0 {
			t.Fatal("unreachable")
		}
		return nil
	}
	twice := func() error { _ = spin(); return spin() }
	r, err := pairedRatio(400, spin, twice)
	if err != nil || r < 1.5 || r > 2.6 {
		t.Errorf("pairedRatio(400, f, f twice) = %v, %v; want about 2", r, err)
	}
}
