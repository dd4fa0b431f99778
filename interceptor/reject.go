package interceptor

import (
	"errors"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Sentinels of local rejections. A rejected call never reached the server;
// it is not retried and never counts as a failure of the method.
var (
	// ErrCircuitOpen: the method's circuit breaker is open (or half-open
	// with every probe taken). Its status is UNAVAILABLE.
	ErrCircuitOpen = errors.New("circuit breaker open")
	// ErrBulkheadFull: the method's bulkhead had no slot within its queue
	// bounds. Its status is RESOURCE_EXHAUSTED.
	ErrBulkheadFull = errors.New("bulkhead full")
	// ErrRateLimited: the method's rateLimit block had no token or slot
	// for the attempt within its maxWait and the call's deadline: the
	// client's own rate, or its pace after a server's pushback. Its status
	// is RESOURCE_EXHAUSTED, with a RetryInfo saying when an attempt could
	// go.
	ErrRateLimited = errors.New("rate limited")
)

// RejectedError is a call or attempt that the client refused locally. It
// works with status.Code (UNAVAILABLE for ErrCircuitOpen, RESOURCE_EXHAUSTED
// for ErrBulkheadFull), errors.Is (the sentinel) and errors.As. When
// RetryAfter is known, the status carries it as a google.rpc.RetryInfo
// detail, so that a caller further up that honours RetryInfo waits for the
// next probe instead of hammering.
type RejectedError struct {
	// FullMethod is the method rejected.
	FullMethod string
	// Reason is ErrCircuitOpen (also for adaptive throttling, whose
	// RetryError's Reason is StopAdaptiveThrottle), ErrBulkheadFull or
	// ErrRateLimited.
	Reason error
	// RetryAfter is the time until the breaker lets a probe through, or
	// until the rate limit would let an attempt go, rounded up to 10ms; 0
	// when unknown.
	RetryAfter time.Duration

	// st is the status, built once for a rejection the client made; nil for
	// one built by hand, whose status is built on each call of GRPCStatus.
	st *status.Status
	// stopped is this rejection as the error of a call under a retry policy
	// that it stopped before any attempt ran; nil for one built by hand.
	stopped *RetryError
}

// Error returns a message naming the method and the reason.
func (e *RejectedError) Error() string {
	msg := e.FullMethod + ": " + e.Reason.Error()
	if e.RetryAfter > 0 {
		msg += "; retry after " + e.RetryAfter.String()
	}
	return msg
}

// Unwrap returns Reason.
func (e *RejectedError) Unwrap() error { return e.Reason }

// GRPCStatus returns UNAVAILABLE or RESOURCE_EXHAUSTED with the message of
// Error and, when RetryAfter is known, a RetryInfo detail.
func (e *RejectedError) GRPCStatus() *status.Status {
	if e.st != nil {
		return e.st
	}
	return e.status()
}

func (e *RejectedError) status() *status.Status {
	code := codes.Unavailable
	if errors.Is(e.Reason, ErrBulkheadFull) || errors.Is(e.Reason, ErrRateLimited) {
		code = codes.ResourceExhausted
	}
	st := status.New(code, "resilience: "+e.Error())
	if e.RetryAfter > 0 {
		if withHint, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(e.RetryAfter)}); err == nil {
			return withHint
		}
	}
	return st
}

// retryAfterGranule is the rounding of RejectedError.RetryAfter: rejections
// within one granule of each other share one error.
const retryAfterGranule = 10 * time.Millisecond

// rejections are the rejections of one method, built once and shared by
// the calls they reject, so a rejected call allocates and formats nothing
// (a caller spinning on an open breaker must be cheap: it competes for the
// CPU with the probe that would close it). A shared rejection must not be
// modified; the client never does.
type rejections struct {
	fullMethod string
	// noHint rejects while the breaker is half-open with every probe out,
	// or forced open: RetryAfter is unknown.
	noHint *RejectedError
	full   *RejectedError // the bulkhead's
	// throttled rejects for adaptive throttling: ErrCircuitOpen without a
	// RetryAfter, stopping as StopAdaptiveThrottle.
	throttled *RejectedError
	// open is the latest rejection of an open breaker, for its RetryAfter;
	// replaced when a rejection needs another. limitedLast is the same for
	// the rate limit's.
	open        atomic.Pointer[RejectedError]
	limitedLast atomic.Pointer[RejectedError]
	// anchor is a time read with time.Now less than anchorFor before now
	// (or nil), for now.
	anchor atomic.Pointer[time.Time]
}

// anchorFor is how long a rejections' anchor serves: the wall clock's
// adjustments within it (NTP slews at most 0.5 ms per second) are all that
// its now can miss.
const anchorFor = time.Second

// now returns the current time for a breaker's lock-free check, read on the
// monotonic clock from an anchor read with time.Now at most anchorFor
// before: on virtual machines without a fast wall clock, a third cheaper
// than time.Now, and a caller spinning on an open breaker reads it on every
// call. A new anchor is stored when the last is older (one allocation per
// anchorFor at most).
func (r *rejections) now() time.Time {
	if a := r.anchor.Load(); a != nil {
		if d := time.Since(*a); d < anchorFor {
			return a.Add(d)
		}
	}
	t := time.Now()
	r.anchor.Store(&t)
	return t
}

func newRejections(fullMethod string) *rejections {
	throttled := newRejection(fullMethod, ErrCircuitOpen, 0)
	throttled.stopped.Reason = StopAdaptiveThrottle
	return &rejections{
		fullMethod: fullMethod,
		noHint:     newRejection(fullMethod, ErrCircuitOpen, 0),
		full:       newRejection(fullMethod, ErrBulkheadFull, 0),
		throttled:  throttled,
	}
}

// newRejection returns a rejection with its status and its stopped error
// built.
func newRejection(fullMethod string, reason error, retryAfter time.Duration) *RejectedError {
	e := &RejectedError{FullMethod: fullMethod, Reason: reason, RetryAfter: retryAfter}
	e.st = e.status()
	stop := StopCircuitOpen
	switch reason {
	case ErrBulkheadFull:
		stop = StopBulkheadFull
	case ErrRateLimited:
		stop = StopRateLimited
	}
	e.stopped = &RetryError{Reason: stop, Err: e}
	return e
}

// circuitOpen returns the rejection of an open breaker that lets a probe
// through after retryAfter (0: unknown), rounded up to retryAfterGranule.
func (r *rejections) circuitOpen(retryAfter time.Duration) *RejectedError {
	if retryAfter <= 0 {
		return r.noHint
	}
	d := (retryAfter + retryAfterGranule - 1) / retryAfterGranule * retryAfterGranule
	if e := r.open.Load(); e != nil && e.RetryAfter == d {
		return e
	}
	e := newRejection(r.fullMethod, ErrCircuitOpen, d)
	r.open.Store(e)
	return e
}

// limited returns the rejection of an attempt that the rate limit would
// let go after wait, rounded up to retryAfterGranule (at least one).
// Rejections within one granule share one error.
func (r *rejections) limited(wait time.Duration) *RejectedError {
	d := max((wait+retryAfterGranule-1)/retryAfterGranule*retryAfterGranule, retryAfterGranule)
	if e := r.limitedLast.Load(); e != nil && e.RetryAfter == d {
		return e
	}
	e := newRejection(r.fullMethod, ErrRateLimited, d)
	r.limitedLast.Store(e)
	return e
}
