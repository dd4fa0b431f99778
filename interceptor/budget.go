package interceptor

import (
	"fmt"
	"time"

	"github.com/grpc-resilience/resilience/internal/budget"
	"github.com/grpc-resilience/resilience/internal/throttle"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// stormControl is a client's shared retry limits under one config, which
// keep retries from becoming a storm: the retry budget and gRFC A6's
// retryThrottling. Both are shared by every method.
type stormControl struct {
	budgetCfg   *serviceconfig.RetryBudget
	budget      *budget.Budget // nil: off
	throttleCfg *serviceconfig.RetryThrottling
	throttle    *throttle.Throttle // nil: off
}

// newBudget builds the budget of block b; a zero budget (b.Zero) pays for
// no retry and no hedged copy.
func newBudget(b *serviceconfig.RetryBudget, now time.Time) (*budget.Budget, error) {
	cfg := budget.DefaultConfig()
	switch {
	case b.Zero:
		cfg.Ratio, cfg.MinRetriesPerSecond = 0, 0
	default:
		if b.Ratio > 0 {
			cfg.Ratio = b.Ratio
		}
		if b.MinRetriesPerSecond > 0 {
			cfg.MinRetriesPerSecond = b.MinRetriesPerSecond
		}
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
