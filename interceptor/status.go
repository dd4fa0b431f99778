package interceptor

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/internal/rpcname"
	"github.com/grpc-resilience/resilience/internal/breaker"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// BreakerState is the state of a method's circuit breaker.
type BreakerState uint8

// The breaker states. The numbering is internal/breaker's.
const (
	BreakerClosed       = BreakerState(breaker.StateClosed)
	BreakerOpen         = BreakerState(breaker.StateOpen)
	BreakerHalfOpen     = BreakerState(breaker.StateHalfOpen)
	BreakerForcedOpen   = BreakerState(breaker.StateForcedOpen)
	BreakerForcedClosed = BreakerState(breaker.StateForcedClosed)
)

// String returns "closed", "open", "half-open", "forced-open" or
// "forced-closed".
func (s BreakerState) String() string { return breaker.State(s).String() }

// BreakerStatus is a snapshot of one method's breaker.
type BreakerStatus struct {
	State BreakerState
	// Calls, Failures and SlowCalls count the outcomes in the rolling window.
	Calls, Failures, SlowCalls int
	// ConsecutiveFailures is the current run of failures.
	ConsecutiveFailures int
	// OpenUntil is when an open breaker lets a probe through.
	OpenUntil time.Time
	// Probes is the number of half-open probes in flight.
	Probes int
	// Trips counts the times the breaker opened by itself.
	Trips uint64
}

// BulkheadStatus is a snapshot of one method's bulkhead.
type BulkheadStatus struct {
	InFlight, Queued int
}

// AdaptiveStatus is a snapshot of one method's adaptive throttling (a
// circuitBreaker block in mode "adaptive"): the attempts tried and the
// attempts the backend accepted over its window, and the probability that
// the next attempt is rejected locally.
type AdaptiveStatus struct {
	Requests, Accepts float64
	RejectProbability float64
}

// MethodStatus is a snapshot of one method's guards; nil fields mean the
// method has no such guard.
type MethodStatus struct {
	FullMethod string
	Breaker    *BreakerStatus
	Adaptive   *AdaptiveStatus
	Bulkhead   *BulkheadStatus
	RateLimit  *RateLimitStatus
}

// RateLimitStatus is a snapshot of one method's rate limit (a rateLimit
// block).
type RateLimitStatus struct {
	// Waiting is the number of attempts waiting for their token or slot.
	Waiting int
	// PacedUntil is when the next slot of the method's pace is free while
	// a server's pushback is in force; zero when none is.
	PacedUntil time.Time
	// Period is the server's last wait (capped), by which the attempts are
	// spaced while the pushback is in force; 0 when none is.
	Period time.Duration
}

// Status returns a snapshot of the guards (breaker, adaptive throttling,
// bulkhead, rate limit) that the calls of fullMethod
// ("/pkg.Service/Method"; the leading slash may be left out) go through.
// It keeps nothing for a method no call has resolved (its guards are then
// fresh), so names from elsewhere cannot grow the client's state. A name
// that is not a full method has no guards: its status is empty, and why is
// logged once (WithLogger).
func (c *Client) Status(fullMethod string) MethodStatus {
	full, err := rpcname.FullMethod("Status", fullMethod)
	if err != nil {
		c.log.warn(err.Error())
		return MethodStatus{FullMethod: fullMethod}
	}
	return c.peek(full).status(time.Now())
}

// Statuses returns a snapshot of every method with a breaker (of either
// mode), a bulkhead or a rate limit (a rateLimit block) that the config
// names exactly, or that was called (or given to ForceOpen, ForceClosed or
// ResetBreaker) and is kept (see the package documentation, Bounded
// state), sorted by method. It is complete after any sequence of config
// updates.
func (c *Client) Statuses() []MethodStatus {
	now := time.Now()
	var out []MethodStatus
	c.state.Load().each(func(p *methodPolicy) {
		if p.g.any() {
			out = append(out, p.status(now))
		}
	})
	slices.SortFunc(out, func(a, b MethodStatus) int { return strings.Compare(a.FullMethod, b.FullMethod) })
	return out
}

func (p *methodPolicy) status(now time.Time) MethodStatus {
	st := MethodStatus{FullMethod: p.fullMethod}
	if b := p.g.breaker; b != nil {
		s := b.Snapshot(now)
		st.Breaker = &BreakerStatus{
			State: BreakerState(s.State), Calls: s.Calls, Failures: s.Failures, SlowCalls: s.SlowCalls,
			ConsecutiveFailures: s.ConsecutiveFailures, OpenUntil: s.OpenUntil, Probes: s.Probes, Trips: s.Trips,
		}
	}
	if a := p.g.adaptive; a != nil {
		s := a.Snapshot(now)
		st.Adaptive = &AdaptiveStatus{Requests: s.Requests, Accepts: s.Accepts, RejectProbability: s.RejectProbability}
	}
	if bh := p.g.bulkhead; bh != nil {
		s := bh.Snapshot()
		st.Bulkhead = &BulkheadStatus{InFlight: s.InFlight, Queued: s.Queued}
	}
	if q := p.g.rate; q != nil {
		st.RateLimit = &RateLimitStatus{Waiting: int(q.waiting.Load())}
		st.RateLimit.PacedUntil, st.RateLimit.Period = q.pace.Snapshot()
	}
	return st
}

// ForceOpen holds the breaker of fullMethod open, rejecting every call,
// until ResetBreaker or ForceClosed, and across config updates while the
// method's entry keeps a circuitBreaker block. It acts on the breaker of
// that method alone. It is an error, saying why, when the method has no
// breaker (no entry with a circuitBreaker block applies to it, the block is
// in mode "adaptive", or the method is exempt), when the client has no room
// to keep one for it (see the package documentation, Bounded state), or
// when fullMethod is not a full method "/pkg.Service/Method" (the leading
// slash may be left out).
//
// ForceOpen, ForceClosed and ResetBreaker take no lock of the client's
// while the breaker changes, and the WithOnStateChange hook runs after the
// change is published: a hook may call them, or any other method of the
// Client.
func (c *Client) ForceOpen(fullMethod string) error {
	return c.control("ForceOpen", fullMethod, (*breaker.Breaker).ForceOpen)
}

// ForceClosed holds the breaker of fullMethod closed, admitting every call,
// until ResetBreaker or ForceOpen. Its errors are ForceOpen's.
func (c *Client) ForceClosed(fullMethod string) error {
	return c.control("ForceClosed", fullMethod, (*breaker.Breaker).ForceClosed)
}

// ResetBreaker returns the breaker of fullMethod to closed with empty
// counts, ending a forced state. Its errors are ForceOpen's.
func (c *Client) ResetBreaker(fullMethod string) error {
	return c.control("ResetBreaker", fullMethod, (*breaker.Breaker).Reset)
}

// control applies f to the breaker of fullMethod's row, made as a call
// would make it (methods.go), with no lock held: the row's breaker is the
// method's under every config that keeps its block (T5), so f is never
// lost to an update.
func (c *Client) control(op, fullMethod string, f func(*breaker.Breaker, time.Time)) error {
	fullMethod, err := rpcname.FullMethod(op, fullMethod)
	if err != nil {
		return err
	}
	for {
		st, p, untracked := c.add(fullMethod, false)
		b := p.g.breaker
		if b == nil {
			return fmt.Errorf("interceptor: %s(%s): %s", op, fullMethod, st.noBreaker(fullMethod, untracked))
		}
		f(b, time.Now())
		// With no lock held, another method's call may have let the row go
		// to make room in its key (T6b: it was idle) before f acted, and a
		// call of the method would then make a new row, closed: act on the
		// method's row again. A forced breaker is not idle, so its row
		// stays; a reset one may go, and a new row is as good as it.
		if op == "ResetBreaker" || c.table.holds(fullMethod, b) {
			return nil
		}
	}
}

// noBreaker says why fullMethod has no breaker under st.
func (st *clientState) noBreaker(fullMethod string, untracked bool) string {
	mc, ok := st.cfg.Lookup(fullMethod)
	switch {
	case !ok:
		return "no methodConfig entry applies to the method: it has no circuit breaker"
	case mc.CircuitBreaker == nil:
		return fmt.Sprintf("the methodConfig entry that applies to it (%s) has no circuitBreaker block", entryKey(mc, fullMethod))
	case mc.CircuitBreaker.Mode == serviceconfig.ModeAdaptive:
		return "its circuitBreaker is in mode \"adaptive\", which has no state to force"
	case matchName(st.opts.exempt, fullMethod):
		return "the method is exempt from breakers (WithExemptMethods)"
	case untracked:
		return fmt.Sprintf("the client keeps breakers for at most %d methods of %s that the config does not name exactly, and none is idle to make room: name the method in the config, or call it through a generated stub", st.table.bound, entryKey(mc, fullMethod))
	}
	return "it has no circuit breaker"
}

// RetryStatus is a snapshot of the limits a Client's retries share, from
// Client.RetryStatus; nil fields are off.
type RetryStatus struct {
	// Budget is the retry budget (WithRetryBudget, or the config's
	// retryBudget block).
	Budget *BudgetStatus
	// Throttling is gRFC A6 retry throttling (the config's
	// retryThrottling block).
	Throttling *ThrottlingStatus
}

// BudgetStatus is a snapshot of a retry budget.
type BudgetStatus struct {
	// Available is the number of retries the budget would grant now.
	Available float64
}

// ThrottlingStatus is a snapshot of gRFC A6 retry throttling: retries are
// withheld while Tokens is at most half of MaxTokens.
type ThrottlingStatus struct {
	Tokens, MaxTokens float64
}

// RetryStatus returns a snapshot of the client's retry budget and retry
// throttling under the config in force. It takes no lock that a call
// takes.
func (c *Client) RetryStatus() RetryStatus {
	st := c.state.Load()
	var out RetryStatus
	if b := st.storm.budget; b != nil {
		out.Budget = &BudgetStatus{Available: b.Available(time.Now())}
	}
	if t := st.storm.throttle; t != nil {
		out.Throttling = &ThrottlingStatus{Tokens: t.Tokens(), MaxTokens: st.storm.throttleCfg.MaxTokens}
	}
	return out
}

// MethodPolicy is the configuration in force for a method, and where it
// came from ([Client.Policy]).
type MethodPolicy struct {
	FullMethod string
	// Source names the method config entry that applies to the method,
	// as the Client's errors name it: "WithMethodConfig: entry 0",
	// "WithRetryPolicy", "WithServiceConfig: methodConfig[1]" (a parsed
	// document; "MethodConfig[1]" for a Config built in Go),
	// "UpdateServiceConfig: methodConfig[0]", "the resolver's service
	// config: methodConfig[2]"; "" when no entry applies (the method runs
	// without a policy of the config).
	Source string
	// Config is that entry, the whole of it (its names included); zero
	// when Source is "". It is a copy: changing it changes nothing.
	Config serviceconfig.MethodConfig
}

// Policy returns the method config entry in force for fullMethod
// ("/pkg.Service/Method"; the leading slash may be left out) and where it
// came from: a Go option, a parsed document, UpdateServiceConfig or the
// resolver. An entry applies as grpc-go applies it: the one naming the
// method, else its service, else the default entry. It keeps nothing, and
// reads the config in force when it is called.
func (c *Client) Policy(fullMethod string) MethodPolicy {
	st := c.state.Load()
	mp := MethodPolicy{FullMethod: fullMethod}
	i := st.cfg.LookupIndex(fullMethod)
	if i < 0 {
		return mp
	}
	mp.Config = cloneMethodConfig(st.cfg.MethodConfig[i])
	if i < len(st.origins) {
		mp.Source = st.origins[i].at("")
	}
	return mp
}

// cloneMethodConfig returns a copy of mc that shares no memory with it:
// each block and slice is copied (TestPolicyIsADeepCopy checks that every
// reference field of MethodConfig is).
func cloneMethodConfig(mc serviceconfig.MethodConfig) serviceconfig.MethodConfig {
	mc.Name = slices.Clone(mc.Name)
	mc.WaitForReady = clonePtr(mc.WaitForReady)
	mc.MaxRequestMessageBytes = clonePtr(mc.MaxRequestMessageBytes)
	mc.MaxResponseMessageBytes = clonePtr(mc.MaxResponseMessageBytes)
	if mc.RetryPolicy = clonePtr(mc.RetryPolicy); mc.RetryPolicy != nil {
		mc.RetryPolicy.RetryableStatusCodes = slices.Clone(mc.RetryPolicy.RetryableStatusCodes)
	}
	if mc.HedgingPolicy = clonePtr(mc.HedgingPolicy); mc.HedgingPolicy != nil {
		mc.HedgingPolicy.NonFatalStatusCodes = slices.Clone(mc.HedgingPolicy.NonFatalStatusCodes)
	}
	if mc.CircuitBreaker = clonePtr(mc.CircuitBreaker); mc.CircuitBreaker != nil {
		mc.CircuitBreaker.FailureStatusCodes = slices.Clone(mc.CircuitBreaker.FailureStatusCodes)
	}
	mc.Bulkhead = clonePtr(mc.Bulkhead)
	mc.RateLimit = clonePtr(mc.RateLimit)
	return mc
}

// clonePtr returns a copy of *p, or nil.
func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
