package interceptor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/grpc-resilience/resilience/interceptor/internal/rpcname"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// ClientOption configures a Client.
type ClientOption interface {
	apply(*clientOptions)
}

type clientOptionFunc func(*clientOptions)

func (f clientOptionFunc) apply(o *clientOptions) { f(o) }

// DefaultMaxServerPushback caps how long a client waits on a server's hint
// (grpc-retry-pushback-ms or RetryInfo) unless WithMaxServerPushback says
// otherwise.
const DefaultMaxServerPushback = 30 * time.Second

// DefaultStreamReplayBuffer is how many bytes of sent messages a stream keeps
// for replay before it commits.
const DefaultStreamReplayBuffer = 256 << 10

type clientOptions struct {
	config         serviceconfig.Config // code-built and WithServiceConfig entries
	origins        []entryOrigin        // where each entry of config.MethodConfig came from
	maxAttemptsCap int
	maxPushback    time.Duration
	replayBuffer   int
	rand           func() float64
	onRetry        func(context.Context, RetryEvent)
	onStateChange  func(fullMethod string, from, to BreakerState)
	exempt         []string // never broken or limited
	oneLayer       int      // > 0: one-layer retry, with this many nested attempts
	budget         *serviceconfig.RetryBudget
	headroom       time.Duration
	estimateFloor  time.Duration
	keyed          []string // methods that get idempotency keys
	meterProvider  metric.MeterProvider
	onStop         func(context.Context, StopEvent)
	autoKeys       bool // keys for every method not known idempotent
	fallbacks      []fallbackEntry
	idempotent     []string // full methods ("/pkg.S/M") or services ("pkg.S")
	errs           []error
}

func defaultClientOptions() clientOptions {
	return clientOptions{
		maxAttemptsCap: serviceconfig.DefaultMaxAttemptsCap,
		maxPushback:    DefaultMaxServerPushback,
		replayBuffer:   DefaultStreamReplayBuffer,
		rand:           rand.Float64,
		exempt:         DefaultExemptServices,
		budget:         &serviceconfig.RetryBudget{},
	}
}

func (o *clientOptions) errorf(format string, args ...any) {
	o.errs = append(o.errs, fmt.Errorf("interceptor: "+format, args...))
}

// WithServiceConfig makes cfg the client's service config: its methodConfig
// entries give each method its retry policy, timeout and wait-for-ready (and
// the extension blocks), its retryThrottling and retryBudget blocks apply to
// the whole client. Entries added with WithMethodConfig or WithRetryPolicy
// join it. A config with errors makes NewClient fail. A config from
// serviceconfig.Parse runs its MaxAttempts as parsed, even above the
// client's cap: Parse applied its own (serviceconfig.WithMaxAttemptsCap). A
// config built in Go is held to the client's cap, as WithMethodConfig is.
func WithServiceConfig(cfg *serviceconfig.Config) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if cfg == nil {
			o.errorf("WithServiceConfig: nil config")
			return
		}
		o.add("WithServiceConfig", cfg.MaxAttemptsCap(), cfg.MethodConfig...)
		if cfg.RetryThrottling != nil {
			o.config.RetryThrottling = cfg.RetryThrottling
		}
		if cfg.RetryBudget != nil {
			o.config.RetryBudget = cfg.RetryBudget
		}
	})
}

// WithMethodConfig adds method config entries, as a service config's
// methodConfig list holds them: each entry applies to the methods its Name
// list selects, the exact method before its service before the default. A
// name given twice makes NewClient fail, and so does a MaxAttempts above the
// client's cap (WithMaxAttemptsCap).
func WithMethodConfig(mcs ...serviceconfig.MethodConfig) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		o.add("WithMethodConfig", 0, mcs...)
	})
}

// entryOrigin is where an entry of a client's method config came from,
// which sets the cap its MaxAttempts is held to.
type entryOrigin struct {
	option string // the option that gave it, or "UpdateServiceConfig"
	index  int    // its index among the entries that option gave
	// parsedCap is the cap serviceconfig.Parse applied to the entry's
	// config; 0 for an entry built in Go, held to the client's cap.
	parsedCap int
}

// add appends mcs, given by option, to the client's method config;
// parsedCap is the cap Parse applied to them, 0 when built in Go.
func (o *clientOptions) add(option string, parsedCap int, mcs ...serviceconfig.MethodConfig) {
	for i := range mcs {
		o.origins = append(o.origins, entryOrigin{option: option, index: i, parsedCap: parsedCap})
	}
	o.config.MethodConfig = append(o.config.MethodConfig, mcs...)
}

// checkCaps refuses an entry of mcs whose MaxAttempts is above the cap of
// where it came from (origins[i]): the cap Parse applied to a parsed
// config's, clientCap to one built in Go. Nothing is lowered in silence: a
// Go policy asking for 8 attempts under the default cap of 5 is an error
// that names WithMaxAttemptsCap.
func checkCaps(mcs []serviceconfig.MethodConfig, origins []entryOrigin, clientCap int) error {
	for i, mc := range mcs {
		og := origins[i]
		limit, raise := clientCap, "interceptor.WithMaxAttemptsCap"
		if og.parsedCap > 0 {
			limit, raise = og.parsedCap, "serviceconfig.WithMaxAttemptsCap when parsing"
		}
		var block string
		var n int
		switch {
		case mc.RetryPolicy != nil && mc.RetryPolicy.MaxAttempts > limit:
			block, n = "retryPolicy", mc.RetryPolicy.MaxAttempts
		case mc.HedgingPolicy != nil && mc.HedgingPolicy.MaxAttempts > limit:
			block, n = "hedgingPolicy", mc.HedgingPolicy.MaxAttempts
		default:
			continue
		}
		path := fmt.Sprintf("methodConfig[%d].", og.index)
		if og.option == "WithRetryPolicy" {
			path = "" // one entry, which the caller did not write as a list
		}
		return fmt.Errorf("interceptor: %s: %s%s.maxAttempts: %d is above the cap of %d; raise the cap with %s",
			og.option, path, block, n, limit, raise)
	}
	return nil
}

// WithRetryPolicy retries the methods named by names with p: full methods
// ("/pkg.Service/Method") or services ("pkg.Service"). Without names, p is
// the default policy of every method that has no entry of its own.
func WithRetryPolicy(p *serviceconfig.RetryPolicy, names ...string) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		mc := serviceconfig.MethodConfig{RetryPolicy: p}
		if len(names) == 0 {
			mc.Name = []serviceconfig.Name{{}}
		}
		for _, n := range names {
			name, err := rpcname.Parse(n)
			if err != nil {
				o.errorf("WithRetryPolicy: %v", err)
				return
			}
			mc.Name = append(mc.Name, name)
		}
		o.add("WithRetryPolicy", 0, mc)
	})
}

// WithMaxAttemptsCap raises (or lowers) the cap on MaxAttempts, 5 by default
// as in grpc-go and gRFC A6. A policy built in Go (WithRetryPolicy,
// WithMethodConfig, a Config built in Go) that asks for more attempts makes
// NewClient (or UpdateServiceConfig) fail with an error naming this option;
// a call option asking for more (MaxAttempts) gets the cap. A config from
// serviceconfig.Parse is not capped again: Parse applied its own cap
// (serviceconfig.WithMaxAttemptsCap), and its values run as parsed. n < 2
// means 5, as grpc.WithMaxCallAttempts does.
func WithMaxAttemptsCap(n int) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if n < 2 {
			n = serviceconfig.DefaultMaxAttemptsCap
		}
		o.maxAttemptsCap = n
	})
}

// WithMaxServerPushback caps every wait a server asks for, through the
// grpc-retry-pushback-ms trailer or a google.rpc.RetryInfo detail: the client
// waits min(hint, d). The default is DefaultMaxServerPushback.
func WithMaxServerPushback(d time.Duration) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		o.nonNegative("WithMaxServerPushback", d, &o.maxPushback)
	})
}

// WithStreamReplayBuffer sets how many bytes of sent messages a stream keeps
// so that it can replay them on a new attempt; a stream that sends more
// commits to its current attempt. Each message counts its size as the
// call's codec encodes it plus grpc's 5-byte message prefix, as in grpc-go
// (a message that is not proto is encoded to be measured; see the package
// documentation, Commit). The bound applies to unary
// calls too, as grpc-go's per-call retry buffer does: a unary request
// larger than it is not retried. The default is
// DefaultStreamReplayBuffer (256 KiB); 0 commits streams at their first
// message.
func WithStreamReplayBuffer(bytes int) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if bytes < 0 {
			o.errorf("WithStreamReplayBuffer(%d): must not be negative", bytes)
			return
		}
		o.replayBuffer = bytes
	})
}

// WithIdempotentMethods declares methods idempotent, in addition to those
// whose proto declares idempotency_level IDEMPOTENT or NO_SIDE_EFFECTS: full
// methods ("/pkg.Service/Method") or whole services ("pkg.Service"). Under
// the default retry rules, ABORTED is retried only for idempotent methods.
func WithIdempotentMethods(names ...string) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		for _, n := range names {
			if _, err := rpcname.Parse(n); err != nil {
				o.errorf("WithIdempotentMethods: %v", err)
				return
			}
		}
		o.idempotent = append(o.idempotent, names...)
	})
}

// WithRandSource makes jitter draw from src instead of the runtime's random
// generator, so a seeded source gives a repeatable schedule. The client
// serializes its use of src.
func WithRandSource(src rand.Source) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if src == nil {
			o.errorf("WithRandSource: nil source")
			return
		}
		var mu sync.Mutex
		r := rand.New(src)
		o.rand = func() float64 {
			mu.Lock()
			defer mu.Unlock()
			return r.Float64()
		}
	})
}

// RetryEvent describes a retry about to happen, for WithOnRetry.
type RetryEvent struct {
	// FullMethod is the method called, "/pkg.Service/Method".
	FullMethod string
	// Attempt is the number of the attempt that failed, 1 for the first.
	Attempt int
	// Err is the error of that attempt.
	Err error
	// Delay is the wait before the next attempt.
	Delay time.Duration
	// Pushback reports whether Delay is a server's hint rather than backoff.
	Pushback bool
	// Hedge reports a hedged copy sent Delay after the one before (or at
	// once after a non-fatal failure); Err is then nil.
	Hedge bool
}

// WithOnRetry calls f before every retry's wait, synchronously on the
// calling goroutine, so callers can log what happens. f must not block.
func WithOnRetry(f func(ctx context.Context, e RetryEvent)) ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.onRetry = f })
}

// StopEvent describes a call that ran under a retry policy and ended
// without success, for WithOnStop.
type StopEvent struct {
	// FullMethod is the method called, "/pkg.Service/Method".
	FullMethod string
	// Attempts is the number of attempts that ran.
	Attempts int
	// Reason says why retrying stopped: a denied retry shows here as
	// StopBudget or StopThrottled, a local rejection as StopCircuitOpen,
	// StopBulkheadFull or StopAdaptiveThrottle.
	Reason StopReason
	// Err is the error the call returns.
	Err error
}

// WithOnStop calls f when a call under a retry policy ends without success,
// synchronously on the calling goroutine, with why retrying stopped. f must
// not block.
func WithOnStop(f func(ctx context.Context, e StopEvent)) ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.onStop = f })
}

func (o *clientOptions) err() error { return errors.Join(o.errs...) }

// nonNegative sets *dst to the duration d of the option named, or records
// an error when d is negative.
func (o *clientOptions) nonNegative(option string, d time.Duration, dst *time.Duration) {
	if d < 0 {
		o.errorf("%s(%v): must not be negative", option, d)
		return
	}
	*dst = d
}
