package deadline

import (
	"math"
	"strconv"
	"time"
)

// Remaining returns the time left at now before deadline, and true; it is
// negative once the deadline has passed. With no deadline (deadline.IsZero())
// it returns 0 and false.
func Remaining(deadline, now time.Time) (time.Duration, bool) {
	if deadline.IsZero() {
		return 0, false
	}
	return deadline.Sub(now), true
}

// Earliest returns the earlier of two deadlines, where a zero time means no
// deadline: the call's effective deadline is Earliest(the caller's, now +
// the configured timeout). It returns the zero time when neither is set.
func Earliest(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero(), a.Before(b):
		return a
	default:
		return b
	}
}

// AttemptTimeout returns how long the next attempt may run:
//
//	min(perAttempt, remaining − headroom)
//
// and true; perAttempt ≤ 0 means no per-attempt timeout. A result of 0 and
// true means no time is left for an attempt (remaining ≤ headroom): the
// attempt must not start. With no deadline and no per-attempt timeout nothing
// bounds the attempt, and it returns 0 and false. A negative headroom counts
// as zero.
func AttemptTimeout(deadline, now time.Time, perAttempt, headroom time.Duration) (time.Duration, bool) {
	if deadline.IsZero() {
		if perAttempt > 0 {
			return perAttempt, true
		}
		return 0, false
	}
	headroom = max(headroom, 0)
	remaining := deadline.Sub(now)
	if remaining <= headroom {
		return 0, true
	}
	left := remaining - headroom
	if perAttempt > 0 && perAttempt < left {
		return perAttempt, true
	}
	return left, true
}

// A Verdict says whether a backoff delay and the attempt after it fit before
// a deadline, and if not, why. The zero Verdict is invalid.
type Verdict uint8

const (
	// NoDeadline: there is no deadline, so anything fits.
	NoDeadline Verdict = iota + 1
	// Fits: delay + estimate ≤ remaining − headroom.
	Fits
	// TooShort: time remains, but less than delay + estimate + headroom.
	TooShort
	// Expired: the deadline has been reached (remaining ≤ 0).
	Expired
)

// OK reports whether the attempt may go ahead: v is NoDeadline or Fits.
func (v Verdict) OK() bool { return v == NoDeadline || v == Fits }

// String returns the verdict in words, such as "too short".
func (v Verdict) String() string {
	switch v {
	case NoDeadline:
		return "no deadline"
	case Fits:
		return "fits"
	case TooShort:
		return "too short"
	case Expired:
		return "expired"
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}

// Fit reports whether an attempt that starts after delay and is expected to
// take estimate can finish before deadline while keeping headroom:
//
//	delay + estimate ≤ remaining − headroom
//
// Equality fits. Negative delay, estimate and headroom count as zero. The
// client asks before every backoff (and before the first attempt, with delay
// 0); on a verdict that is not OK it ends the call at once with the last
// attempt's error, or DEADLINE_EXCEEDED when no attempt ran.
func Fit(deadline, now time.Time, delay, estimate, headroom time.Duration) Verdict {
	if deadline.IsZero() {
		return NoDeadline
	}
	remaining := deadline.Sub(now)
	if remaining <= 0 {
		return Expired
	}
	need := addSat(addSat(max(delay, 0), max(estimate, 0)), max(headroom, 0))
	if need <= remaining {
		return Fits
	}
	return TooShort
}

// HandlerDeadline returns the deadline a server gives its handler for a
// request that arrived with deadline incoming: incoming − headroom, so that
// the handler's outgoing calls leave the server headroom to finish. reject is
// true when the request should be refused at once: it has less than floor
// left (remaining < floor), or no time left once the headroom is taken
// (remaining ≤ headroom). A remaining time exactly equal to floor is accepted.
// With no incoming deadline it returns the zero time (none) and false.
// Negative headroom and floor count as zero.
func HandlerDeadline(incoming, now time.Time, headroom, floor time.Duration) (handler time.Time, reject bool) {
	if incoming.IsZero() {
		return time.Time{}, false
	}
	headroom = max(headroom, 0)
	remaining := incoming.Sub(now)
	return incoming.Add(-headroom), remaining < floor || remaining <= headroom
}

// addSat returns a + b for non-negative a and b, saturating instead of
// overflowing.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
