package main

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/internal/backoff"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// retryView is a retry policy with every default resolved as the client
// resolves it, and which fields took their default.
type retryView struct {
	maxAttempts int // capped
	asked       int // what the document asked for, before the cap
	b           backoff.Config
	jitter      serviceconfig.Jitter // never ""
	codes       rescodes.Set         // the retryable codes when explicit
	explicit    bool                 // codes was written out; else the default rules
	perAttempt  time.Duration        // 0: none

	defMaxAttempts, defInitial, defMax, defMultiplier, defJitter bool
}

// newRetryView resolves p; raw is the same policy parsed without a cap.
func newRetryView(p, raw *serviceconfig.RetryPolicy, maxAttemptsCap int) retryView {
	v := retryView{
		maxAttempts: p.MaxAttempts,
		asked:       raw.MaxAttempts,
		b: backoff.Config{
			Initial:    p.InitialBackoff,
			Max:        p.MaxBackoff,
			Multiplier: p.BackoffMultiplier,
		},
		jitter:     p.Jitter,
		codes:      rescodes.Of(p.RetryableStatusCodes...),
		explicit:   len(p.RetryableStatusCodes) > 0,
		perAttempt: p.PerAttemptRecvTimeout,
	}
	if v.maxAttempts == 0 {
		v.maxAttempts, v.asked, v.defMaxAttempts = serviceconfig.DefaultMaxAttempts, serviceconfig.DefaultMaxAttempts, true
	}
	v.maxAttempts = min(v.maxAttempts, maxAttemptsCap)
	if v.b.Initial == 0 {
		v.b.Initial, v.defInitial = serviceconfig.DefaultInitialBackoff, true
	}
	if v.b.Max == 0 {
		v.b.Max, v.defMax = serviceconfig.DefaultMaxBackoff, true
	}
	if v.b.Multiplier == 0 {
		v.b.Multiplier, v.defMultiplier = serviceconfig.DefaultBackoffMultiplier, true
	}
	if v.jitter == "" {
		v.jitter, v.defJitter = serviceconfig.JitterA6, true
	}
	v.b.Jitter = jitterOf(v.jitter)
	return v
}

// jitterOf maps a policy's jitter to the engine's. Validate has refused
// unknown names, so the fallback to A6 is never taken.
func jitterOf(j serviceconfig.Jitter) backoff.Jitter {
	bj, _ := backoff.JitterNamed(string(j))
	return bj
}

// analysis is what both commands say about one entry: its schedule and its
// foot-guns.
type analysis struct {
	retry *retryView // nil without a retry policy
	// attemptTime is the longest an attempt takes in the schedule;
	// attemptFrom says where it comes from: "-attempt-time",
	// "perAttemptRecvTimeout", or "" when neither gives one (0).
	attemptTime time.Duration
	attemptFrom string
	// attempts is the policy's number of attempts (or hedged copies), and
	// steps their schedule, of the first scheduleLimit at most; both are
	// zero without a retry or hedging policy.
	attempts int
	steps    []step
	warnings []string
}

// The codes a retry cannot fix: the request itself is wrong, or the caller
// gave up. The client's default rules never retry them.
var pointless = rescodes.NeverRetried

// The codes that may come after the server acted on the request.
var unsafe = rescodes.Of(codes.Unknown, codes.Internal, codes.DataLoss)

// scheduleLimit bounds the attempts a schedule is computed for, whatever
// cap -max-attempts-cap allows.
const scheduleLimit = 1000

// analyze computes the schedule of mc and its warnings; raw is mc parsed
// without a cap on maxAttempts.
func analyze(mc, raw serviceconfig.MethodConfig, opts options, maxAttemptsCap int) analysis {
	var a analysis
	warnf := func(format string, args ...any) { a.warnings = append(a.warnings, fmt.Sprintf(format, args...)) }
	if len(mc.Name) == 0 {
		warnf("the entry's name list is empty: it selects no method")
	}
	if opts.attemptSet {
		a.attemptTime, a.attemptFrom = opts.attemptTime, "-attempt-time"
	}
	switch {
	case mc.RetryPolicy != nil:
		rawPolicy := mc.RetryPolicy
		if raw.RetryPolicy != nil {
			rawPolicy = raw.RetryPolicy
		}
		v := newRetryView(mc.RetryPolicy, rawPolicy, maxAttemptsCap)
		a.retry = &v
		if !opts.attemptSet && v.perAttempt > 0 {
			a.attemptTime, a.attemptFrom = v.perAttempt, "perAttemptRecvTimeout"
		}
		a.attempts = v.maxAttempts
		a.steps = retrySchedule(v.b, min(v.maxAttempts, scheduleLimit), a.attemptTime)
		if v.asked > v.maxAttempts {
			warnf("retryPolicy.maxAttempts %d is above the cap of %d and is lowered to %d "+
				"(to keep it, parse it with serviceconfig.WithMaxAttemptsCap(%d) and run this with -max-attempts-cap %[4]d)",
				v.asked, maxAttemptsCap, v.maxAttempts, v.asked)
		}
		if v.b.Max < v.b.Initial {
			warnf("retryPolicy.maxBackoff %v is below initialBackoff %v: every delay is capped at %v before jitter, so the backoff never grows",
				v.b.Max, v.b.Initial, v.b.Max)
		}
		if mc.Timeout > 0 && v.perAttempt >= mc.Timeout {
			warnf("retryPolicy.perAttemptRecvTimeout %v is not below the timeout %v: one slow attempt uses the whole deadline and leaves no time to retry",
				v.perAttempt, mc.Timeout)
		}
		if s := v.codes & pointless; v.explicit && !s.IsEmpty() {
			warnf("retryPolicy.retryableStatusCodes lists %s: a retry cannot fix %s, the server gives the same answer",
				codeList(s), them(s))
		}
		if s := v.codes & unsafe; v.explicit && !s.IsEmpty() {
			warnf("retryPolicy.retryableStatusCodes lists %s: the server may have acted on the request before failing, "+
				"so a retry can apply a non-idempotent method twice; list %s only for idempotent methods",
				codeList(s), them(s))
		}
		if mc.Timeout > 0 {
			for _, s := range a.steps {
				if s.end <= mc.Timeout {
					continue
				}
				if s.attempt == 1 {
					warnf("attempt 1 takes up to %s, past the %v timeout: the deadline cuts it short and no retry follows",
						fmtDur(s.end), mc.Timeout)
				} else {
					warnf("attempt %d does not fit in the %v timeout in the worst case: it starts by %v and ends by %v. "+
						"The client skips a retry whose delay and expected duration overrun the deadline, "+
						"so the call may end after attempt %d",
						s.attempt, mc.Timeout, fmtDur(s.start), fmtDur(s.end), s.attempt-1)
				}
				break
			}
		}
	case mc.HedgingPolicy != nil:
		h := mc.HedgingPolicy
		asked := h.MaxAttempts
		if raw.HedgingPolicy != nil {
			asked = raw.HedgingPolicy.MaxAttempts
		}
		a.attempts = h.MaxAttempts
		n := min(h.MaxAttempts, scheduleLimit)
		if h.HedgingDelayQuantile > 0 && h.HedgingDelay == 0 {
			n = 1 // until the samples, only failures send further copies
		}
		a.steps = hedgeSchedule(h.HedgingDelay, n, a.attemptTime)
		if asked > h.MaxAttempts {
			warnf("hedgingPolicy.maxAttempts %d is above the cap of %d and is lowered to %d "+
				"(to keep it, parse it with serviceconfig.WithMaxAttemptsCap(%d) and run this with -max-attempts-cap %[4]d)",
				asked, maxAttemptsCap, h.MaxAttempts, asked)
		}
		if mc.Timeout > 0 {
			for _, s := range a.steps {
				if s.start >= mc.Timeout {
					warnf("hedged attempt %d would be sent at %s, not before the %v timeout: it is never sent",
						s.attempt, fmtDur(s.start), mc.Timeout)
					break
				}
			}
		}
	}
	return a
}

// codeList writes the codes of s as "INVALID_ARGUMENT, NOT_FOUND".
func codeList(s rescodes.Set) string {
	return strings.ReplaceAll(s.String(), "|", ", ")
}

// them is "it" or "them", for the codes of s.
func them(s rescodes.Set) string {
	if s.Len() == 1 {
		return "it"
	}
	return "them"
}
