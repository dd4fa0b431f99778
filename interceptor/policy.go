package interceptor

import (
	"cmp"
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
	"github.com/grpc-resilience/resilience/internal/budget"
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
// config. It is immutable once published, but for static and mm (set once)
// and used.
type methodPolicy struct {
	fullMethod   string
	retry        *retryPolicy // nil: no retry
	hedge        *hedgePolicy // nil: no hedging; never set with retry
	timeout      time.Duration
	waitForReady *bool
	idempotent   bool               // declared idempotent (proto or WithIdempotentMethods)
	keyed        bool               // calls get an idempotency key
	g            guards             // breaker and bulkhead; zero when none
	latency      *latency.Estimator // attempt durations; nil without a retry policy
	fallback     Fallback           // answers local rejections of unary calls; nil: none
	// A method is named when the config of this state names it exactly
	// (configured, set before the state is published) or a generated stub
	// called it, under this config or one before (static, set once and
	// carried across updates: grpc.StaticMethod). A named method does not
	// count against maxMethods and may be named in metrics: mm then holds
	// its attribute sets (nil when metrics are off), set before static.
	// A method not named is recorded as "other" (instruments.named); one
	// that only an earlier config named is not named (methods.go).
	configured bool
	static     atomic.Bool
	mm         atomic.Pointer[methodMetrics]
	// passthrough is true when nothing applies: the call goes straight to
	// the invoker.
	passthrough bool
	// early is true when a call the guards refuse at once may be refused
	// before any per-call state is built (Client.rejectEarly): the method
	// has a guard, and nothing that the full path does before its first
	// attempt changes the outcome of a rejection (hedging, a fallback, a
	// config timeout, an idempotency key made here, one-layer retry).
	early bool
	// hedgeWindow holds the recent durations of hedged copies, read at
	// hedge.windowQuantiles; nil unless the hedging delay is adaptive or
	// rationed. hedgeAllowance rations the tail copies of calls whose
	// delay comes from it; set with it.
	hedgeWindow    *latency.Window
	hedgeAllowance *budget.Allowance
	// used is set on a shared policy (clientState.shared) once a method
	// past the bound ran under it, so that Statuses shows it.
	used atomic.Bool
}

// clientState is one service config in force, with the per-method policies
// resolved from it (methods.go). A Client swaps the whole state atomically
// on a config update; calls keep the policy they started with.
type clientState struct {
	cfg     *serviceconfig.Config
	opts    *clientOptions
	metrics *instruments
	storm   stormControl

	// methods maps full method names to their policies: those the config
	// names exactly, resolved with the state, and the others once called,
	// at most maxMethods of them unless a generated stub called them
	// (methods.go). Lock-free to read; additions take mu.
	methods sync.Map
	mu      sync.Mutex
	unnamed int         // methods kept that are not named (methodPolicy.configured, static); guarded by mu
	full    atomic.Bool // unnamed reached maxMethods
	// shared holds, for each config entry that names a service or is the
	// default, the state its methods past the bound share (breaker,
	// bulkhead, latency), keyed by the entry's first Name. Built with the
	// state, never modified.
	shared map[*serviceconfig.Name]*methodPolicy
}

func newClientState(cfg *serviceconfig.Config, opts *clientOptions, metrics *instruments, prev *clientState) (*clientState, error) {
	storm, err := newStormControl(cfg, opts, prev)
	if err != nil {
		return nil, err
	}
	s := &clientState{cfg: cfg, opts: opts, metrics: metrics, storm: storm}
	s.populate(prev)
	return s, nil
}

// resolve returns the policy of fullMethod under s, with the state (breaker,
// bulkhead, latency, hedging window) of old, the method's policy under the
// config before, where its blocks are unchanged; old may be nil.
func (s *clientState) resolve(fullMethod string, old *methodPolicy) *methodPolicy {
	p, mc, ok := s.shape(fullMethod)
	if ok && !matchName(s.opts.exempt, fullMethod) {
		p.g = s.guards(fullMethod, mc, old)
	}
	p.g.keepDropped(old)
	s.giveState(p, old)
	s.settle(p)
	return p
}

// keepDropped keeps in g, which has no bulkhead, the bulkhead of old (the
// method's policy under the config before) or the one old kept, for a
// block added again (clientState.guards).
func (g *guards) keepDropped(old *methodPolicy) {
	if g.bulkhead == nil && old != nil {
		g.dropped = cmp.Or(old.g.bulkhead, old.g.dropped)
	}
}

// shape returns the policy of fullMethod without its state (guards,
// latency, hedging window), and the config entry that applies, if any.
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
			p.hedge = newHedgePolicy(mc.HedgingPolicy, s.storm.budgetRatio())
		}
	}
	for _, fb := range s.opts.fallbacks {
		if len(fb.names) == 0 || matchName(fb.names, fullMethod) {
			p.fallback = fb.f
		}
	}
	return p, mc, ok
}

// giveState gives p the latency estimator and hedging window it needs:
// old's (a method's latency does not change with its config), or new ones.
func (s *clientState) giveState(p, old *methodPolicy) {
	if old != nil && old.latency != nil {
		p.latency = old.latency
	} else if p.retry != nil || p.hedge != nil {
		p.latency = newEstimator(s.opts.estimateFloor)
	}
	if p.hedge != nil {
		if qs := p.hedge.windowQuantiles(); qs != nil {
			p.hedgeWindow = hedgeWindowOf(old, qs)
			if old != nil && old.hedgeAllowance != nil {
				p.hedgeAllowance = old.hedgeAllowance
			} else {
				p.hedgeAllowance = budget.NewAllowance(2*(1-qs[0]), allowanceBurst)
			}
		}
	}
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

// hedgeWindowOf returns the window of a method's hedged copies read at
// quantiles: that of old, its policy under the config before, whose
// observations carry over (a method's latency does not change with its
// config), or a new one.
func hedgeWindowOf(old *methodPolicy, quantiles []float64) *latency.Window {
	if old != nil && old.hedgeWindow != nil {
		if w, err := old.hedgeWindow.WithQuantiles(quantiles...); err == nil {
			return w
		}
	}
	// The quantiles were validated with the config, so this cannot fail.
	w, _ := latency.NewWindow(latency.DefaultWindowSize, quantiles...)
	return w
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

// guards builds the breaker and bulkhead of fullMethod from mc, or carries
// them over from old, its policy under the config before, when their blocks
// are unchanged; a breaker built for a changed block adopts the state of
// old's (breaker.Adopt), and old's bulkhead takes a changed block's limits
// (bulkhead.Resize), so it is shared by old and the new policy. The blocks
// were validated with the config, so construction cannot fail. Only
// populate passes an old (itself or through sharedPolicy), once per
// update, for the state it publishes.
func (s *clientState) guards(fullMethod string, mc serviceconfig.MethodConfig, old *methodPolicy) guards {
	var g guards
	if cb := mc.CircuitBreaker; cb != nil && cb.Mode == serviceconfig.ModeAdaptive {
		g.breakerCfg = cb
		if old != nil && old.g.breakerCfg != nil && sameBreaker(*old.g.breakerCfg, *cb) && old.g.adaptive != nil {
			g.adaptive = old.g.adaptive
		} else if a, err := newAdaptive(cb, uint64(s.opts.rand()*(1<<53))); err == nil {
			g.adaptive = a
		}
	} else if cb != nil {
		g.breakerCfg = cb
		g.failures = rescodes.Of(cb.FailureStatusCodes...)
		if len(cb.FailureStatusCodes) == 0 {
			g.failures = rescodes.DefaultBreakerFailures
		}
		if old != nil && old.g.breakerCfg != nil && sameBreaker(*old.g.breakerCfg, *cb) {
			g.breaker = old.g.breaker
		} else if b, err := newBreaker(fullMethod, cb, s.stateHook()); err == nil {
			if old != nil && old.g.breaker != nil {
				// A changed block keeps what the breaker was doing: an
				// operator's forced state, an outage's open period.
				b.Adopt(old.g.breaker, time.Now())
			}
			g.breaker = b
		}
	}
	if bh := mc.Bulkhead; bh != nil {
		g.bulkheadCfg = bh
		if old != nil && old.g.bulkhead != nil {
			// The same bulkhead under the new block's limits, so that they
			// count the attempts in flight and queued (bulkhead.Resize).
			if *old.g.bulkheadCfg != *bh {
				_ = old.g.bulkhead.Resize(bulkheadConfig(bh))
			}
			g.bulkhead = old.g.bulkhead
		} else if old != nil && old.g.dropped != nil {
			// A block added again: the bulkhead dropped, which the
			// attempts begun before still hold.
			_ = old.g.dropped.Resize(bulkheadConfig(bh))
			g.bulkhead = old.g.dropped
		} else if b, err := newBulkhead(bh); err == nil {
			g.bulkhead = b
		}
	}
	if g.any() {
		// A method's rejections depend on its name alone: old's serve,
		// so that an update does not rebuild them for every kept method.
		if old != nil && old.g.rejections != nil {
			g.rejections = old.g.rejections
		} else {
			g.rejections = newRejections(fullMethod)
		}
	}
	return g
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
