package server

import (
	"context"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/internal/limit"
)

// RefusalReason says which part of a Server refused a call, and why.
type RefusalReason uint8

// The reasons a Server refuses a call (or, for RefusalStoreFailedOpen,
// runs it without idempotency).
const (
	// RefusalLimit: the calls in flight filled the call's share of its
	// concurrency limit, and the limit's queue had no room for it
	// (RESOURCE_EXHAUSTED).
	RefusalLimit RefusalReason = iota + 1
	// RefusalQueueTimeout: the call waited in its limit's queue and got no
	// slot (RESOURCE_EXHAUSTED).
	RefusalQueueTimeout
	// RefusalDeadline: the call's remaining deadline was shorter than its
	// limit's service time, so it was refused at the door
	// (DEADLINE_EXCEEDED).
	RefusalDeadline
	// RefusalCPU: the CPU-aware shedder shed the call (RESOURCE_EXHAUSTED).
	RefusalCPU
	// RefusalHeadroom: the call arrived with less of its deadline left
	// than WithHeadroom's headroom and floor (DEADLINE_EXCEEDED).
	RefusalHeadroom
	// RefusalStoreUnavailable: the idempotency store failed to claim the
	// call's key and the Server fails closed (UNAVAILABLE).
	RefusalStoreUnavailable
	// RefusalStoreFull: the idempotency store had no room for the key
	// within the caller's quota (RESOURCE_EXHAUSTED).
	RefusalStoreFull
	// RefusalStoreFailedOpen: the idempotency store failed to claim the
	// call's key and the Server fails open (Idempotency.FailOpen): the
	// call was not refused, it ran without idempotency.
	RefusalStoreFailedOpen
	// RefusalShuttingDown: the call came, or waited in a limit's queue,
	// once Server.Shutdown had begun (UNAVAILABLE).
	RefusalShuttingDown
	// RefusalRateLimit: one or more of the method's rate limits
	// (Limits.Config's rateLimits) had no token for the call
	// (RESOURCE_EXHAUSTED with RetryInfo and QuotaFailure).
	RefusalRateLimit
)

var refusalTokens = [...]string{
	RefusalLimit:            "limit",
	RefusalQueueTimeout:     "queue_timeout",
	RefusalDeadline:         "deadline",
	RefusalCPU:              "cpu",
	RefusalHeadroom:         "headroom",
	RefusalStoreUnavailable: "store_unavailable",
	RefusalStoreFull:        "store_full",
	RefusalStoreFailedOpen:  "store_failed_open",
	RefusalShuttingDown:     "shutting_down",
	RefusalRateLimit:        "rate_limit",
}

// String returns the reason's token: "limit", "queue_timeout",
// "deadline", "cpu" (the reasons of the shed metric), "headroom",
// "store_unavailable", "store_full", "store_failed_open",
// "shutting_down" or "rate_limit"; "unknown" for another value.
func (r RefusalReason) String() string {
	if int(r) < len(refusalTokens) && refusalTokens[r] != "" {
		return refusalTokens[r]
	}
	return "unknown"
}

// Refusal describes a call that a part of the Server refused, for
// WithOnRefusal.
type Refusal struct {
	// FullMethod is the method called, "/pkg.Service/Method".
	FullMethod string
	// Reason says which part refused it, and why.
	Reason RefusalReason
	// Limit names the concurrency limit that refused it, as
	// LimitStatus.Name does ("" the server's limit, CPUSheddingName the
	// CPU-aware shedder), for RefusalLimit, RefusalQueueTimeout,
	// RefusalDeadline and RefusalCPU; for RefusalRateLimit, the name of
	// the first rate limit that refused it (RateLimits names them all).
	Limit string
	// RateLimits names every rate limit that refused the call, in the
	// order they apply (the most specific first), for RefusalRateLimit.
	RateLimits []string
	// Key is the key the first refusing rate limit counts by: the tenant,
	// the caller's IP address or the idempotency scope; "" for a limit
	// shared by every caller. For RefusalRateLimit.
	Key string
	// Wait is how long the caller is told to wait (the RetryInfo), for
	// RefusalRateLimit.
	Wait time.Duration
	// Criticality is the criticality the call was judged by (after
	// Limits.Criticality), for the limits' reasons.
	Criticality wire.Criticality
	// Tenant is the call's tenant under tenant fairness
	// (Limits.Config.TenantFairness), "" without it; Tenants is the number
	// of tenants sharing the limit at the refusal, and OverShare reports
	// that the tenant held its fair share or more, so it was shed before
	// the tenants under theirs. Set for RefusalLimit and
	// RefusalQueueTimeout under tenant fairness; Tenant is also set for
	// RefusalRateLimit when a refusing rate limit counts by tenant.
	Tenant    string
	Tenants   int
	OverShare bool
	// Err is the error the call ended with; for RefusalStoreFailedOpen,
	// the store's error.
	Err error
}

// WithOnRefusal calls f for every call that a part of the Server refuses
// (its concurrency limit, the CPU-aware shedder, the deadline headroom, the
// idempotency store failing or full, Shutdown, its rate limits), and for every call run
// without idempotency because the store failed open, synchronously on the
// call's goroutine before its status returns. f must not block: it runs on
// the refusal path, which overload makes busy. Calls that are admitted
// never reach it, so it costs the calls that succeed nothing. A nil f is
// refused. Without this option nothing is called.
func WithOnRefusal(f func(ctx context.Context, r Refusal)) Option {
	return option{optOnRefusal, func(o *options) {
		if f == nil {
			o.errs = append(o.errs, errorf("WithOnRefusal: nil function"))
			return
		}
		o.onRefusal = f
	}}
}

// refusalHook is WithOnRefusal's hook as the Server and its layers hold
// it (the Server, its idempotency layer, its rate limits); nil: none.
type refusalHook func(context.Context, Refusal)

// report reports r to the hook, if any.
func (h refusalHook) report(ctx context.Context, r Refusal) {
	if h != nil {
		h(ctx, r)
	}
}

// shutdown reports a call of fullMethod refused with errSrvShuttingDown,
// and returns that error.
func (h refusalHook) shutdown(ctx context.Context, fullMethod string) error {
	h.report(ctx, Refusal{FullMethod: fullMethod, Reason: RefusalShuttingDown, Err: errSrvShuttingDown})
	return errSrvShuttingDown
}

// limitRefusal builds the Refusal of a call of fullMethod from tenant that
// l shed at its criticality crit for reason with err; the tenant's
// standing is read only when a hook will see it.
func (s *Server) limitRefusal(ctx context.Context, l *srvLimiter, fullMethod string, crit wire.Criticality, tenant string, reason RefusalReason, err error) {
	if s.onRefusal == nil {
		return
	}
	r := Refusal{FullMethod: fullMethod, Reason: reason, Limit: l.name, Criticality: crit, Tenant: tenant, Err: err}
	if s.limits.tenant != nil && reason != RefusalDeadline {
		sh := l.TenantShare(s.limits.clk.Now(), limit.Criticality(crit), tenant)
		r.Tenants, r.OverShare = sh.Tenants, sh.Over
	}
	s.onRefusal.report(ctx, r)
}
