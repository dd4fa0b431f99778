package deadline

import (
	"math"
	"testing"
	"time"
)

// t0 is the instant every table below is written against.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const ms = time.Millisecond

func at(d time.Duration) time.Time { return t0.Add(d) }

var none time.Time

func TestRemaining(t *testing.T) {
	tests := []struct {
		name     string
		deadline time.Time
		now      time.Time
		want     time.Duration
		wantOK   bool
	}{
		{"no deadline", none, t0, 0, false},
		{"time left", at(100 * ms), t0, 100 * ms, true},
		{"exactly at the deadline", t0, t0, 0, true},
		{"already past", at(-30 * ms), t0, -30 * ms, true},
		{"one nanosecond left", at(1), t0, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := Remaining(tt.deadline, tt.now)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("Remaining(%v, %v) = %v, %v, want %v, %v", tt.deadline, tt.now, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestEarliest(t *testing.T) {
	tests := []struct {
		name string
		a, b time.Time
		want time.Time
	}{
		{"neither", none, none, none},
		{"only a", at(ms), none, at(ms)},
		{"only b", none, at(ms), at(ms)},
		{"a earlier", at(ms), at(2 * ms), at(ms)},
		{"b earlier", at(2 * ms), at(ms), at(ms)},
		{"equal", at(ms), at(ms), at(ms)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Earliest(tt.a, tt.b); !got.Equal(tt.want) {
				t.Errorf("Earliest(%v, %v) = %v, want %v", tt.a, tt.b, got, tt.want)
			}
		})
	}
}

func TestAttemptTimeout(t *testing.T) {
	tests := []struct {
		name       string
		deadline   time.Time
		perAttempt time.Duration
		headroom   time.Duration
		want       time.Duration
		wantOK     bool
	}{
		{"no deadline, no per-attempt timeout", none, 0, 5 * ms, 0, false},
		{"no deadline, negative per-attempt means none", none, -ms, 0, 0, false},
		{"no deadline, per-attempt timeout", none, 50 * ms, 5 * ms, 50 * ms, true},
		{"per-attempt shorter than remaining", at(100 * ms), 50 * ms, 5 * ms, 50 * ms, true},
		{"remaining minus headroom shorter", at(100 * ms), 500 * ms, 5 * ms, 95 * ms, true},
		{"per-attempt equal to remaining minus headroom", at(100 * ms), 95 * ms, 5 * ms, 95 * ms, true},
		{"no per-attempt timeout", at(100 * ms), 0, 5 * ms, 95 * ms, true},
		{"zero headroom", at(100 * ms), 0, 0, 100 * ms, true},
		{"negative headroom counts as zero", at(100 * ms), 0, -5 * ms, 100 * ms, true},
		{"remaining exactly the headroom", at(5 * ms), 50 * ms, 5 * ms, 0, true},
		{"remaining one nanosecond over the headroom", at(5*ms + 1), 50 * ms, 5 * ms, 1, true},
		{"remaining less than headroom", at(3 * ms), 50 * ms, 5 * ms, 0, true},
		{"exactly at the deadline", t0, 50 * ms, 0, 0, true},
		{"already past", at(-10 * ms), 50 * ms, 0, 0, true},
		{"far past does not overflow", time.Unix(0, 0), 0, math.MaxInt64, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := AttemptTimeout(tt.deadline, t0, tt.perAttempt, tt.headroom)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("AttemptTimeout(%v, %v, %v, %v) = %v, %v, want %v, %v",
					tt.deadline, t0, tt.perAttempt, tt.headroom, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestFit(t *testing.T) {
	tests := []struct {
		name     string
		deadline time.Time
		delay    time.Duration
		estimate time.Duration
		headroom time.Duration
		want     Verdict
	}{
		{"no deadline", none, time.Hour, time.Hour, time.Hour, NoDeadline},
		{"fits with room to spare", at(100 * ms), 20 * ms, 30 * ms, 5 * ms, Fits},
		{"fits exactly", at(100 * ms), 20 * ms, 75 * ms, 5 * ms, Fits},
		{"one nanosecond too long", at(100 * ms), 20 * ms, 75*ms + 1, 5 * ms, TooShort},
		{"delay alone too long", at(100 * ms), 200 * ms, 0, 0, TooShort},
		{"the issue's case: 20 ms left, 30 ms attempt", at(20 * ms), 0, 30 * ms, 0, TooShort},
		{"first attempt, zero delay and estimate", at(1), 0, 0, 0, Fits},
		{"headroom eats the rest", at(5 * ms), 0, 0, 5 * ms, Fits},
		{"headroom exceeds the rest", at(5 * ms), 0, 1, 5 * ms, TooShort},
		{"negative inputs count as zero", at(10 * ms), -time.Hour, -time.Hour, -time.Hour, Fits},
		{"exactly at the deadline", t0, 0, 0, 0, Expired},
		{"already past", at(-ms), 0, 0, 0, Expired},
		{"huge inputs do not overflow", at(ms), math.MaxInt64, math.MaxInt64, math.MaxInt64, TooShort},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Fit(tt.deadline, t0, tt.delay, tt.estimate, tt.headroom)
			if got != tt.want {
				t.Errorf("Fit(%v, %v, %v, %v, %v) = %v, want %v",
					tt.deadline, t0, tt.delay, tt.estimate, tt.headroom, got, tt.want)
			}
		})
	}
}

func TestVerdict(t *testing.T) {
	tests := []struct {
		v      Verdict
		want   string
		wantOK bool
	}{
		{0, "Verdict(0)", false},
		{NoDeadline, "no deadline", true},
		{Fits, "fits", true},
		{TooShort, "too short", false},
		{Expired, "expired", false},
		{9, "Verdict(9)", false},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.v.String(); got != tt.want {
				t.Errorf("Verdict(%d).String() = %q, want %q", uint8(tt.v), got, tt.want)
			}
			if got := tt.v.OK(); got != tt.wantOK {
				t.Errorf("%v.OK() = %v, want %v", tt.v, got, tt.wantOK)
			}
		})
	}
}

func TestHandlerDeadline(t *testing.T) {
	tests := []struct {
		name       string
		incoming   time.Time
		headroom   time.Duration
		floor      time.Duration
		want       time.Time
		wantReject bool
	}{
		{"no incoming deadline", none, 10 * ms, 20 * ms, none, false},
		{"plenty of time", at(100 * ms), 10 * ms, 20 * ms, at(90 * ms), false},
		{"remaining exactly the floor", at(20 * ms), 10 * ms, 20 * ms, at(10 * ms), false},
		{"one nanosecond under the floor", at(20*ms - 1), 10 * ms, 20 * ms, at(10*ms - 1), true},
		{"zero headroom and floor", at(ms), 0, 0, at(ms), false},
		{"remaining exactly the headroom, floor below it", at(10 * ms), 10 * ms, 5 * ms, t0, true},
		{"remaining just over the headroom", at(10*ms + 1), 10 * ms, 5 * ms, at(1), false},
		{"exactly at the deadline", t0, 0, 0, t0, true},
		{"already past", at(-ms), 0, 0, at(-ms), true},
		{"negative headroom and floor count as zero", at(ms), -ms, -ms, at(ms), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, reject := HandlerDeadline(tt.incoming, t0, tt.headroom, tt.floor)
			if !got.Equal(tt.want) || reject != tt.wantReject {
				t.Errorf("HandlerDeadline(%v, %v, %v, %v) = %v, %v, want %v, %v",
					tt.incoming, t0, tt.headroom, tt.floor, got, reject, tt.want, tt.wantReject)
			}
		})
	}
}

// TestDeadlineMathAllocatesNothing: its name holds "Allocat", so that
// CI's allocation pass (without -race) runs it.
func TestDeadlineMathAllocatesNothing(t *testing.T) {
	d := at(100 * ms)
	if n := testing.AllocsPerRun(100, func() {
		_, _ = Remaining(d, t0)
		_, _ = AttemptTimeout(d, t0, 50*ms, 5*ms)
		_ = Fit(d, t0, 10*ms, 20*ms, 5*ms)
		_, _ = HandlerDeadline(d, t0, 5*ms, 10*ms)
	}); n != 0 {
		t.Errorf("allocations per run = %v, want 0", n)
	}
}
