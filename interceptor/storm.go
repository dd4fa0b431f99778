package interceptor

import (
	"fmt"
	"time"

	"github.com/grpc-resilience/resilience/internal/budget"
	"github.com/grpc-resilience/resilience/internal/latency"
	"github.com/grpc-resilience/resilience/internal/throttle"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// WithOneLayerRetry makes the client one layer of a call chain that retries
// at one layer only, so retries do not multiply across hops (A retrying
// 3 times into B retrying 3 times into C is 9 attempts on C). Calls this
// client may retry carry wire.CallerRetriesKey; and in a handler whose caller
// retries (wire.CallerRetries), the client makes at most nestedMaxAttempts
// attempts of each call: 1, the usual choice, means it does not retry at
// all.
func WithOneLayerRetry(nestedMaxAttempts int) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if nestedMaxAttempts < 1 {
			o.errorf("WithOneLayerRetry(%d): must be at least 1", nestedMaxAttempts)
			return
		}
		o.oneLayer = nestedMaxAttempts
	})
}

// WithRetryBudget sets the client's retry budget, used when the service
// config has no retryBudget block. It is on by default with the defaults of
// serviceconfig.RetryBudget; nil turns it off.
func WithRetryBudget(b *serviceconfig.RetryBudget) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if b != nil {
			if err := b.Validate(); err != nil {
				o.errorf("WithRetryBudget: %v", err)
				return
			}
		}
		o.budget = b
	})
}

// WithDeadlineHeadroom keeps d of every deadline out of the client's
// attempts: an attempt's timeout is min(per-attempt timeout, remaining − d),
// no attempt starts with d or less left, and no retry starts that cannot
// end d before the deadline. The default is 0.
func WithDeadlineHeadroom(d time.Duration) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		o.nonNegative("WithDeadlineHeadroom", d, &o.headroom)
	})
}

// WithAttemptEstimateFloor sets the smallest duration the client assumes an
// attempt takes when it decides whether a retry fits in the deadline. Above
// it, the estimate follows each method's recent latencies (a running p90).
// The default is 0.
func WithAttemptEstimateFloor(d time.Duration) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		o.nonNegative("WithAttemptEstimateFloor", d, &o.estimateFloor)
	})
}

// budgetRatio returns the ratio of the retry budget in force (its default
// when the block leaves it 0), or 0 without a budget.
func (sc *stormControl) budgetRatio() float64 {
	switch {
	case sc.budget == nil:
		return 0
	case sc.budgetCfg.Ratio > 0:
		return sc.budgetCfg.Ratio
	}
	return budget.DefaultConfig().Ratio
}

// stormControl is a client's shared retry limits under one config.
type stormControl struct {
	budgetCfg   *serviceconfig.RetryBudget
	budget      *budget.Budget // nil: off
	throttleCfg *serviceconfig.RetryThrottling
	throttle    *throttle.Throttle // nil: off
}

func newBudget(b *serviceconfig.RetryBudget, now time.Time) (*budget.Budget, error) {
	cfg := budget.DefaultConfig()
	if b.Ratio > 0 {
		cfg.Ratio = b.Ratio
	}
	if b.MinRetriesPerSecond > 0 {
		cfg.MinRetriesPerSecond = b.MinRetriesPerSecond
	}
	if b.TTL > 0 {
		cfg.TTL = b.TTL
	}
	bg, err := budget.New(cfg, now)
	if err != nil {
		return nil, fmt.Errorf("serviceconfig: retryBudget: %w", err)
	}
	return bg, nil
}

func newThrottle(t *serviceconfig.RetryThrottling) (*throttle.Throttle, error) {
	th, err := throttle.New(throttle.Config{MaxTokens: t.MaxTokens, TokenRatio: t.TokenRatio})
	if err != nil {
		return nil, fmt.Errorf("serviceconfig: retryThrottling: %w", err)
	}
	return th, nil
}

// newStormControl builds the budget and throttle of cfg (the budget from the
// client option when cfg has none), keeping those of prev when their blocks
// are unchanged.
func newStormControl(cfg *serviceconfig.Config, opts *clientOptions, prev *clientState) (stormControl, error) {
	var sc stormControl
	var old stormControl
	if prev != nil {
		old = prev.storm
	}
	if b := cfg.RetryBudget; b != nil || opts.budget != nil {
		if b == nil {
			b = opts.budget
		}
		sc.budgetCfg = b
		if old.budgetCfg != nil && *old.budgetCfg == *b {
			sc.budget = old.budget
		} else {
			bg, err := newBudget(b, time.Now())
			if err != nil {
				return sc, err
			}
			sc.budget = bg
		}
	}
	if t := cfg.RetryThrottling; t != nil {
		sc.throttleCfg = t
		if old.throttleCfg != nil && *old.throttleCfg == *t {
			sc.throttle = old.throttle
		} else {
			th, err := newThrottle(t)
			if err != nil {
				return sc, err
			}
			sc.throttle = th
		}
	}
	return sc, nil
}

// estimatorGain is the step of the running p90 of attempt durations: a
// latency that jumps is caught within about 8 attempts (×1.31 per attempt
// above the estimate), at the price of a noisier estimate than the engine's
// default; for deciding whether a retry fits, a late estimate is worse.
const estimatorGain = 0.3

// newEstimator returns a method's attempt-duration estimator, or nil when
// it cannot be built (it can: the floor is checked by its option).
func newEstimator(floor time.Duration) *latency.Estimator {
	cfg := latency.DefaultConfig()
	cfg.Gain = estimatorGain
	cfg.Floor = floor
	e, err := latency.New(cfg)
	if err != nil {
		return nil
	}
	return e
}
