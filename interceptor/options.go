package interceptor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/grpc-resilience/resilience/interceptor/internal/rpcname"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The client's settings. Every ClientOption constructor is in this file (the
// per-call options, grpc.CallOption, are in calloptions.go), in the order a
// reader looks for them: what is retried (WithServiceConfig,
// WithMethodConfig, WithRetryPolicy, WithMaxAttemptsCap,
// WithMaxServerPushback, WithStreamReplayBuffer, WithIdempotentMethods);
// retry storms and deadlines (WithRetryBudget, WithOneLayerRetry,
// WithDeadlineHeadroom, WithAttemptEstimateFloor); breakers and bulkheads
// (WithExemptMethods, WithFallback); idempotency keys (WithIdempotencyKeys,
// WithAutomaticIdempotencyKeys); randomness (WithRandSource); what the
// client reports (WithMeterProvider, WithOnRetry, WithOnStop,
// WithOnStateChange, WithLogger). The options' internals come last.

// ClientOption configures a Client (NewClient).
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

// DefaultExemptServices are the services whose methods are never broken or
// limited unless WithExemptMethods says otherwise: health checks and
// reflection must answer when all else fails.
var DefaultExemptServices = slices.Clone(rpcname.ExemptServices)

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
	exemptSet      bool     // WithExemptMethods was given
	logger         *slog.Logger
	warnings       []string // of the configs WithServiceConfig gave, logged by NewClient
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
		if err := checkBlocks("WithServiceConfig", cfg); err != nil {
			o.errs = append(o.errs, err)
			return
		}
		o.add("WithServiceConfig", cfg.MaxAttemptsCap(), cfg.MethodConfig...)
		o.warnings = append(o.warnings, parseWarnings("WithServiceConfig", cfg)...)
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

// WithRetryPolicy retries the methods named by names with p: full methods
// ("/pkg.Service/Method") or services ("pkg.Service"). Without names, p is
// the default policy of every method that has no entry of its own. p must
// not be nil: to run some methods without retries under a default policy,
// give them an entry without one (WithMethodConfig).
func WithRetryPolicy(p *serviceconfig.RetryPolicy, names ...string) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if p == nil {
			// An entry without a policy: no retries for the names, and
			// nothing at all without names; most likely a policy never set.
			o.errorf("WithRetryPolicy: nil policy (to run methods without retries, " +
				"give them an entry without a retryPolicy: WithMethodConfig)")
			return
		}
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

// WithRetryBudget sets the client's retry budget, used when the service
// config has no retryBudget block. It is on by default with the defaults of
// serviceconfig.RetryBudget; nil turns it off.
func WithRetryBudget(b *serviceconfig.RetryBudget) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if b != nil {
			if err := b.Validate(); err != nil {
				o.errorf("WithRetryBudget: %v", goError(err))
				return
			}
		}
		o.budget = b
	})
}

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

// WithExemptMethods replaces the methods that are never broken or limited,
// DefaultExemptServices by default: full methods ("/pkg.Service/Method") or
// services ("pkg.Service"). With no names, nothing is exempt.
func WithExemptMethods(names ...string) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		for _, n := range names {
			if _, err := rpcname.Parse(n); err != nil {
				o.errorf("WithExemptMethods: %v", err)
				return
			}
		}
		o.exempt = append([]string{}, names...)
		o.exemptSet = true
	})
}

// Fallback answers a unary call that the client rejected locally (an open
// breaker or a full bulkhead; rejection is a *RejectedError): it may fill
// reply and return nil, or return an error for the call. It runs on the
// calling goroutine.
type Fallback func(ctx context.Context, fullMethod string, req, reply any, rejection error) error

// WithFallback answers the rejected unary calls of the methods named (full
// methods or services; none means every method) with f instead of an error.
// Streams are not covered: their rejection is returned as is.
func WithFallback(f Fallback, names ...string) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if f == nil {
			o.errorf("WithFallback: nil function")
			return
		}
		for _, n := range names {
			if _, err := rpcname.Parse(n); err != nil {
				o.errorf("WithFallback: %v", err)
				return
			}
		}
		o.fallbacks = append(o.fallbacks, fallbackEntry{f: f, names: names})
	})
}

// WithIdempotencyKeys attaches a fresh random key (128 bits, hex) to every
// logical unary call of the methods named, full methods
// ("/pkg.Service/Method") or services ("pkg.Service"), and keeps it across
// all the call's retries. Streams get no key: a server's idempotency runs
// a stream once per call, whatever its key. A streaming method named
// exactly is refused; a service with streaming methods is logged, naming
// them.
// A keyed call is safe to retry even when its method has side effects, so
// the default retry rules treat it as idempotent: ABORTED and
// DEADLINE_EXCEEDED are retried too (the latter while the caller's own
// deadline holds). Without names it keys nothing, unlike WithFallback
// without names, and says so in the client's log: WithAutomaticIdempotencyKeys
// keys every method.
func WithIdempotencyKeys(names ...string) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if len(names) == 0 {
			// Legal (an empty list from a config), but likely meant as
			// "every method", as WithFallback without names is.
			o.warnings = append(o.warnings, "interceptor: WithIdempotencyKeys without names: no method gets keys "+
				"(WithAutomaticIdempotencyKeys keys every method not known to be idempotent)")
		}
		for _, n := range names {
			if _, err := rpcname.Parse(n); err != nil {
				o.errorf("WithIdempotencyKeys: %v", err)
				return
			}
		}
		o.keyed = append(o.keyed, names...)
	})
}

// WithAutomaticIdempotencyKeys attaches keys, as WithIdempotencyKeys does,
// to the unary calls of every method not known to be idempotent: every
// method whose proto does not declare idempotency_level IDEMPOTENT or
// NO_SIDE_EFFECTS and that WithIdempotentMethods does not name. Streams get
// no key.
func WithAutomaticIdempotencyKeys() ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.autoKeys = true })
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

// WithMeterProvider records the client's metrics with mp: gRFC A96's
// grpc.client.call.retries, grpc.client.call.hedges and
// grpc.client.call.retry_delay, and this library's own under
// "resilience.client." (attempts by status, retries, stops by reason,
// local rejections, budget and throttle denials, deadline skips, breaker
// transitions and state, bulkhead occupancy, the retry budget's balance).
// The package documentation has the full table.
//
// grpc.method follows gRFC A66 on every instrument: the method's name for
// calls of a generated stub (grpc.StaticMethod), "other" for the rest (a
// proxy's calls, conn.Invoke with a name from elsewhere); the gauges and
// breaker transitions name a method once a generated stub called it or
// while a config entry names it exactly, and report the others together as
// "other". So the labels are bounded by the code and the config, never by
// callers. Attribute sets are built once per named method (and per target,
// for grpc.target), so recording allocates nothing on the success path.
// Without this option nothing is recorded, at no cost.
func WithMeterProvider(mp metric.MeterProvider) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if mp == nil {
			o.errorf("WithMeterProvider: nil provider")
			return
		}
		o.meterProvider = mp
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

// WithOnStateChange calls f on every state change of any method's breaker,
// once the change is published, with no lock of the client's held: f may
// call any method of the Client. The changes of one method are reported one
// at a time, in the order they happened, by the goroutine whose call made
// one and found none being reported (it reports those made meanwhile too);
// a change f itself makes (a ForceOpen) is reported after f returns. f must
// not block.
func WithOnStateChange(f func(fullMethod string, from, to BreakerState)) ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.onStateChange = f })
}

// WithLogger sets the logger of the Client's warnings: what it accepts but
// cannot be sure of (a name no code linked into the program registers, a
// resolver's config with a typo grpc-go applies anyway, each warning of a
// parsed config it is given), and the names Status and HedgingDelay cannot
// read. Each text is logged once, at level Warn. By default they go to
// slog.Default(), as it is when each is logged; not to grpclog, whose
// default logger discards warnings.
func WithLogger(l *slog.Logger) ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.logger = l })
}

// add appends mcs, given by option, to the client's method config;
// parsedCap is the cap Parse applied to them, 0 when built in Go.
func (o *clientOptions) add(option string, parsedCap int, mcs ...serviceconfig.MethodConfig) {
	for i := range mcs {
		o.origins = append(o.origins, entryOrigin{option: option, index: i, parsedCap: parsedCap})
	}
	o.config.MethodConfig = append(o.config.MethodConfig, mcs...)
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

type fallbackEntry struct {
	f     Fallback
	names []string // empty: every method
}
