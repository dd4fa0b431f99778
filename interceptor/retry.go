package interceptor

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
)

// Metadata keys of gRFC A6.
const (
	// previousAttemptsKey is sent on every retry: the number of attempts
	// before this one.
	previousAttemptsKey = "grpc-previous-rpc-attempts"
	// pushbackKey is a server's trailer: wait that many milliseconds before
	// retrying; a negative or malformed value means do not retry.
	pushbackKey = "grpc-retry-pushback-ms"
)

// retrier is the state of one call's retry loop. It lives on the calling
// goroutine's stack and is not shared.
type retrier struct {
	c             *Client
	mp            *methodPolicy
	rp            retryPolicy // the method's policy with call options applied
	wrap          bool        // a retry policy applies: errors are *RetryError
	attempts      int         // attempts started so far
	sincePushback int         // retries since the last server pushback
	prevDelay     time.Duration
}

// retryable reports whether an attempt that ended with code should be
// retried, under the explicit code list when the policy has one and under
// the default rules otherwise.
func (r *retrier) retryable(code codes.Code, attemptTimedOut bool) bool {
	if r.rp.explicit {
		return r.rp.codes.Has(code)
	}
	switch code {
	case codes.DeadlineExceeded:
		return attemptTimedOut
	case codes.Aborted:
		return r.mp.idempotent
	}
	return rescodes.DefaultRetryable.Has(code)
}

// decision is the verdict on a failed attempt.
type decision struct {
	stop     StopReason // StopNone: retry after delay
	delay    time.Duration
	pushback bool // delay is a server's hint
}

// decide says whether and when to retry after an attempt failed with err.
// trailer is the attempt's trailer; attemptTimedOut reports that the
// attempt's own timeout fired while the caller's context was still live.
func (r *retrier) decide(ctx context.Context, err error, trailer metadata.MD, attemptTimedOut bool) decision {
	if cerr := ctx.Err(); cerr != nil {
		return decision{stop: stopOfContext(cerr)}
	}
	code := rescodes.Classify(err)
	if !r.retryable(code, attemptTimedOut) {
		return decision{stop: StopNonRetryable}
	}
	hint, hinted, refuse := serverHint(err, trailer)
	if refuse {
		return decision{stop: StopPushback}
	}
	if r.attempts >= r.rp.maxAttempts {
		return decision{stop: StopExhausted}
	}
	var d decision
	if hinted {
		d.delay, d.pushback = min(hint, r.c.opts.maxPushback), true
		r.sincePushback, r.prevDelay = 0, 0
	} else {
		d.delay = r.rp.backoff.Delay(r.sincePushback, r.prevDelay, r.c.opts.rand())
		r.sincePushback++
		r.prevDelay = d.delay
	}
	if dl, ok := ctx.Deadline(); ok && !r.c.opts.clock.Now().Add(d.delay).Before(dl) {
		return decision{stop: StopDeadline}
	}
	return d
}

func stopOfContext(err error) StopReason {
	if err == context.DeadlineExceeded {
		return StopDeadline
	}
	return StopCancelled
}

// serverHint reads a server's retry hint: the grpc-retry-pushback-ms trailer
// (gRFC A6), or else a google.rpc.RetryInfo status detail. refuse is true
// when the server said not to retry: a negative, malformed or repeated value.
func serverHint(err error, trailer metadata.MD) (d time.Duration, ok, refuse bool) {
	if vals := trailer[pushbackKey]; len(vals) > 0 {
		if len(vals) > 1 {
			return 0, false, true
		}
		ms, perr := strconv.ParseInt(vals[0], 10, 64)
		if perr != nil || ms < 0 {
			return 0, false, true
		}
		if ms > int64(time.Duration(1<<63-1)/time.Millisecond) {
			return time.Duration(1<<63 - 1), true, false
		}
		return time.Duration(ms) * time.Millisecond, true, false
	}
	if _, isStatus := err.(interface{ GRPCStatus() *status.Status }); !isStatus {
		return 0, false, false
	}
	st := status.Convert(err)
	if len(st.Proto().GetDetails()) == 0 {
		return 0, false, false
	}
	found := 0
	for _, det := range st.Details() {
		ri, isRI := det.(*errdetails.RetryInfo)
		if !isRI || ri.GetRetryDelay() == nil {
			continue
		}
		found++
		dd := ri.GetRetryDelay()
		if dd.CheckValid() != nil || dd.AsDuration() < 0 {
			return 0, false, true
		}
		d = dd.AsDuration()
	}
	switch found {
	case 0:
		return 0, false, false
	case 1:
		return d, true, false
	}
	return 0, false, true
}

// wait sleeps for d on the client's clock, or until ctx is done.
func (r *retrier) wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := r.c.opts.clock.NewTimer(d)
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
}

// attemptContext returns the context of attempt n (1 for the first): the
// caller's, with grpc-previous-rpc-attempts on retries.
func attemptContext(ctx context.Context, n int) context.Context {
	if n <= 1 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, previousAttemptsKey, strconv.Itoa(n-1))
}

// fail returns the error of a call that stopped retrying after err.
func (r *retrier) fail(err error, reason StopReason) error {
	return r.stopped(err, err, reason)
}

// stopped returns the error of a call that ends with err after the attempt
// that failed with lastErr (nil when none ran): err itself when no retry
// policy applies to the call, else a *RetryError around it.
func (r *retrier) stopped(err, lastErr error, reason StopReason) error {
	if !r.wrap {
		return err
	}
	return &RetryError{Attempts: r.attempts, Reason: reason, Err: err, LastAttemptErr: lastErr}
}

// cancelled returns the error of a call whose context ended during a
// backoff that followed lastErr.
func (r *retrier) cancelled(cerr, lastErr error) error {
	return &RetryError{
		Attempts:       r.attempts,
		Reason:         stopOfContext(cerr),
		Err:            status.FromContextError(cerr).Err(),
		LastAttemptErr: lastErr,
	}
}

// onRetry calls the user's hook, if any.
func (r *retrier) onRetry(ctx context.Context, err error, d decision) {
	if f := r.c.opts.onRetry; f != nil {
		f(ctx, RetryEvent{FullMethod: r.mp.fullMethod, Attempt: r.attempts, Err: err, Delay: d.delay, Pushback: d.pushback})
	}
}
