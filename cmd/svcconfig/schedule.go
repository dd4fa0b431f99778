package main

import (
	"math"
	"time"

	"github.com/grpc-resilience/resilience/internal/backoff"
)

// step is one attempt of a retry schedule.
type step struct {
	attempt int // 1 for the first call
	// lo and hi bound the delay before the attempt (0 for the first): the
	// delay is at least lo and at most hi, whatever the random draw.
	lo, hi time.Duration
	// start and end are the worst-case times, from the start of the call, at
	// which the attempt starts and ends: every delay before it at hi and
	// every attempt taking the attempt time.
	start, end time.Duration
}

// retrySchedule returns the schedule of maxAttempts attempts under b, each
// taking at most attemptTime. The delay before attempt k ≥ 2 is b's delay
// for retry n = k−2, with bounds at r = 0 and r = 1 (the supremum: r is
// drawn from [0, 1)). For decorrelated jitter, whose delay depends on the
// previous one, lo follows the shortest previous delays and hi the longest.
// Sums saturate at the largest time.Duration.
func retrySchedule(b backoff.Config, maxAttempts int, attemptTime time.Duration) []step {
	steps := make([]step, 0, max(maxAttempts, 0))
	var prevLo, prevHi, t time.Duration
	for k := 1; k <= maxAttempts; k++ {
		s := step{attempt: k}
		if k > 1 {
			n := k - 2
			s.lo = saturate(b.Delay(n, prevLo, 0))
			s.hi = saturate(b.Delay(n, prevHi, 1))
			prevLo, prevHi = s.lo, s.hi
			t = addSat(t, s.hi)
		}
		s.start = t
		t = addSat(t, attemptTime)
		s.end = t
		steps = append(steps, s)
	}
	return steps
}

// hedgeSchedule returns the schedule of maxAttempts hedged copies sent delay
// apart, each taking at most attemptTime: copy k is sent at (k−1) × delay
// unless a reply ended the call before. lo and hi are the wait since the
// copy before.
func hedgeSchedule(delay time.Duration, maxAttempts int, attemptTime time.Duration) []step {
	steps := make([]step, 0, max(maxAttempts, 0))
	var t time.Duration
	for k := 1; k <= maxAttempts; k++ {
		s := step{attempt: k, start: t, end: addSat(t, attemptTime)}
		if k > 1 {
			s.lo, s.hi = delay, delay
		}
		steps = append(steps, s)
		t = addSat(t, delay)
	}
	return steps
}

// saturate maps a delay that overflowed time.Duration (a float conversion
// past its range comes back negative) to the largest duration. A computed
// delay is never negative otherwise.
func saturate(d time.Duration) time.Duration {
	if d < 0 {
		return math.MaxInt64
	}
	return d
}

// addSat returns a + b for non-negative a and b, saturated at the largest
// time.Duration.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
