package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor"
	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// ClientSource is one Client in a View (View.Client). Its hooks feed the
// view's events: breaker transitions (WithOnStateChange), the failed
// attempts that explain them (WithOnRetry, WithOnStop) and the calls the
// client's own parts refused (WithOnStop: a full bulkhead, adaptive
// throttling, a spent retry budget, A6 throttling, the method's rateLimit
// block). They run only when a
// breaker changes state or an attempt or call fails: a call that succeeds
// never reaches them. Its snapshot is read from the attached Client when
// the view is asked.
type ClientSource struct {
	v     *View
	name  string
	fails *failures
	c     atomic.Pointer[interceptor.Client]
}

// Name returns the name the source was registered under.
func (s *ClientSource) Name() string { return s.name }

// Options returns the Client options that install the source's hooks:
// interceptor.WithOnStateChange, WithOnRetry and WithOnStop. A later
// option of the same name replaces the hook; to keep one of your own,
// give yours instead and call the source's method of the same name from
// it (see OnRetry).
func (s *ClientSource) Options() []interceptor.ClientOption {
	return []interceptor.ClientOption{
		interceptor.WithOnStateChange(s.OnStateChange),
		interceptor.WithOnRetry(s.OnRetry),
		interceptor.WithOnStop(s.OnStop),
	}
}

// Attach makes c the Client whose state the view shows under the source's
// name, and the one its write actions act on. Attach a Client built with
// the source's hooks; attaching another replaces it (after a rebuild).
func (s *ClientSource) Attach(c *interceptor.Client) { s.c.Store(c) }

// Close removes the source from its View: its name is free again, and its
// Client is no longer shown. Its events stay in the log until newer ones
// push them out. Its hooks, still installed in the Client, keep recording
// them.
func (s *ClientSource) Close() {
	s.v.mu.Lock()
	if s.v.clients[s.name] == s {
		delete(s.v.clients, s.name)
	}
	s.v.mu.Unlock()
	s.c.Store(nil)
}

func (s *ClientSource) key(part adminv1.Part, subject string) partKey {
	return partKey{side: sideClient, source: s.name, part: part, subject: subject}
}

// OnRetry is the hook of interceptor.WithOnRetry: a failed attempt about
// to be retried is kept among its method's recent failures (hedged copies,
// which are not failures, are not). Call it from your own hook to keep
// both.
func (s *ClientSource) OnRetry(_ context.Context, e interceptor.RetryEvent) {
	if e.Hedge || e.Err == nil {
		return
	}
	s.fails.add(e.FullMethod, failure{time: s.v.opts.now(), code: status.Code(e.Err), err: e.Err})
}

// stopPart maps the reasons a call stopped that are a refusal by one of
// the client's parts to that part and the reason's token; an open
// breaker's refusals are told by its transition, and are left out here,
// so that callers spinning on an open breaker pay nothing more.
func stopPart(r interceptor.StopReason) (adminv1.Part, string, bool) {
	switch r {
	case interceptor.StopBulkheadFull:
		return adminv1.Part_PART_BULKHEAD, "bulkhead_full", true
	case interceptor.StopAdaptiveThrottle:
		return adminv1.Part_PART_ADAPTIVE, "adaptive_throttle", true
	case interceptor.StopBudget:
		return adminv1.Part_PART_RETRY_BUDGET, "retry_budget", true
	case interceptor.StopThrottled:
		return adminv1.Part_PART_RETRY_THROTTLING, "retry_throttling", true
	case interceptor.StopRateLimited:
		return adminv1.Part_PART_RATE_LIMIT, "rate_limited", true
	}
	return 0, "", false
}

// lastAttemptFailed reports whether a call that stopped for r ended with
// the error of an attempt that ran and failed (rather than a refusal, a
// cancellation or a commit).
func lastAttemptFailed(r interceptor.StopReason) bool {
	switch r {
	case interceptor.StopExhausted, interceptor.StopNonRetryable, interceptor.StopDeadline, interceptor.StopPushback,
		interceptor.StopThrottled, interceptor.StopBudget, interceptor.StopNoRetry:
		return true
	}
	return false
}

// OnStop is the hook of interceptor.WithOnStop: the failure of the call's
// last attempt is kept among its method's recent failures, and a refusal
// by one of the client's parts (a full bulkhead, adaptive throttling, the
// retry budget or A6 throttling withholding a retry) is recorded as an
// event, one per episode of refusals. Call it from your own hook to keep
// both.
func (s *ClientSource) OnStop(_ context.Context, e interceptor.StopEvent) {
	failed := lastAttemptFailed(e.Reason) && e.Err != nil && e.Attempts > 0
	part, reason, refused := stopPart(e.Reason)
	if !failed && !refused {
		return // an open breaker's refusal, a cancellation, a commit: nothing to keep, not even the time
	}
	now := s.v.opts.now()
	if failed {
		s.fails.add(e.FullMethod, failure{time: now, code: status.Code(e.Err), err: e.Err})
	}
	if !refused {
		return
	}
	key, kind := s.key(part, e.FullMethod), adminv1.EventKind_EVENT_KIND_REFUSED
	if s.v.events.bump(key, kind, episode{reason: reason}, now) {
		return // the episode under way counts it: nothing built
	}
	ev := &event{key: key, kind: kind, reason: reason, code: rescodes.Name(status.Code(e.Err))}
	switch e.Reason {
	case interceptor.StopBulkheadFull:
		ev.cause = "bulkhead full: no slot within its queue bounds"
	case interceptor.StopAdaptiveThrottle:
		ev.cause = "adaptive throttling rejected the attempt locally (the backend has been refusing)"
	case interceptor.StopBudget:
		ev.cause = "retry budget spent: a retry was not sent after " + describeErr(e.Err)
	case interceptor.StopThrottled:
		ev.cause = "retry throttling (gRFC A6) withheld a retry after " + describeErr(e.Err)
	case interceptor.StopRateLimited:
		ev.cause = s.rateLimitedCause(e)
	}
	s.v.events.refuse(ev, now)
}

// rateLimitedCause says why the method's rateLimit block refused a call:
// its own rate, or the pace a server's pushback set, as the Client's
// status shows it now.
func (s *ClientSource) rateLimitedCause(e interceptor.StopEvent) string {
	cause := "rate limited locally (the method's rateLimit block)"
	if c := s.c.Load(); c != nil {
		if rl := c.Status(e.FullMethod).RateLimit; rl != nil && !rl.PacedUntil.IsZero() {
			return cause + fmt.Sprintf(": paced by the server's pushback: one attempt per %v, next slot at %s", rl.Period, rl.PacedUntil.Format("15:04:05.000"))
		}
	}
	var rej *interceptor.RejectedError
	if errors.As(e.Err, &rej) && rej.RetryAfter > 0 {
		return cause + fmt.Sprintf(": no token within its maxWait or the deadline; retry after %v", rej.RetryAfter)
	}
	return cause + ": no token within its maxWait or the deadline"
}

// describeErr is "CODE: message" of err.
func describeErr(err error) string {
	st := status.Convert(err)
	return rescodes.Name(st.Code()) + ": " + strconv.Quote(cut(st.Message()))
}

// OnStateChange is the hook of interceptor.WithOnStateChange: each change
// of a breaker's state is an event, its cause the failed attempts heard of
// before it opened (as many as the breaker's thresholds needed, at most
// 8), when and until when it opened. Call it from your own hook to keep
// both.
func (s *ClientSource) OnStateChange(fullMethod string, from, to interceptor.BreakerState) {
	ev := &event{key: s.key(adminv1.Part_PART_BREAKER, fullMethod), kind: adminv1.EventKind_EVENT_KIND_BREAKER_STATE,
		from: from.String(), to: to.String()}
	switch to {
	case interceptor.BreakerOpen:
		ev.fails = s.fails.recent(fullMethod)
		ev.cause = openCause(from, ev.fails)
		if c := s.c.Load(); c != nil {
			if b := c.Status(fullMethod).Breaker; b != nil && !b.OpenUntil.IsZero() {
				ev.cause += fmt.Sprintf("; trip %d, open until %s", b.Trips, b.OpenUntil.Format("15:04:05.000"))
				ev.until = b.OpenUntil
			}
		}
	case interceptor.BreakerHalfOpen:
		ev.cause = "open time ended: letting probes through"
	case interceptor.BreakerClosed:
		if from == interceptor.BreakerHalfOpen {
			ev.cause = "probes succeeded"
		} else {
			ev.cause = "reset"
		}
	case interceptor.BreakerForcedOpen:
		ev.cause = "forced open (ForceOpen): every call is rejected until a reset"
	case interceptor.BreakerForcedClosed:
		ev.cause = "forced closed (ForceClosed): every call is admitted until a reset"
	}
	s.v.events.add(ev)
}

// openCause says what opened a breaker: the failures heard of, counted by
// code, and the latest's message.
func openCause(from interceptor.BreakerState, fails []failure) string {
	var b strings.Builder
	if from == interceptor.BreakerHalfOpen {
		b.WriteString("a probe failed")
	} else {
		b.WriteString("opened on failures")
	}
	if len(fails) == 0 {
		b.WriteString(" (none heard of: failures reach the view through the Client's retry and stop hooks, so a method without a retry policy shows none)")
		return b.String()
	}
	fmt.Fprintf(&b, "; the %d failed attempts heard of before it: ", len(fails))
	var order []string
	counts := map[string]int{}
	for _, f := range fails {
		name := rescodes.Name(f.code)
		if counts[name] == 0 {
			order = append(order, name)
		}
		counts[name]++
	}
	for i, name := range order {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s ×%d", name, counts[name])
	}
	fmt.Fprintf(&b, "; the latest: %s", strconv.Quote(fails[len(fails)-1].message()))
	return b.String()
}

// snapshot reads the attached Client at now.
func (s *ClientSource) snapshot(now time.Time) *adminv1.Client {
	out := &adminv1.Client{Name: s.name}
	c := s.c.Load()
	if c == nil {
		return out
	}
	statuses := c.Statuses()
	listed := make(map[string]bool, len(statuses))
	for _, st := range statuses {
		listed[st.FullMethod] = true
	}
	// The methods without a guard that failed recently are listed too,
	// with their policy: a retried method's failures are in the view.
	for _, fm := range s.fails.methods() {
		if !listed[fm] {
			statuses = append(statuses, interceptor.MethodStatus{FullMethod: fm})
		}
	}
	slices.SortFunc(statuses, func(a, b interceptor.MethodStatus) int { return strings.Compare(a.FullMethod, b.FullMethod) })
	for _, st := range statuses {
		m := &adminv1.Method{FullMethod: st.FullMethod}
		p := c.Policy(st.FullMethod)
		m.PolicySource, m.Policy = p.Source, policyJSON(p)
		if b := st.Breaker; b != nil {
			m.Breaker = breakerProto(b)
		}
		if a := st.Adaptive; a != nil {
			m.Adaptive = &adminv1.Adaptive{Requests: a.Requests, Accepts: a.Accepts, RejectProbability: a.RejectProbability}
		}
		if bh := st.Bulkhead; bh != nil {
			m.Bulkhead = &adminv1.Bulkhead{InFlight: int64(bh.InFlight), Queued: int64(bh.Queued)}
		}
		if rl := st.RateLimit; rl != nil {
			m.RateLimit = &adminv1.ClientRateLimit{Waiting: int64(rl.Waiting)}
			if !rl.PacedUntil.IsZero() {
				m.RateLimit.PacedUntil, m.RateLimit.Period = ts(rl.PacedUntil), durationpb.New(rl.Period)
			}
		}
		if d, ok := c.HedgingDelay(st.FullMethod); ok {
			m.HedgingDelay = durationpb.New(d)
		}
		for _, f := range s.fails.recent(st.FullMethod) {
			m.RecentFailures = append(m.RecentFailures, f.proto())
		}
		out.Methods = append(out.Methods, m)
	}
	rs := c.RetryStatus()
	if b := rs.Budget; b != nil {
		out.RetryBudget = &adminv1.RetryBudget{Available: b.Available}
	}
	if t := rs.Throttling; t != nil {
		out.RetryThrottling = &adminv1.RetryThrottling{Tokens: t.Tokens, MaxTokens: t.MaxTokens}
	}
	return out
}

func breakerProto(b *interceptor.BreakerStatus) *adminv1.Breaker {
	out := &adminv1.Breaker{State: breakerState(b.State), Calls: int64(b.Calls), Failures: int64(b.Failures),
		SlowCalls: int64(b.SlowCalls), ConsecutiveFailures: int64(b.ConsecutiveFailures), Probes: int64(b.Probes), Trips: b.Trips}
	if !b.OpenUntil.IsZero() {
		out.OpenUntil = ts(b.OpenUntil)
	}
	return out
}

func breakerState(s interceptor.BreakerState) adminv1.BreakerState {
	switch s {
	case interceptor.BreakerClosed:
		return adminv1.BreakerState_BREAKER_STATE_CLOSED
	case interceptor.BreakerOpen:
		return adminv1.BreakerState_BREAKER_STATE_OPEN
	case interceptor.BreakerHalfOpen:
		return adminv1.BreakerState_BREAKER_STATE_HALF_OPEN
	case interceptor.BreakerForcedOpen:
		return adminv1.BreakerState_BREAKER_STATE_FORCED_OPEN
	case interceptor.BreakerForcedClosed:
		return adminv1.BreakerState_BREAKER_STATE_FORCED_CLOSED
	}
	return adminv1.BreakerState_BREAKER_STATE_UNSPECIFIED
}

// maxPolicy bounds a method's policy in the view, in bytes.
const maxPolicy = 1024

// policyJSON returns p's entry as a service config's methodConfig entry in
// JSON, cut to maxPolicy bytes; "" when none applies or it has no
// document form (serviceconfig.Config.MarshalJSON).
func policyJSON(p interceptor.MethodPolicy) string {
	if p.Source == "" {
		return ""
	}
	doc, err := json.Marshal(serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{p.Config}})
	if err != nil {
		return ""
	}
	var one struct {
		MethodConfig []json.RawMessage `json:"methodConfig"`
	}
	if json.Unmarshal(doc, &one) != nil || len(one.MethodConfig) != 1 {
		return ""
	}
	out := string(one.MethodConfig[0])
	if len(out) > maxPolicy {
		out = strings.ToValidUTF8(out[:maxPolicy], "") + "…"
	}
	return out
}
