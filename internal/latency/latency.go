package latency

import (
	"errors"
	"math"
	"sync/atomic"
	"time"
)

// Defaults of [Config].
const (
	// DefaultQuantile is the percentile tracked: p90.
	DefaultQuantile = 0.9
	// DefaultGain is the step of the estimate in natural-log units.
	DefaultGain = 0.1
)

// Config is the normalized configuration of an [Estimator]. Every field is
// used as written; [DefaultConfig] gives the defaults.
type Config struct {
	// Quantile is the percentile tracked, in (0, 1): 0.9 is p90.
	Quantile float64
	// Gain is δ, in (0, 1]: an observation above the estimate multiplies it
	// by e^(δ·Quantile), one at or below it by e^(−δ·(1−Quantile)).
	Gain float64
	// Floor is the least estimate ever returned, and the estimate before
	// the first observation; not negative.
	Floor time.Duration
}

// DefaultConfig returns Quantile 0.9, Gain 0.1 and no floor.
func DefaultConfig() Config {
	return Config{Quantile: DefaultQuantile, Gain: DefaultGain}
}

// Validate reports the first field of c that is out of range.
func (c Config) Validate() error {
	switch {
	case !(c.Quantile > 0 && c.Quantile < 1):
		return errors.New("latency: quantile must be between 0 and 1, exclusive")
	case !(c.Gain > 0 && c.Gain <= 1):
		return errors.New("latency: gain must be greater than 0 and at most 1")
	case c.Floor < 0:
		return errors.New("latency: floor must not be negative")
	}
	return nil
}

// maxEstimate bounds the estimate so that it always converts to a
// time.Duration: 2^62 ns, about 146 years.
const maxEstimate = 1 << 62

// An Estimator tracks a high percentile of a method's attempt latencies. Use
// [New]; the zero value is not usable.
type Estimator struct {
	// bits is math.Float64bits of the estimate in nanoseconds, in
	// [1, maxEstimate]; 0 until the first observation.
	bits atomic.Uint64
	// up is e^(δ·p) and down is e^(−δ·(1−p)); both set once by New.
	up, down float64
	// floor is Config.Floor, set once by New.
	floor time.Duration
}

// New returns an Estimator with no observations, whose estimate is cfg.Floor.
func New(cfg Config) (*Estimator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Estimator{
		up:    math.Exp(cfg.Gain * cfg.Quantile),
		down:  math.Exp(-cfg.Gain * (1 - cfg.Quantile)),
		floor: cfg.Floor,
	}, nil
}

// Observe records the duration of one finished attempt. A duration below one
// nanosecond counts as one nanosecond.
//
// Observe is wait-free: one load and one compare-and-swap. When another
// goroutine moves the estimate between the two, this observation is dropped
// rather than retried; it is one sample among many, and a drop is as likely
// above the estimate as below it, so the estimate stays unbiased.
func (e *Estimator) Observe(d time.Duration) {
	x := float64(max(d, 1))
	old := e.bits.Load()
	q := math.Float64frombits(old)
	switch {
	case old == 0:
		q = x
	case x > q:
		q *= e.up
	default:
		q *= e.down
		if q < 1 {
			q = 1
		}
	}
	if q > maxEstimate {
		q = maxEstimate
	}
	e.bits.CompareAndSwap(old, math.Float64bits(q))
}

// Estimate returns the current estimate of the tracked percentile, or the
// floor if that is larger or nothing was observed yet.
func (e *Estimator) Estimate() time.Duration {
	return max(time.Duration(math.Float64frombits(e.bits.Load())), e.floor)
}
