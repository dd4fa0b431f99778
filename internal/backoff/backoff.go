package backoff

import (
	"math"
	"time"
)

// Jitter selects the randomization of a delay.
type Jitter uint8

// The jitters; see the package documentation for their formulas.
const (
	A6 Jitter = iota
	Full
	Equal
	Decorrelated
	None
)

// JitterNamed returns the jitter a service config names: "a6" (and "" for
// the default), "full", "equal", "decorrelated" or "none"; ok is false for
// any other name, which then reads as A6.
func JitterNamed(name string) (j Jitter, ok bool) {
	switch name {
	case "", "a6":
		return A6, true
	case "full":
		return Full, true
	case "equal":
		return Equal, true
	case "decorrelated":
		return Decorrelated, true
	case "none":
		return None, true
	}
	return A6, false
}

// Config is a normalized backoff configuration: Initial > 0, Max ≥ Initial
// is not required, Multiplier > 0.
type Config struct {
	Initial    time.Duration
	Max        time.Duration
	Multiplier float64
	Jitter     Jitter
}

// Exponential returns d(n) = min(Initial × Multiplier^n, Max), without jitter.
func (c Config) Exponential(n int) time.Duration {
	f := float64(c.Initial) * math.Pow(c.Multiplier, float64(n))
	if f > float64(c.Max) || math.IsNaN(f) {
		return c.Max
	}
	return toDuration(f)
}

// Delay returns the delay before retry n (0 for the first retry since the
// last reset), given the previous delay prev (0 when there was none since the
// reset) and r in [0, 1).
func (c Config) Delay(n int, prev time.Duration, r float64) time.Duration {
	if c.Jitter == Decorrelated {
		if prev <= 0 {
			prev = c.Initial
		}
		upper := 3 * float64(prev)
		f := float64(c.Initial) + r*(upper-float64(c.Initial))
		if f > float64(c.Max) {
			return c.Max
		}
		return toDuration(f)
	}
	d := float64(c.Exponential(n))
	switch c.Jitter {
	case A6:
		d *= 0.8 + 0.4*r
	case Full:
		d *= r
	case Equal:
		d = d/2 + d/2*r
	}
	return toDuration(d)
}

// maxDuration is the longest time.Duration.
const maxDuration = time.Duration(math.MaxInt64)

// toDuration converts nanoseconds to a Duration, saturating at the longest
// one instead of wrapping around to a negative delay.
func toDuration(f float64) time.Duration {
	if f >= float64(maxDuration) {
		return maxDuration
	}
	return time.Duration(f)
}

// Bounds returns the smallest and largest delay Delay can return for retry n,
// given the previous delay prev (for Decorrelated; 0 at first).
func (c Config) Bounds(n int, prev time.Duration) (lo, hi time.Duration) {
	return c.Delay(n, prev, 0), c.Delay(n, prev, 1)
}
