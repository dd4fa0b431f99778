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
	maxAttempts int // ≥ 1, ≤ the client's cap
	backoff     backoff.Config
	codes       rescodes.Set // the exact retryable codes when explicit
	explicit    bool         // codes was written out; else the default rules apply
	perAttempt  time.Duration
}

func newRetryPolicy(p *serviceconfig.RetryPolicy, maxCap int) *retryPolicy {
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
	rp.maxAttempts = min(rp.maxAttempts, maxCap)
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
// config. It is immutable once published.
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
	mm           *methodMetrics     // attribute sets; nil when metrics are off
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
	// hedge.quantile; nil unless the hedging delay is adaptive.
	hedgeWindow *latency.Window
}

// clientState is one service config in force, with the per-method policies
// resolved from it. A Client swaps the whole state atomically on a config
// update; calls keep the policy they started with.
type clientState struct {
	cfg     *serviceconfig.Config
	maxCap  int // the cap on cfg's MaxAttempts: the client's, or Parse's when higher
	opts    *clientOptions
	metrics *instruments
	storm   stormControl
	// prev holds the policies of the config before, whose breakers and
	// bulkheads carry over when their blocks are unchanged.
	prev map[string]*methodPolicy

	// methods maps full method names to policies. It is replaced, never
	// modified, under mu: readers load it without a lock.
	methods atomic.Pointer[map[string]*methodPolicy]
	mu      sync.Mutex
}

func newClientState(cfg *serviceconfig.Config, maxCap int, opts *clientOptions, metrics *instruments, prev *clientState) (*clientState, error) {
	storm, err := newStormControl(cfg, opts, prev)
	if err != nil {
		return nil, err
	}
	s := &clientState{cfg: cfg, maxCap: maxCap, opts: opts, metrics: metrics, storm: storm}
	if prev != nil {
		s.prev = prev.carried()
	}
	m := make(map[string]*methodPolicy)
	s.methods.Store(&m)
	return s, nil
}

// carried returns the policies of every method with state under s: those
// resolved, and those s carried from the config before but no call has
// resolved yet, which it resolves now. So state carries over per unchanged
// block however many updates come with no call in between, and a method
// whose block changed in between starts afresh.
func (s *clientState) carried() map[string]*methodPolicy {
	for m := range s.prev {
		s.policy(m)
	}
	return *s.methods.Load()
}

// policy returns the policy of fullMethod, resolving and caching it on the
// first call. The fast path is one map read.
func (s *clientState) policy(fullMethod string) *methodPolicy {
	if p, ok := (*s.methods.Load())[fullMethod]; ok {
		return p
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.methods.Load()
	if p, ok := old[fullMethod]; ok {
		return p
	}
	p := s.resolve(fullMethod)
	m := make(map[string]*methodPolicy, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[fullMethod] = p
	s.methods.Store(&m)
	return p
}

func (s *clientState) resolve(fullMethod string) *methodPolicy {
	p := &methodPolicy{fullMethod: fullMethod, idempotent: s.isIdempotent(fullMethod)}
	p.keyed = matchName(s.opts.keyed, fullMethod) || s.opts.autoKeys && !p.idempotent
	if s.metrics.on {
		p.mm = newMethodMetrics(fullMethod)
	}
	if mc, ok := s.cfg.Lookup(fullMethod); ok {
		p.timeout = mc.Timeout
		p.waitForReady = mc.WaitForReady
		// A parsed config's MaxAttempts were capped by Parse: they run as
		// they are (one cap, never a silent second clamp).
		if mc.RetryPolicy != nil {
			p.retry = newRetryPolicy(mc.RetryPolicy, s.maxCap)
		}
		if mc.HedgingPolicy != nil {
			p.hedge = newHedgePolicy(mc.HedgingPolicy, s.maxCap)
		}
		if !matchName(s.opts.exempt, fullMethod) {
			p.g = s.guards(fullMethod, mc)
		}
	}
	for _, fb := range s.opts.fallbacks {
		if len(fb.names) == 0 || matchName(fb.names, fullMethod) {
			p.fallback = fb.f
		}
	}
	if old := s.prev[fullMethod]; old != nil && old.latency != nil {
		p.latency = old.latency // a method's latency does not change with its config
	} else if p.retry != nil || p.hedge != nil {
		p.latency = newEstimator(s.opts.estimateFloor)
	}
	if p.hedge != nil && p.hedge.quantile > 0 {
		p.hedgeWindow = s.hedgeWindow(fullMethod, p.hedge.quantile)
	}
	// With A6 throttling on, every call takes the full path: grpc-go counts
	// the successes of every method on the channel, and so does the
	// throttle here (at no cost when it is off).
	p.passthrough = p.retry == nil && p.hedge == nil && p.timeout == 0 && p.waitForReady == nil &&
		!p.g.any() && !p.keyed && s.storm.throttle == nil
	p.early = (p.g.breaker != nil || p.g.bulkhead != nil) && p.g.adaptive == nil && p.hedge == nil && p.fallback == nil &&
		p.timeout == 0 && !p.keyed && s.opts.oneLayer == 0
	return p
}

// hedgeWindow returns the window of fullMethod's hedged copies read at
// quantile: the config before's, whose observations carry over (a method's
// latency does not change with its config), or a new one.
func (s *clientState) hedgeWindow(fullMethod string, quantile float64) *latency.Window {
	if old := s.prev[fullMethod]; old != nil && old.hedgeWindow != nil {
		if w, err := old.hedgeWindow.WithQuantile(quantile); err == nil {
			return w
		}
	}
	// quantile was validated with the config, so this cannot fail.
	w, _ := latency.NewWindow(quantile, latency.DefaultWindowSize)
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
// them over from the config before when their blocks are unchanged. The
// blocks were validated with the config, so construction cannot fail.
func (s *clientState) guards(fullMethod string, mc serviceconfig.MethodConfig) guards {
	var g guards
	old := s.prev[fullMethod]
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
			g.breaker = b
		}
	}
	if bh := mc.Bulkhead; bh != nil {
		g.bulkheadCfg = bh
		if old != nil && old.g.bulkheadCfg != nil && *old.g.bulkheadCfg == *bh {
			g.bulkhead = old.g.bulkhead
		} else if b, err := newBulkhead(bh); err == nil {
			g.bulkhead = b
		}
	}
	if g.any() {
		g.rejections = newRejections(fullMethod)
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
func defaultRetryPolicy(maxCap int) *retryPolicy {
	return newRetryPolicy(&serviceconfig.RetryPolicy{}, maxCap)
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
