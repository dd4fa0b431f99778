package main

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/internal/backoff"
)

const ms = time.Millisecond

// TestRetrySchedule pins the delay ranges of the package documentation for
// every jitter, with d = 100ms, 300ms, 900ms, then maxBackoff 1s.
func TestRetrySchedule(t *testing.T) {
	base := backoff.Config{Initial: 100 * ms, Max: time.Second, Multiplier: 3}
	tests := []struct {
		name   string
		jitter backoff.Jitter
		lo, hi []time.Duration // before attempts 2 to 5
	}{
		{"a6 is d × [0.8, 1.2]", backoff.A6,
			[]time.Duration{80 * ms, 240 * ms, 720 * ms, 800 * ms},
			[]time.Duration{120 * ms, 360 * ms, 1080 * ms, 1200 * ms}},
		{"full is [0, d]", backoff.Full,
			[]time.Duration{0, 0, 0, 0},
			[]time.Duration{100 * ms, 300 * ms, 900 * ms, 1000 * ms}},
		{"equal is [d/2, d]", backoff.Equal,
			[]time.Duration{50 * ms, 150 * ms, 450 * ms, 500 * ms},
			[]time.Duration{100 * ms, 300 * ms, 900 * ms, 1000 * ms}},
		{"decorrelated is [initial, min(3 × previous, max)]", backoff.Decorrelated,
			[]time.Duration{100 * ms, 100 * ms, 100 * ms, 100 * ms},
			[]time.Duration{300 * ms, 900 * ms, 1000 * ms, 1000 * ms}},
		{"none is d", backoff.None,
			[]time.Duration{100 * ms, 300 * ms, 900 * ms, 1000 * ms},
			[]time.Duration{100 * ms, 300 * ms, 900 * ms, 1000 * ms}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := base
			b.Jitter = tt.jitter
			const attempt = 50 * ms
			steps := retrySchedule(b, 5, attempt)
			if len(steps) != 5 {
				t.Fatalf("retrySchedule(%+v, 5, %v) has %d steps, want 5", b, attempt, len(steps))
			}
			if s := steps[0]; s != (step{attempt: 1, end: attempt}) {
				t.Errorf("first step = %+v, want no delay, ending at %v", s, attempt)
			}
			var lo, hi []time.Duration
			end := attempt
			for _, s := range steps[1:] {
				lo, hi = append(lo, s.lo), append(hi, s.hi)
				if want := end + s.hi; s.start != want {
					t.Errorf("attempt %d starts by %v, want %v (previous end + hi)", s.attempt, s.start, want)
				}
				if s.end != s.start+attempt {
					t.Errorf("attempt %d ends by %v, want start %v + %v", s.attempt, s.end, s.start, attempt)
				}
				end = s.end
			}
			if !slices.Equal(lo, tt.lo) || !slices.Equal(hi, tt.hi) {
				t.Errorf("delay bounds = %v, %v, want %v, %v", lo, hi, tt.lo, tt.hi)
			}
		})
	}
}

// TestRetrySchedule_saturatesPastMaxDuration pins that a delay or a sum past
// the largest time.Duration reads as the largest, not as a negative value.
func TestRetrySchedule_saturatesPastMaxDuration(t *testing.T) {
	b := backoff.Config{Initial: math.MaxInt64 / 2, Max: math.MaxInt64, Multiplier: 4, Jitter: backoff.A6}
	steps := retrySchedule(b, 4, time.Hour)
	for _, s := range steps {
		if s.lo < 0 || s.hi < s.lo || s.start < 0 || s.end < s.start {
			t.Errorf("step %+v: want 0 ≤ lo ≤ hi and 0 ≤ start ≤ end", s)
		}
	}
	if got := steps[3]; got.hi != math.MaxInt64 || got.end != math.MaxInt64 {
		t.Errorf("last step = %+v, want hi and end saturated at %v", got, time.Duration(math.MaxInt64))
	}
}

func TestHedgeSchedule(t *testing.T) {
	got := hedgeSchedule(100*ms, 3, 250*ms)
	want := []step{
		{attempt: 1, start: 0, end: 250 * ms},
		{attempt: 2, lo: 100 * ms, hi: 100 * ms, start: 100 * ms, end: 350 * ms},
		{attempt: 3, lo: 100 * ms, hi: 100 * ms, start: 200 * ms, end: 450 * ms},
	}
	if !slices.Equal(got, want) {
		t.Errorf("hedgeSchedule(100ms, 3, 250ms) = %+v, want %+v", got, want)
	}
}

// TestPositions pins that entries without a name (absent or null), which
// Parse skips, keep their place in the document's numbering.
func TestPositions(t *testing.T) {
	tests := []struct {
		name        string
		doc         string
		kept        int
		wantPos     []int
		wantEntries int
	}{
		{"none skipped", `{"methodConfig": [{"name": [{}]}, {"name": []}]}`, 2, []int{0, 1}, 2},
		{"absent and null names", `{"methodConfig": [{"timeout": "1s"}, {"name": [{}]}, {"name": null}]}`, 1, []int{1}, 3},
		{"keys in any case", `{"MethodConfig": [{"NAME": [{}]}]}`, 1, []int{0}, 1},
		{"no methodConfig", `{}`, 0, nil, 0},
		{"disagreement gives up", `{"methodConfig": [{"name": [{}]}]}`, 2, nil, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pos, entries := positions([]byte(tt.doc), tt.kept)
			if !slices.Equal(pos, tt.wantPos) || entries != tt.wantEntries {
				t.Errorf("positions(%s, %d) = %v, %d, want %v, %d", tt.doc, tt.kept, pos, entries, tt.wantPos, tt.wantEntries)
			}
		})
	}
}

// TestResolveLevels pins the level explain reports, including a name whose
// method holds a slash, which grpc-go files as a service-level key.
func TestResolveLevels(t *testing.T) {
	doc := []byte(`{"methodConfig": [
	  {"name": [{"service": "a.S", "method": "M"}]},
	  {"name": [{"service": "a.S"}]},
	  {"name": [{"service": "b.S", "method": "X"}, {}]}
	]}`)
	d, err := load(doc, options{maxAttemptsCap: 5})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		method   string
		entry    int
		level    int
		shadowed []int
	}{
		{"/a.S/M", 0, levelExact, []int{1, 2}},
		{"/a.S/N", 1, levelService, []int{2}},
		{"/c.S/M", 2, levelDefault, nil},
		{"/b.S/X", 2, levelExact, nil},
	}
	for _, tt := range tests {
		r := d.resolve(tt.method)
		if !r.found || r.entry != tt.entry || r.level != tt.level || !slices.Equal(r.shadowed, tt.shadowed) {
			t.Errorf("resolve(%q) = entry %d, level %d, shadowed %v (found %v), want %d, %d, %v",
				tt.method, r.entry, r.level, r.shadowed, r.found, tt.entry, tt.level, tt.shadowed)
		}
	}
}
