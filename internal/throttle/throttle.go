package throttle

import (
	"errors"
	"math"
	"sync/atomic"
)

// Config is the normalized configuration of a [Throttle]: gRFC A6's
// retryThrottling block. Both fields are required; there are no defaults.
type Config struct {
	// MaxTokens is the size of the bucket and its starting count, in
	// (0, 1000], used to three decimals.
	MaxTokens float64
	// TokenRatio is what one success adds, greater than 0; digits past the
	// third decimal are ignored, and a ratio under 0.001 adds 0.001.
	TokenRatio float64
}

// Validate reports the first field of c that is out of range.
func (c Config) Validate() error {
	// Values that truncate to 0 thousandths are valid, as gRFC A6 and
	// grpc-go accept any positive number: a tokenRatio below 0.001 then adds
	// 0.001 on success, and maxTokens below 0.001 throttles every retry.
	if !(c.MaxTokens > 0 && c.MaxTokens <= 1000) {
		return errors.New("throttle: maxTokens must be greater than 0 and at most 1000")
	}
	if !(c.TokenRatio > 0 && c.TokenRatio <= math.MaxInt32) {
		return errors.New("throttle: tokenRatio must be greater than 0")
	}
	return nil
}

// milli returns x in thousandths, ignoring further digits. The small epsilon
// keeps a decimal such as 0.29, stored as 0.28999999999999998, at 290.
func milli(x float64) int64 {
	return int64(math.Floor(x*1000 + 1e-6))
}

// A Throttle is gRFC A6's per-client token bucket. Use [New]; the zero value
// is not usable.
type Throttle struct {
	// tokens is token_count in milli-tokens, always in [0, max].
	tokens atomic.Int64
	// max is MaxTokens and ratio TokenRatio, in milli-tokens; set once by New.
	max, ratio int64
}

// New returns a Throttle whose bucket is full.
func New(cfg Config) (*Throttle, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// A positive ratio never adds nothing: under 0.001 it adds 0.001.
	t := &Throttle{max: milli(cfg.MaxTokens), ratio: max(milli(cfg.TokenRatio), 1)}
	t.tokens.Store(t.max)
	return t, nil
}

// OnSuccess records a successful RPC (status OK): it adds TokenRatio, up to
// MaxTokens. Call it once per call that succeeds.
func (t *Throttle) OnSuccess() {
	for {
		old := t.tokens.Load()
		if old >= t.max {
			return
		}
		if t.tokens.CompareAndSwap(old, min(old+t.ratio, t.max)) {
			return
		}
	}
}

// OnFailure records an attempt that failed with a retryable code (or got
// pushback saying not to retry): it takes one token, down to 0. It reports
// whether a retry may follow, that is whether the count is still above
// MaxTokens / 2 after the token is taken. Call it for every such attempt,
// the last one included, whether or not a retry is wanted.
func (t *Throttle) OnFailure() (retryAllowed bool) {
	for {
		old := t.tokens.Load()
		n := max(old-1000, 0)
		if n == old || t.tokens.CompareAndSwap(old, n) {
			return 2*n > t.max
		}
	}
}

// Allow reports whether retries and hedges may be sent now: token_count >
// MaxTokens / 2. It changes nothing.
func (t *Throttle) Allow() bool {
	return 2*t.tokens.Load() > t.max
}

// Tokens returns token_count, for metrics and tests.
func (t *Throttle) Tokens() float64 {
	return float64(t.tokens.Load()) / 1000
}
