package interceptor

import (
	"context"
	"strconv"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/internal/pushback"
	"github.com/grpc-resilience/resilience/interceptor/wire"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/deadline"
	"github.com/grpc-resilience/resilience/internal/budget"
	"github.com/grpc-resilience/resilience/internal/ratelimit"
)

// Metadata keys of gRFC A6.
const (
	// previousAttemptsKey is sent on every retry: the number of attempts
	// before this one.
	previousAttemptsKey = "grpc-previous-rpc-attempts"
	// pushbackKey is a server's trailer: wait that many milliseconds before
	// retrying; a negative or malformed value means do not retry.
	pushbackKey = pushback.Key
)

// retrier is the state of one call's retry loop. It lives on the calling
// goroutine's stack and is not shared.
type retrier struct {
	ctx           context.Context // the caller's, for hooks and metrics
	c             *Client
	st            *clientState
	mp            *methodPolicy
	mm            *methodMetrics // the call's attribute sets: its method's or "other"; nil when metrics are off
	rp            retryPolicy    // the method's policy with call options applied
	wrap          bool           // a retry policy applies: errors are *RetryError
	attempts      int            // attempts started so far
	sincePushback int            // retries since the last server pushback
	prevDelay     time.Duration
	pending       budget.Retry // the budget's token for the retry in flight
	noRetry       StopReason   // StopNoRetry when retrying is off for this call
	lastErr       error        // the last attempt's error (streams)
	keyed         bool         // the call carries an idempotency key
	hedged        bool         // the call runs under a hedging policy (gRFC A96 counts hedges)
	// attemptByCaller: the per-attempt timeout is the caller's call option,
	// not the policy's; the endpoint policy must not count its expiry (see
	// trailBound).
	attemptByCaller bool
	waited          time.Duration // time spent with no attempt running (gRFC A96's retry_delay)
	// paceHeld: the next attempt holds its slot of the method's pace,
	// taken by decide for the wait after a server's pushback; the attempt
	// passes the gate without another while that slot is of the pacing in
	// force (guards.admit, rateGate.take). paceSlot names that
	// slot (the zero Ticket when the pacing ended before decide took it),
	// for dropSlot.
	paceHeld bool
	paceSlot ratelimit.Ticket
}

// retryable reports whether an attempt that ended with code should be
// retried, under the explicit code list when the policy has one and under
// the default rules otherwise.
//
// Under the default rules, an idempotent call (its method declared
// idempotent, or the call keyed) may also retry ABORTED, and
// DEADLINE_EXCEEDED from the server while the caller's deadline holds.
func (r *retrier) retryable(code codes.Code, attemptTimedOut bool) bool {
	if r.rp.explicit {
		return r.rp.codes.Has(code)
	}
	idempotent := r.mp.idempotent || r.keyed
	switch code {
	case codes.DeadlineExceeded:
		return attemptTimedOut || idempotent
	case codes.Aborted:
		return idempotent
	}
	return rescodes.DefaultRetryable.Has(code)
}

// decision is the verdict on a failed attempt.
type decision struct {
	stop     StopReason // StopNone: retry after delay
	delay    time.Duration
	pushback bool // delay is a server's hint
}

// failure is what failed found of an attempt's failure.
type failure struct {
	cerr           error         // the caller's end, or nil
	hint           time.Duration // the server's pushback, when hinted
	hinted, refuse bool          // pushback.Hint's
	retryable      bool          // the failure is one the policy retries
	throttled      bool          // A6 throttling refuses the next attempt
}

// failed does the accounting of an attempt that failed with err, before
// anything is decided: gRFC A6 throttling counts it, and the retry's
// budget token stays spent for a failure the policy retries while the
// caller waits, and goes back otherwise. decide, and a unary call whose
// user code aborted after the attempt's release (failedAborted), start
// with it.
func (r *retrier) failed(ctx context.Context, err error, trailer metadata.MD, attemptTimedOut bool) failure {
	f := failure{cerr: callerErr(ctx)}
	f.hint, f.hinted, f.refuse = pushback.Hint(err, trailer)
	f.retryable = r.retryableFailure(err, attemptTimedOut, f.cerr != nil)
	f.throttled = r.failedForThrottle(f.refuse, f.retryable)
	r.settle(f.retryable && f.cerr == nil)
	return f
}

// decide says whether and when to retry after an uncommitted attempt failed
// with err. trailer is the attempt's trailer; attemptTimedOut reports that
// the attempt's own timeout fired while the caller's context was still
// live.
//
// The A6 throttle is charged first, as grpc-go charges it
// (failedForThrottle), even when the caller's context has ended. The stops
// follow in gRFC A6's order, with this client's additions: the caller's
// context, the code, the server's pushback, A6 throttling, attempts left,
// the deadline, and last the retry budget, so that a budget token is only
// taken for a retry that will be sent.
func (r *retrier) decide(ctx context.Context, err error, trailer metadata.MD, attemptTimedOut bool) decision {
	f := r.failed(ctx, err, trailer, attemptTimedOut)
	switch {
	case f.cerr != nil:
		return decision{stop: stopOfContext(f.cerr)}
	case !f.retryable:
		return decision{stop: StopNonRetryable}
	case f.refuse:
		return decision{stop: StopPushback}
	case f.throttled:
		return r.skip(StopThrottled)
	case r.attempts >= r.rp.maxAttempts:
		return decision{stop: StopExhausted}
	}
	var d decision
	if f.hinted {
		d.delay, d.pushback = min(f.hint, r.c.opts.maxPushback), true
		r.sincePushback, r.prevDelay = 0, 0
	} else {
		d.delay = r.rp.backoff.Delay(r.sincePushback, r.prevDelay, r.c.opts.rand())
		r.sincePushback++
		r.prevDelay = d.delay
	}
	now := time.Now()
	if q := r.mp.g.rate; q != nil && f.hinted && q.pace.Active() {
		// The method is paced by the server's wait: the retry takes its
		// slot now, in line with the method's other attempts, and waits
		// for it, which is the hint unless others took the slots before.
		w, tk, ok := q.retrySlot(ctx, now, f.hint)
		if !ok {
			return r.skip(StopRateLimited)
		}
		d.delay, r.paceHeld, r.paceSlot = max(d.delay, w), true, tk
	}
	if dl, ok := ctx.Deadline(); ok {
		if !deadline.Fit(dl, now, d.delay, r.estimate(), r.c.opts.headroom).OK() {
			return r.skip(StopDeadline) // stopped gives the slot back
		}
	}
	if b := r.st.storm.budget; b != nil {
		tok, ok := b.TryRetry(now)
		if !ok {
			return r.skip(StopBudget) // stopped gives the slot back
		}
		r.pending = tok
	}
	return d
}

// dropSlot gives back the slot of the method's pace that decide took for
// a retry that will not be sent.
func (r *retrier) dropSlot() {
	if r.paceHeld {
		r.mp.g.rate.pace.Cancel(time.Now(), r.paceSlot)
		r.paceHeld, r.paceSlot = false, 0
	}
}

// retryableFailure reports whether err, the error of an uncommitted
// attempt, has a code the call's retry policy retries. Message errors never
// are; nor is the caller's own DEADLINE_EXCEEDED under the default rules
// (callerDone: the caller's context has ended), while an explicit list is
// honoured as written, for the throttle's accounting.
func (r *retrier) retryableFailure(err error, attemptTimedOut, callerDone bool) bool {
	if isMessageError(err) {
		return false
	}
	code := rescodes.Classify(err)
	if callerDone && !r.rp.explicit && code == codes.DeadlineExceeded {
		return false
	}
	return r.retryable(code, attemptTimedOut)
}

// failedForThrottle does gRFC A6's throttle accounting of an uncommitted
// attempt that failed, in grpc-go's order (csAttempt.shouldRetry): a
// pushback that says not to retry (refuse) is a failure whatever the code,
// and else a code the call's retry policy retries (retryable) is one. It
// reports whether the throttle now withholds retries; false when A6
// throttling is off or the attempt was no failure for it.
func (r *retrier) failedForThrottle(refuse, retryable bool) (throttled bool) {
	th := r.st.storm.throttle
	if th == nil || !refuse && !retryable {
		return false
	}
	return !th.OnFailure()
}

// noRetryFailed does the A6 throttle accounting of an uncommitted attempt
// that failed with err on a call that never retries (one attempt): without
// a retry policy, only a pushback that says not to retry counts, as in
// grpc-go; with one that the call options turned off, its retryable codes
// count too.
func (r *retrier) noRetryFailed(ctx context.Context, err error, trailer metadata.MD, attemptTimedOut bool) {
	_, _, refuse := pushback.Hint(err, trailer)
	retryable := r.wrap && r.retryableFailure(err, attemptTimedOut, callerErr(ctx) != nil)
	r.failedForThrottle(refuse, retryable)
}

// grpcMessagePrefix is the length of the prefix gRPC puts before every
// message on the wire (a compressed flag and a 4-byte length), which
// grpc-go counts against its per-call retry buffer.
const grpcMessagePrefix = 5

// estimate returns how long the method's next attempt is expected to take.
func (r *retrier) estimate() time.Duration {
	if e := r.mp.latency; e != nil {
		return e.Estimate()
	}
	return r.c.opts.estimateFloor
}

// settle closes the account of the retry in flight, if any: its budget
// token is refunded unless it failed with a retryable code. A retry that
// was never sent settles with false.
func (r *retrier) settle(failedRetryably bool) {
	if r.pending == (budget.Retry{}) {
		return
	}
	if !failedRetryably {
		r.st.storm.budget.Refund(r.pending)
	}
	r.pending = budget.Retry{}
}

func stopOfContext(err error) StopReason {
	if err == context.DeadlineExceeded {
		return StopDeadline
	}
	return StopCancelled
}

// wait sleeps for d, or until ctx is done. It uses package time, as the
// contexts it races with do (testing/synctest fakes both).
func (r *retrier) wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	start := time.Now()
	t := time.NewTimer(d)
	var err error
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		err = ctx.Err()
	}
	r.waited += time.Since(start)
	return err
}

// attemptContext returns the context of attempt n (1 for the first): the
// caller's, with grpc-previous-rpc-attempts on retries and hedged copies,
// and with the criticality SHEDDABLE_PLUS under wire.CriticalityKey, which
// a server combines with the caller's criticality by taking the lower (see
// wire.CriticalityKey). The first attempt's context is the caller's,
// untouched.
func attemptContext(ctx context.Context, n int) context.Context {
	if n <= 1 {
		return ctx
	}
	if n-1 < len(retryAttemptMD) {
		return metadata.AppendToOutgoingContext(ctx, retryAttemptMD[n-1]...)
	}
	return metadata.AppendToOutgoingContext(ctx, previousAttemptsKey, strconv.Itoa(n-1), wire.CriticalityKey, retryCriticality)
}

// retryCriticality is the criticality of retries and hedged copies, at most.
const retryCriticality = "SHEDDABLE_PLUS"

// retryAttemptMD[k] is the metadata of attempt k+1, built once.
var retryAttemptMD = func() (md [8][]string) {
	for k := 1; k < len(md); k++ {
		md[k] = []string{previousAttemptsKey, strconv.Itoa(k), wire.CriticalityKey, retryCriticality}
	}
	return md
}()

// stopped returns the error of a call that ends with err after the attempt
// that failed with lastErr (nil when none ran): err itself when no retry
// policy applies to the call, else a *RetryError around it. Every way a
// call that decided to retry ends without that retry's attempt comes here
// (decide's refusals, the caller giving up during the wait, no time left
// after it: outOfTime), so the slot of the pace the retry took is given
// back here.
func (r *retrier) stopped(err, lastErr error, reason StopReason) error {
	r.dropSlot()
	if !r.wrap {
		return err
	}
	err = &RetryError{Attempts: r.attempts, Reason: reason, Err: err, LastAttemptErr: lastErr}
	r.reportStop(reason, err)
	return err
}

// reportStop tells the metrics and the OnStop hook that the call stopped
// for reason with err.
func (r *retrier) reportStop(reason StopReason, err error) {
	r.onStopped(reason, err)
	if f := r.c.opts.onStop; f != nil {
		f(r.ctx, StopEvent{FullMethod: r.mp.fullMethod, Attempts: r.attempts, Reason: reason, Err: err})
	}
}

// rejected returns the error of a call whose attempt the guards refused
// with rej, after the attempt that failed with lastErr (nil when none ran).
// A call refused before its first attempt returns the rejection's prebuilt
// error, so that a rejection allocates nothing.
func (r *retrier) rejected(rej *RejectedError, lastErr error, reason StopReason) error {
	if !r.wrap || r.attempts > 0 || rej.stopped == nil {
		return r.stopped(rej, lastErr, reason)
	}
	r.reportStop(reason, rej.stopped)
	return rej.stopped
}

// cancelled returns the error of a call whose context ended during a
// backoff that followed lastErr.
func (r *retrier) cancelled(cerr, lastErr error) error {
	r.settle(false)
	return r.stopped(status.FromContextError(cerr).Err(), lastErr, stopOfContext(cerr))
}

// onRetry calls the user's hook, if any, and records the retry on the
// caller's span and in the metrics, in that order. All three are the
// user's code (the hook, the tracer, the meter provider): one that panics
// (or calls runtime.Goexit) ends the call with the retry unsent, so the
// slot of the pace and the budget token decide took for it go back, and
// the panic goes on. The retries metric counts retries sent, so it comes
// last: a retry whose hook or span event aborted is not counted.
func (r *retrier) onRetry(ctx context.Context, err error, d decision) {
	returned := false
	defer func() {
		if !returned {
			r.dropSlot()
			r.settle(false)
		}
	}()
	if f := r.c.opts.onRetry; f != nil {
		f(ctx, RetryEvent{FullMethod: r.mp.fullMethod, Attempt: r.attempts, Err: err, Delay: d.delay, Pushback: d.pushback})
	}
	r.onRetried(ctx, err, d)
	returned = true
}

// newRetrier returns the retry state of one call of mp under st, with the
// call options co applied, and the one-layer cap on a call made for a
// caller that retries.
func (c *Client) newRetrier(ctx context.Context, st *clientState, mp *methodPolicy, co *callOptions) retrier {
	rp, retrying := co.effectiveRetry(mp.retry, c.opts.maxAttemptsCap)
	// Errors are wrapped in a *RetryError when a retry policy applies: the
	// method's, or one the call options made (not a bare per-attempt
	// timeout on a method without one).
	r := retrier{ctx: ctx, c: c, st: st, mp: mp, mm: c.metrics.forCall(mp, co.static), rp: rp,
		wrap: mp.retry != nil || retrying && rp.maxAttempts > 1, attemptByCaller: co.setAttempt}
	if !retrying {
		r.rp.maxAttempts = 1
		if mp.retry != nil {
			r.noRetry = StopNoRetry
		}
	} else if co.maxAttempts == 1 {
		r.noRetry = StopNoRetry
	}
	if n := c.opts.oneLayer; n > 0 && r.rp.maxAttempts > n && wire.CallerRetries(ctx) {
		r.rp.maxAttempts = n
		r.noRetry = StopNoRetry
	}
	if r.rp.maxAttempts > 1 {
		r.noRetry = StopNone
	}
	return r
}

// begin does the accounting of an attempt about to start at now: the first
// attempt of a call that may retry deposits in the retry budget.
func (r *retrier) begin(now time.Time) {
	if r.attempts == 0 && r.rp.maxAttempts > 1 {
		if b := r.st.storm.budget; b != nil {
			b.OnRequest(now)
		}
	}
}

// since returns the time at start plus the time elapsed since, read on the
// monotonic clock alone: half the cost of time.Now on virtual machines
// without a fast wall clock.
func since(start time.Time) time.Time {
	return start.Add(time.Since(start))
}

// outgoing marks ctx for the server when the client retries this call in
// one-layer mode.
func (r *retrier) outgoing(ctx context.Context) context.Context {
	if r.c.opts.oneLayer > 0 && r.rp.maxAttempts > 1 {
		return metadata.AppendToOutgoingContext(ctx, wire.CallerRetriesKey, "1")
	}
	return ctx
}

// attemptTimeout returns the timeout of the next attempt: min(per-attempt
// timeout, remaining − headroom). bounded with a timeout ≤ 0 means no time
// is left for an attempt. A zero timeout with bounded false means none is
// needed beyond the caller's own deadline.
func (r *retrier) attemptTimeout(ctx context.Context, now time.Time) (timeout time.Duration, bounded bool) {
	dl, _ := ctx.Deadline()
	if dl.IsZero() && r.rp.perAttempt == 0 {
		return 0, false
	}
	timeout, bounded = deadline.AttemptTimeout(dl, now, r.rp.perAttempt, r.c.opts.headroom)
	if bounded && timeout > 0 && r.rp.perAttempt == 0 && r.c.opts.headroom == 0 {
		return 0, false // the caller's deadline bounds the attempt already
	}
	return timeout, bounded
}

// outOfTime ends a call that has no time left for its next attempt: with
// the last attempt's error, or DEADLINE_EXCEEDED when none ran.
func (r *retrier) outOfTime(lastErr error) error {
	r.settle(false)
	err := lastErr
	if err == nil {
		err = status.Error(codes.DeadlineExceeded, "resilience: no time left for an attempt before the deadline")
	}
	return r.stopped(err, lastErr, StopDeadline)
}

// succeeded does the accounting of a call that ended well.
func (r *retrier) succeeded() {
	r.settle(false)
	if th := r.st.storm.throttle; th != nil {
		th.OnSuccess()
	}
}

// callerErr returns the error of the caller's context: its Err, or
// context.DeadlineExceeded once its deadline has passed on the clock, which
// can be a moment before the context's own timer has cancelled it (a
// server's DEADLINE_EXCEEDED may arrive first).
func callerErr(ctx context.Context) error {
	return callerErrAt(ctx, time.Time{})
}

// callerErrAt is callerErr with the time read already (zero: read it).
func callerErrAt(ctx context.Context, now time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok {
		if now.IsZero() {
			now = time.Now()
		}
		if !now.Before(dl) {
			return context.DeadlineExceeded
		}
	}
	return nil
}
