package interceptor

import (
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/internal/backoff"
	"github.com/grpc-resilience/resilience/internal/latency"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// retryPolicy is a serviceconfig.RetryPolicy with every default resolved.
type retryPolicy struct {
	maxAttempts int // ≥ 1, within the cap of where the policy came from (checkCaps)
	backoff     backoff.Config
	codes       rescodes.Set // the exact retryable codes when explicit
	explicit    bool         // codes was written out; else the default rules apply
	perAttempt  time.Duration
}

func newRetryPolicy(p *serviceconfig.RetryPolicy) *retryPolicy {
	rp := &retryPolicy{
		maxAttempts: p.MaxAttempts,
		backoff: backoff.Config{
			Initial:    p.InitialBackoff,
			Max:        p.MaxBackoff,
			Multiplier: p.BackoffMultiplier,
			Jitter:     jitterOf(p.Jitter),
		},
		codes:      rescodes.Of(p.RetryableStatusCodes...),
		explicit:   len(p.RetryableStatusCodes) > 0,
		perAttempt: p.PerAttemptRecvTimeout,
	}
	if rp.maxAttempts == 0 {
		rp.maxAttempts = serviceconfig.DefaultMaxAttempts
	}
	if rp.backoff.Initial == 0 {
		rp.backoff.Initial = serviceconfig.DefaultInitialBackoff
	}
	if rp.backoff.Max == 0 {
		rp.backoff.Max = serviceconfig.DefaultMaxBackoff
	}
	if rp.backoff.Multiplier == 0 {
		rp.backoff.Multiplier = serviceconfig.DefaultBackoffMultiplier
	}
	return rp
}

// jitterOf maps a policy's jitter to the engine's. Validate has refused
// unknown names, so the fallback to A6 is never taken.
func jitterOf(j serviceconfig.Jitter) backoff.Jitter {
	bj, _ := backoff.JitterNamed(string(j))
	return bj
}

// methodPolicy is what one method runs under, resolved once per method and
// config. It is immutable once published, but for static and mm (set once).
type methodPolicy struct {
	fullMethod   string
	retry        *retryPolicy // nil: no retry
	hedge        *hedgePolicy // nil: no hedging; never set with retry
	timeout      time.Duration
	waitForReady *bool
	idempotent   bool     // declared idempotent (proto or WithIdempotentMethods)
	keyed        bool     // calls get an idempotency key
	fallback     Fallback // answers local rejections of unary calls; nil: none
	// g, latency and tail are the method's row's (methods.go), zero or nil
	// when it has none: its guards, its attempt durations, and its hedging
	// state (hedge_delay.go).
	g       guards
	latency *latency.Estimator
	tail    *hedgeTail
	// row is the method's row when it is counted against the bound, whose
	// use the calls mark (methodRow.ref); nil otherwise.
	row *methodRow
	// static is set once a generated stub called the method
	// (grpc.StaticMethod), under this config or one before; mm holds the
	// method's metric attribute sets while it is named (its entry names it
	// exactly, or static), set before static; nil when metrics are off or
	// the method is recorded as "other" (instruments.named).
	static atomic.Bool
	mm     atomic.Pointer[methodMetrics]
	// streamNoted is set once a stream call of the method has been checked
	// against its hedging policy (Client.noteHedgedStream).
	streamNoted atomic.Bool
	// passthrough is true when nothing applies: the call goes straight to
	// the invoker.
	passthrough bool
	// early is true when a call the guards refuse at once may be refused
	// before any per-call state is built (Client.rejectEarly): the method
	// has a guard, and nothing that the full path does before its first
	// attempt changes the outcome of a rejection (hedging, a fallback, a
	// config timeout, an idempotency key made here, one-layer retry).
	early bool
}

// clientState is one service config in force, with the per-method policies
// resolved from it. A Client swaps the whole state atomically on a config
// update; calls keep the policy they started with. The state the methods'
// calls build up is in the Client's methodTable, which outlives states.
type clientState struct {
	cfg     *serviceconfig.Config
	origins []entryOrigin // where each entry of cfg.MethodConfig came from; immutable
	opts    *clientOptions
	metrics *instruments
	storm   stormControl
	table   *methodTable

	// methods maps full methods to their policies: every method with a
	// row (methods.go, T4), every method the config names exactly, and the
	// methods without state that generated stubs call. Lock-free to read;
	// added to by Client.add.
	methods sync.Map
	// cache maps other methods without state to their policies: a pure
	// cache of resolutions, which starts over once it holds cacheBound.
	cache  sync.Map
	cached atomic.Int64
}

func newClientState(cfg *serviceconfig.Config, opts *clientOptions, metrics *instruments, table *methodTable, prev *clientState) (*clientState, error) {
	storm, err := newStormControl(cfg, opts, prev)
	if err != nil {
		return nil, err
	}
	return &clientState{cfg: cfg, opts: opts, metrics: metrics, storm: storm, table: table}, nil
}

// shape returns the policy of fullMethod without its state (guards,
// latency, hedging window), settled, and the config entry that applies, if
// any.
func (s *clientState) shape(fullMethod string) (*methodPolicy, serviceconfig.MethodConfig, bool) {
	p := &methodPolicy{fullMethod: fullMethod, idempotent: s.isIdempotent(fullMethod)}
	p.keyed = matchName(s.opts.keyed, fullMethod) || s.opts.autoKeys && !p.idempotent
	mc, ok := s.cfg.Lookup(fullMethod)
	if ok {
		p.timeout = mc.Timeout
		p.waitForReady = mc.WaitForReady
		// MaxAttempts were held to the cap of where each entry came from
		// (checkCaps): they run as they are, never clamped in silence.
		if mc.RetryPolicy != nil {
			p.retry = newRetryPolicy(mc.RetryPolicy)
		}
		if mc.HedgingPolicy != nil {
			p.hedge = newHedgePolicy(mc.HedgingPolicy)
		}
	}
	for _, fb := range s.opts.fallbacks {
		if len(fb.names) == 0 || matchName(fb.names, fullMethod) {
			p.fallback = fb.f
		}
	}
	s.settle(p)
	return p, mc, ok
}

// settle sets p's shortcuts from what it holds.
func (s *clientState) settle(p *methodPolicy) {
	// With A6 throttling on, every call takes the full path: grpc-go counts
	// the successes of every method on the channel, and so does the
	// throttle here (at no cost when it is off).
	p.passthrough = p.retry == nil && p.hedge == nil && p.timeout == 0 && p.waitForReady == nil &&
		!p.g.any() && !p.keyed && s.storm.throttle == nil
	p.early = (p.g.breaker != nil || p.g.bulkhead != nil) && p.g.adaptive == nil && p.hedge == nil && p.fallback == nil &&
		p.timeout == 0 && !p.keyed && s.opts.oneLayer == 0
}

// sameBreaker reports whether two breaker blocks ask for the same breaker:
// equal fields, and the same set of failure codes in any order.
func sameBreaker(a, b serviceconfig.CircuitBreaker) bool {
	if rescodes.Of(a.FailureStatusCodes...) != rescodes.Of(b.FailureStatusCodes...) {
		return false
	}
	a.FailureStatusCodes, b.FailureStatusCodes = nil, nil
	return reflect.DeepEqual(a, b)
}

// matchName reports whether names holds fullMethod or its service.
func matchName(names []string, fullMethod string) bool {
	service, _ := serviceconfig.SplitMethod(fullMethod)
	for _, n := range names {
		if n == fullMethod || n == service {
			return true
		}
	}
	return false
}

// isIdempotent reports whether fullMethod was declared idempotent with
// WithIdempotentMethods or by its proto's idempotency_level.
func (s *clientState) isIdempotent(fullMethod string) bool {
	if matchName(s.opts.idempotent, fullMethod) {
		return true
	}
	name := protoreflect.FullName(strings.ReplaceAll(strings.TrimPrefix(fullMethod, "/"), "/", "."))
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
	if err != nil {
		return false
	}
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return false
	}
	opts, ok := md.Options().(*descriptorpb.MethodOptions)
	if !ok {
		return false
	}
	switch opts.GetIdempotencyLevel() {
	case descriptorpb.MethodOptions_IDEMPOTENT, descriptorpb.MethodOptions_NO_SIDE_EFFECTS:
		return true
	}
	return false
}

// defaultRetryPolicy is the policy of a zero serviceconfig.RetryPolicy.
func defaultRetryPolicy() *retryPolicy {
	return newRetryPolicy(&serviceconfig.RetryPolicy{})
}

// stateHook returns the breaker state-change hook: the user's and the
// metrics', or nil when there is neither.
func (s *clientState) stateHook() func(string, BreakerState, BreakerState) {
	user, m := s.opts.onStateChange, s.metrics
	if user == nil && !m.on {
		return nil
	}
	return func(method string, from, to BreakerState) {
		m.stateChange(method, from, to)
		if user != nil {
			user(method, from, to)
		}
	}
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
