package cpuusage

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestParseUsageUsec(t *testing.T) {
	tests := []struct {
		in   string
		want float64
		ok   bool
	}{
		{"usage_usec 2500000\nuser_usec 1\n", 2.5, true},
		{"user_usec 1\nusage_usec 10\n", 0.00001, true},
		{"user_usec 1\n", 0, false},
		{"usage_usec x\n", 0, false},
	}
	for _, tt := range tests {
		got, ok := parseUsageUsec([]byte(tt.in))
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseUsageUsec(%q) = %v, %v, want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParseProcStat(t *testing.T) {
	busy, total, ok := parseProcStat([]byte("cpu  10 0 10 70 10 0 0 0 5 5\ncpu0 1 2 3\n"))
	if !ok || busy != 20 || total != 100 {
		t.Errorf("parseProcStat = %v, %v, %v, want 20, 100, true", busy, total, ok)
	}
	for _, bad := range []string{"", "intr 1 2 3 4 5", "cpu 1 2 x 4"} {
		if _, _, ok := parseProcStat([]byte(bad)); ok {
			t.Errorf("parseProcStat(%q) ok", bad)
		}
	}
}

// fakeSource is a cgroup-like source with a settable busy time (seconds)
// on 2 cores.
type fakeSource struct{ busy float64 }

func (f *fakeSource) read() (float64, bool) { return f.busy, true }
func (f *fakeSource) cores() float64        { return 2 }

// TestUsageSamplesLazily: the use is the busy time of the interval between
// samples over its wall time × cores, and is not resampled within Interval.
func TestUsageSamplesLazily(t *testing.T) {
	src := &fakeSource{}
	r := &Reader{src: src, interval: 250 * time.Millisecond}
	if u := r.Usage(t0); u != 0 {
		t.Fatalf("first sample: %v, want 0", u)
	}
	src.busy = 0.4 // 0.4s busy in 0.5s on 2 cores: 40%
	if u := r.Usage(t0.Add(500 * time.Millisecond)); u != 0.4 {
		t.Errorf("use = %v, want 0.4", u)
	}
	src.busy = 10
	if u := r.Usage(t0.Add(600 * time.Millisecond)); u != 0.4 {
		t.Errorf("within the interval: %v, want the last 0.4", u)
	}
	if u := r.Usage(t0.Add(time.Second)); u != 1 {
		t.Errorf("over capacity: %v, want clamped to 1", u)
	}
	var zero Reader
	if u := zero.Usage(t0); u != 0 {
		t.Errorf("zero Reader: %v", u)
	}
}

// TestNewReadsThisMachine: on this machine some source is found (Linux) and
// the use stays in [0, 1].
func TestNewReadsThisMachine(t *testing.T) {
	r := New(0)
	now := time.Now()
	for i := range 3 {
		u := r.Usage(now.Add(time.Duration(i) * time.Second))
		if u < 0 || u > 1 {
			t.Fatalf("Usage = %v, want within [0, 1]", u)
		}
	}
}
