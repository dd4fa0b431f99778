package breaker

import (
	"errors"
	"math"
	"strconv"
	"time"
)

// The defaults New gives zero fields of a Config. They match the documented
// defaults of serviceconfig.CircuitBreaker.
const (
	DefaultMinimumCalls   = 20
	DefaultWindow         = 10 * time.Second
	DefaultOpenDuration   = 5 * time.Second
	DefaultHalfOpenProbes = 1
)

// The trip conditions serviceconfig.CircuitBreaker turns on when neither
// ConsecutiveFailures nor FailureRateThreshold is set. In a Config a zero
// turns the condition off; whoever converts a serviceconfig block applies
// this rule.
const (
	DefaultConsecutiveFailures  = 5
	DefaultFailureRateThreshold = 0.5
)

// numBuckets is the number of buckets of the rolling window.
const numBuckets = 10

// maxCount bounds the integer fields so that counts and sums stay far from
// overflow.
const maxCount = math.MaxInt32

// Config is the normalized configuration of one Breaker. A zero trip field
// turns that trip condition off; a zero field among the others means its
// documented default. With every trip condition off the breaker never trips
// by itself and only ForceOpen opens it.
type Config struct {
	// ConsecutiveFailures trips the breaker after that many failures in a
	// row, in Closed. 0 is off.
	ConsecutiveFailures int

	// FailureRateThreshold trips the breaker when failures/calls over Window
	// reach it (≥), once MinimumCalls calls were seen in Window; in [0, 1].
	// 0 is off.
	FailureRateThreshold float64

	// SlowCallDuration marks a call whose duration is above it as slow,
	// whether it succeeded or failed. 0 turns slow-call tripping off.
	SlowCallDuration time.Duration

	// SlowCallRateThreshold trips the breaker when slow/calls over Window
	// reach it (≥), once MinimumCalls calls were seen in Window; in [0, 1].
	// 0 means 1. Ignored when SlowCallDuration is 0.
	SlowCallRateThreshold float64

	// MinimumCalls is the number of calls that must be in Window before a
	// rate can trip the breaker. 0 means DefaultMinimumCalls (20).
	MinimumCalls int

	// Window is the span of the rolling window of the rates. 0 means
	// DefaultWindow (10s). It must be at least 10ns (one per bucket).
	Window time.Duration

	// OpenDuration is how long the breaker stays open after a trip from
	// Closed. 0 means DefaultOpenDuration (5s).
	OpenDuration time.Duration

	// MaxOpenDuration caps the open time, which doubles on each trip from
	// HalfOpen; it is at least OpenDuration. 0 means OpenDuration (no
	// growth).
	MaxOpenDuration time.Duration

	// HalfOpenProbes is how many attempts HalfOpen lets through at once, and
	// how many successes close the breaker. 0 means DefaultHalfOpenProbes
	// (1).
	HalfOpenProbes int

	// OnStateChange, when set, is called after every change of state, with
	// the states before and after, once the change is published (Allow and
	// Snapshot see it) and with no lock held, so it may call the breaker.
	// The changes of one breaker are reported one at a time, in the order
	// they happened, each call's from being the last call's to: by the
	// goroutine whose call (Allow, Record, ForceOpen, ForceClosed or Reset)
	// caused a change and found no other goroutine reporting, which reports
	// the changes queued meanwhile too, those its own hook caused included
	// (after that hook returns). A goroutine whose change another reports
	// returns without waiting for it. A hook that panics (or calls
	// runtime.Goexit) in an Allow that admitted a half-open probe (the
	// Allow that turned the breaker HalfOpen reports that change itself)
	// ends that Allow with the probe given back, and the panic goes on.
	OnStateChange func(from, to State)
}

// Validate reports the first field of c that is out of range. Zero fields
// are valid: they mean off or a default.
func (c Config) Validate() error {
	switch {
	case c.ConsecutiveFailures < 0 || c.ConsecutiveFailures > maxCount:
		return configError("ConsecutiveFailures", strconv.Itoa(c.ConsecutiveFailures), "must be in [0, 2147483647]")
	case !(c.FailureRateThreshold >= 0 && c.FailureRateThreshold <= 1):
		return configError("FailureRateThreshold", formatFloat(c.FailureRateThreshold), "must be in [0, 1]")
	case c.SlowCallDuration < 0:
		return configError("SlowCallDuration", c.SlowCallDuration.String(), "must not be negative")
	case !(c.SlowCallRateThreshold >= 0 && c.SlowCallRateThreshold <= 1):
		return configError("SlowCallRateThreshold", formatFloat(c.SlowCallRateThreshold), "must be in [0, 1]")
	case c.MinimumCalls < 0 || c.MinimumCalls > maxCount:
		return configError("MinimumCalls", strconv.Itoa(c.MinimumCalls), "must be in [0, 2147483647]")
	case c.Window < 0 || (c.Window > 0 && c.Window < numBuckets):
		return configError("Window", c.Window.String(), "must be 0 or at least 10ns")
	case c.OpenDuration < 0:
		return configError("OpenDuration", c.OpenDuration.String(), "must not be negative")
	case c.MaxOpenDuration < 0:
		return configError("MaxOpenDuration", c.MaxOpenDuration.String(), "must not be negative")
	case c.MaxOpenDuration > 0 && c.MaxOpenDuration < c.openDuration():
		return configError("MaxOpenDuration", c.MaxOpenDuration.String(), "must not be less than OpenDuration ("+c.openDuration().String()+")")
	case c.HalfOpenProbes < 0 || c.HalfOpenProbes > maxCount:
		return configError("HalfOpenProbes", strconv.Itoa(c.HalfOpenProbes), "must be in [0, 2147483647]")
	}
	return nil
}

// normalized returns c with every default resolved. c must be valid.
func (c Config) normalized() Config {
	if c.SlowCallRateThreshold == 0 {
		c.SlowCallRateThreshold = 1
	}
	if c.MinimumCalls == 0 {
		c.MinimumCalls = DefaultMinimumCalls
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	c.OpenDuration = c.openDuration()
	if c.MaxOpenDuration == 0 {
		c.MaxOpenDuration = c.OpenDuration
	}
	if c.HalfOpenProbes == 0 {
		c.HalfOpenProbes = DefaultHalfOpenProbes
	}
	return c
}

func (c Config) openDuration() time.Duration {
	if c.OpenDuration == 0 {
		return DefaultOpenDuration
	}
	return c.OpenDuration
}

func configError(field, value, msg string) error {
	return errors.New("breaker: Config." + field + " = " + value + ": " + msg)
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
