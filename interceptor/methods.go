package interceptor

import (
	"math"

	"github.com/grpc-resilience/resilience/internal/bulkhead"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// maxMethods bounds the methods a client keeps state for (policy, breaker,
// bulkhead, latency) beyond two kinds whose number the code bounds, not the
// callers: the methods the config in force names exactly, resolved with the
// config, and the methods a generated stub calls (grpc.StaticMethod). A
// proxy that forwards whatever method names its callers send, an admin page
// that calls ForceOpen with a name from a request, or a control plane whose
// every config names new methods (a method only an earlier config named is
// one of these), adds at most maxMethods more. Past the bound, a method
// keeps nothing of its own: each call resolves its policy (its retry or
// hedging policy, timeout, idempotency, fallback) and runs under the state
// its config entry keeps for all such methods, its shared policy, reported
// as "/pkg.Service/*" (or "/*" for the default entry). A kept method's
// state lives across updates while it is kept; a method is let go only
// when an update drops its config's name for it and the bound has no room
// left or it has no state of its own to keep (carry).
const maxMethods = 1024

// policy returns the policy of fullMethod, resolving and keeping it on the
// first call; static is set for a call of a generated stub. The fast path is
// one lock-free map read.
func (s *clientState) policy(fullMethod string, static bool) *methodPolicy {
	if v, ok := s.methods.Load(fullMethod); ok {
		p := v.(*methodPolicy)
		if static && !p.static.Load() {
			s.markStatic(p)
		}
		return p
	}
	return s.add(fullMethod, static)
}

// add resolves and keeps the policy of fullMethod, not kept yet; past the
// bound, a call without grpc.StaticMethod gets a policy of its own that is
// not kept (spill).
func (s *clientState) add(fullMethod string, static bool) *methodPolicy {
	if !static && s.full.Load() {
		return s.spill(fullMethod)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.methods.Load(fullMethod); ok {
		p := v.(*methodPolicy)
		if static && !p.static.Load() {
			s.markStatic(p)
		}
		return p
	}
	if !static && s.unnamed >= maxMethods {
		return s.spill(fullMethod)
	}
	p := s.resolve(fullMethod, nil)
	if static {
		s.markStatic(p)
	}
	s.keep(p)
	return p
}

// keep adds p to the methods, counting it against the bound unless its
// method is named (the config names it exactly, or a generated stub called
// it). s.mu is held, or s is not yet published.
func (s *clientState) keep(p *methodPolicy) {
	s.methods.Store(p.fullMethod, p)
	if !p.configured && !p.static.Load() {
		s.unnamed++
		if s.unnamed >= maxMethods {
			s.full.Store(true)
		}
	}
}

// exactName returns the full method an exact name selects.
func exactName(n serviceconfig.Name) string { return "/" + n.Service + "/" + n.Method }

// spill returns the policy of fullMethod, a method past the bound, for one
// call: resolved and not kept, with the state its config entry shares
// among such methods (its shared policy).
func (s *clientState) spill(fullMethod string) *methodPolicy {
	p, mc, ok := s.shape(fullMethod)
	var sh *methodPolicy
	if ok && len(mc.Name) > 0 {
		sh = s.shared[&mc.Name[0]]
	}
	if sh != nil {
		if !sh.used.Load() {
			sh.used.Store(true)
		}
		if !matchName(s.opts.exempt, fullMethod) {
			p.g = sh.g
		}
		p.latency, p.hedgeWindow, p.hedgeAllowance = sh.latency, sh.hedgeWindow, sh.hedgeAllowance
	} else {
		s.giveState(p, nil)
	}
	s.settle(p)
	return p
}

// peek returns the policy fullMethod's calls would run under, without
// keeping it when no call has resolved it: for Status and HedgingDelay,
// which must not let a caller's names grow the methods.
func (s *clientState) peek(fullMethod string) *methodPolicy {
	if v, ok := s.methods.Load(fullMethod); ok {
		return v.(*methodPolicy)
	}
	if s.full.Load() {
		return s.spill(fullMethod)
	}
	return s.resolve(fullMethod, nil)
}

// markStatic marks p's method as called by a generated stub: named (for
// the bound and for metrics, see instruments.named) under this config and
// every later one. Its callers check p.static first, so that a known
// method's call costs one atomic load.
func (s *clientState) markStatic(p *methodPolicy) {
	if s.metrics.on && p.mm.Load() == nil {
		p.mm.Store(s.metrics.named(p.fullMethod))
	}
	p.static.Store(true)
}

// populate fills a new state s: the methods its config names exactly, the
// shared policies of its entries, and the methods prev kept (carry),
// resolved under s with prev's state where their blocks are unchanged. So
// Statuses, the gauges and the breakers' state (a forced-open breaker too)
// carry over an update while the method is kept, and a method whose block
// changed starts afresh.
func (s *clientState) populate(prev *clientState) {
	prevShared := make(map[string]*methodPolicy)
	if prev != nil {
		for _, sh := range prev.shared {
			prevShared[sh.fullMethod] = sh
		}
	}
	s.shared = make(map[*serviceconfig.Name]*methodPolicy)
	for i := range s.cfg.MethodConfig {
		mc := &s.cfg.MethodConfig[i]
		label := ""
		for _, n := range mc.Name {
			switch {
			case n.Method != "":
				s.configure(exactName(n), prev.kept(exactName(n)))
			case label == "":
				label = sharedName(n)
			}
		}
		if label != "" {
			s.shared[&mc.Name[0]] = s.sharedPolicy(label, *mc, prevShared[label])
		}
	}
	if prev != nil {
		s.carry(prev)
		s.unbound(prev)
	}
}

// configure keeps fullMethod, which the config of s names exactly, with
// the state of old, its policy under the config before (or nil).
func (s *clientState) configure(fullMethod string, old *methodPolicy) {
	if _, ok := s.methods.Load(fullMethod); ok {
		return
	}
	p := s.resolve(fullMethod, old)
	p.configured = true
	if s.metrics.on {
		p.mm.Store(s.metrics.named(fullMethod))
	}
	if old != nil && old.static.Load() {
		p.static.Store(true)
	}
	s.methods.Store(fullMethod, p)
}

// carry keeps in s, resolved under its config with their state, the
// methods prev kept that s's config does not name exactly. First those
// prev counted against the bound and those generated stubs called: the
// former fit (prev held at most maxMethods of them), the latter are not
// counted. Then, in the order of prev's config, those only prev's config
// named, each counting against the bound: kept while there is room and
// while it has state of its own to keep (stateful), else let go (forget).
// So an update costs O(the methods prev kept), which is O(the names of
// prev's config + the bound), whatever names earlier configs held.
func (s *clientState) carry(prev *clientState) {
	prev.methods.Range(func(k, v any) bool {
		if old := v.(*methodPolicy); !old.configured || old.static.Load() {
			s.carryOne(k.(string), old)
		}
		return true
	})
	for i := range prev.cfg.MethodConfig {
		for _, n := range prev.cfg.MethodConfig[i].Name {
			if n.Method == "" {
				continue
			}
			m := exactName(n)
			if old := prev.kept(m); old != nil {
				s.carryOne(m, old)
			}
		}
	}
}

// carryOne keeps fullMethod in s with the state of old, its policy under
// the config before, unless s keeps it already, or the method is not named
// and there is no room for it, or it is only dropped from the config and
// has no state to keep under s: then it is let go, and its next call
// resolves it as a method never called (add), with the default policy
// where no entry of s applies.
func (s *clientState) carryOne(fullMethod string, old *methodPolicy) {
	if _, ok := s.methods.Load(fullMethod); ok {
		return
	}
	static := old.static.Load()
	if !static && s.unnamed >= maxMethods {
		s.forget(old)
		return
	}
	p := s.resolve(fullMethod, old)
	if static {
		p.mm.Store(old.mm.Load())
		p.static.Store(true)
	} else if old.configured {
		s.forget(old) // no longer named, kept or not
		if !p.stateful() {
			return
		}
	}
	s.keep(p)
}

// stateful reports whether p holds state that a call builds up: a guard,
// a latency estimator, a hedging window, or a bulkhead dropped by an
// update that attempts begun before still hold (a block added again takes
// it back, so that its limits count them: guards.dropped).
func (p *methodPolicy) stateful() bool {
	return p.g.any() || p.latency != nil || p.hedgeWindow != nil ||
		p.g.dropped != nil && p.g.dropped.Snapshot() != (bulkhead.Snapshot{})
}

// forget lets old's method go from the metrics' names when only a config
// named it (a generated stub never called it): its calls and gauges are
// recorded as "other" from now on, so names does not grow with every name
// a config ever held.
func (s *clientState) forget(old *methodPolicy) {
	if s.metrics.on && old.configured && !old.static.Load() {
		s.metrics.names.Delete(old.fullMethod)
	}
}

// unbound lifts the limits of the bulkheads prev had and s dropped (a
// bulkhead block or its entry removed): the attempts queued in them go at
// once, as a new call would, rather than wait behind a limit no longer
// configured; the attempts in flight still release into them.
func (s *clientState) unbound(prev *clientState) {
	live := make(map[*bulkhead.Bulkhead]bool)
	s.all(func(p *methodPolicy) { live[p.g.bulkhead] = true })
	prev.all(func(p *methodPolicy) {
		if b := p.g.bulkhead; b != nil && !live[b] {
			_ = b.Resize(bulkhead.Config{MaxConcurrent: math.MaxInt32})
		}
	})
}

// all calls f with every policy s keeps and every shared policy.
func (s *clientState) all(f func(p *methodPolicy)) {
	s.methods.Range(func(_, v any) bool {
		f(v.(*methodPolicy))
		return true
	})
	for _, sh := range s.shared {
		f(sh)
	}
}

// kept returns the policy s keeps for fullMethod, or nil; s may be nil.
func (s *clientState) kept(fullMethod string) *methodPolicy {
	if s == nil {
		return nil
	}
	if v, ok := s.methods.Load(fullMethod); ok {
		return v.(*methodPolicy)
	}
	return nil
}

// sharedName is the name under which the methods of a config entry past
// the bound share their state, from its first service or default name n:
// "/pkg.Service/*", or "/*" for the default entry.
func sharedName(n serviceconfig.Name) string {
	if n.Service == "" {
		return "/*"
	}
	return "/" + n.Service + "/*"
}

// sharedPolicy builds the state that the methods of entry mc past the
// bound share, named label, carrying old's (the same label's under the
// config before) where the blocks are unchanged.
func (s *clientState) sharedPolicy(label string, mc serviceconfig.MethodConfig, old *methodPolicy) *methodPolicy {
	sh := &methodPolicy{fullMethod: label}
	if mc.RetryPolicy != nil {
		sh.retry = newRetryPolicy(mc.RetryPolicy)
	}
	if mc.HedgingPolicy != nil {
		sh.hedge = newHedgePolicy(mc.HedgingPolicy, s.storm.budgetRatio())
	}
	sh.g = s.guards(label, mc, old)
	sh.g.keepDropped(old)
	s.giveState(sh, old)
	if old != nil && old.used.Load() {
		sh.used.Store(true)
	}
	return sh
}

// each calls f with every policy whose state Statuses and the gauges
// report: the methods kept, and the shared policies some method past the
// bound ran under.
func (s *clientState) each(f func(p *methodPolicy)) {
	s.methods.Range(func(_, v any) bool {
		f(v.(*methodPolicy))
		return true
	})
	for _, sh := range s.shared {
		if sh.used.Load() {
			f(sh)
		}
	}
}
