package interceptor

import (
	"math"

	"github.com/grpc-resilience/resilience/internal/bulkhead"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// maxMethods bounds the methods a client keeps state for (policy, breaker,
// bulkhead, latency) beyond two kinds whose number the code bounds, not the
// callers: the methods the config names exactly, resolved with the config,
// and the methods a generated stub calls (grpc.StaticMethod). A proxy that
// forwards whatever method names its callers send, or an admin page that
// calls ForceOpen with a name from a request, adds at most maxMethods more.
// Past the bound, a method keeps nothing of its own: each call resolves its
// policy (its retry or hedging policy, timeout, idempotency, fallback) and
// runs under the state its config entry keeps for all such methods, its
// shared policy, reported as "/pkg.Service/*" (or "/*" for the default
// entry). No state is ever dropped: a method's breaker lives as long as
// its config entry.
const maxMethods = 1024

// policy returns the policy of fullMethod, resolving and keeping it on the
// first call; static is set for a call of a generated stub. The fast path is
// one lock-free map read.
func (s *clientState) policy(fullMethod string, static bool) *methodPolicy {
	if v, ok := s.methods.Load(fullMethod); ok {
		p := v.(*methodPolicy)
		if static {
			s.name(p)
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
		if static {
			s.name(p)
		}
		return p
	}
	if !static && s.unnamed >= maxMethods {
		return s.spill(fullMethod)
	}
	p := s.resolve(fullMethod, nil)
	if static {
		s.name(p)
	}
	s.keep(p)
	return p
}

// keep adds p to the methods, counting it against the bound unless its
// method is named (a config entry names it exactly, or a generated stub
// called it). s.mu is held, or s is not yet published.
func (s *clientState) keep(p *methodPolicy) {
	s.methods.Store(p.fullMethod, p)
	if !p.named.Load() {
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

// name marks p's method as named, for the bound and for metrics: a
// generated stub called it, or a config entry names it exactly (see
// instruments.named). The fast path is one atomic load.
func (s *clientState) name(p *methodPolicy) {
	if p.named.Load() {
		return
	}
	if s.metrics.on {
		p.mm.Store(s.metrics.named(p.fullMethod))
	}
	p.named.Store(true)
}

// populate fills a new state s: the methods its config names exactly, the
// shared policies of its entries, and every method prev kept, resolved under
// s with prev's state where their blocks are unchanged. So Statuses, the
// gauges and the breakers' state (a forced-open breaker too) carry over an
// update whatever came before it, and a method whose block changed starts
// afresh.
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
				m := exactName(n)
				if _, ok := s.methods.Load(m); !ok {
					p := s.resolve(m, prev.kept(m))
					s.name(p)
					s.methods.Store(m, p)
				}
			case label == "":
				label = sharedName(n)
			}
		}
		if label != "" {
			s.shared[&mc.Name[0]] = s.sharedPolicy(label, *mc, prevShared[label])
		}
	}
	if prev == nil {
		return
	}
	prev.methods.Range(func(k, v any) bool {
		m, old := k.(string), v.(*methodPolicy)
		if _, ok := s.methods.Load(m); ok {
			return true
		}
		p := s.resolve(m, old)
		if old.named.Load() {
			p.mm.Store(old.mm.Load())
			p.named.Store(true)
		}
		s.keep(p)
		return true
	})
	s.unbound(prev)
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
