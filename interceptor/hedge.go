package interceptor

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/deadline"
	"github.com/grpc-resilience/resilience/interceptor/internal/pushback"
	"github.com/grpc-resilience/resilience/interceptor/internal/rpcname"
	"github.com/grpc-resilience/resilience/interceptor/internal/trail"
	"github.com/grpc-resilience/resilience/internal/budget"
	"github.com/grpc-resilience/resilience/internal/latency"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// A hedged unary call (gRFC A6) is run by two kinds of goroutine:
//
//   - the caller's runs a hedgeCall: it starts copies, receives their
//     results and decides the call's outcome. Only it reads or writes the
//     hedgeCall.
//   - each copy runs on a goroutine of its own (hedgeCopy.run). It reads
//     the call's hedgeJob, which is built before the first copy starts and
//     never written after, and its own hedgeCopy, built before its go
//     statement. It never reads the caller's request, reply or call
//     options: the call may have returned, and the caller reused them, by
//     the time a losing copy runs.
//
// Each copy sends exactly one hedgeResult, on a channel with room for every
// copy, so a copy never blocks after the call returned; and it settles its
// own accounts (bulkhead slot, breaker token, budget token, metrics) on
// every way it ends, in hedgeCopy.finish.

// hedgePolicy is a serviceconfig.HedgingPolicy with its defaults resolved.
type hedgePolicy struct {
	maxAttempts int // ≥ 2, within the cap of where the policy came from (checkCaps)
	// delay is the wait between copies: 0 sends them all at once, and
	// noTimedCopies sends further copies only after non-fatal failures.
	// In a methodPolicy it is the policy's HedgingDelay (the delay until
	// the method's window is ready, hedge_delay.go); in a hedgeCall, the
	// delay of that call.
	delay    time.Duration
	nonFatal rescodes.Set // codes after which hedging goes on
	// quantile, when > 0, is hedgingDelayQuantile: the policy hedges the
	// share 1 − quantile of the calls, at least floor after they start.
	quantile float64
	floor    time.Duration
	// minSamples is the copies the window must hold before the delay is
	// read from it.
	minSamples uint64
}

// noTimedCopies is the delay of a call that sends further copies only
// after non-fatal failures: an adaptive policy without a HedgingDelay, while
// it has too few samples, or a retry budget that pays for no copy.
const noTimedCopies time.Duration = -1

// newHedgePolicy resolves p.
func newHedgePolicy(p *serviceconfig.HedgingPolicy) *hedgePolicy {
	hp := &hedgePolicy{maxAttempts: p.MaxAttempts, delay: p.HedgingDelay, nonFatal: rescodes.Of(p.NonFatalStatusCodes...),
		minSamples: latency.FixedDelayMinSamples}
	if p.HedgingDelayQuantile > 0 {
		hp.quantile, hp.floor = p.HedgingDelayQuantile, p.HedgingDelayFloor
		hp.minSamples = uint64(orDefault(p.HedgingDelayMinSamples, serviceconfig.DefaultHedgingDelayMinSamples))
		if hp.delay == 0 {
			hp.delay = noTimedCopies
		}
	}
	return hp
}

// orDefault returns v, or def when v is zero.
func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// HedgingDelay returns the delay between the copies of a hedged call of
// fullMethod ("/pkg.Service/Method"; the leading slash may be left out)
// that started now: the hedgingDelay until the method's window holds
// enough copies, then the delay of the package documentation's rule
// (Hedging: what a hedge may spend), read from the latencies observed and
// the retry budget's share. ok is false when the method is not hedged,
// or when no timed copy would be sent (an adaptive policy still gathering
// samples with no hedgingDelay to use meanwhile, or a retry budget that
// pays for no copy): further copies then go out only after non-fatal
// failures. A name that is not a full method has no delay (ok is false),
// and why is logged once (WithLogger), as Status does.
func (c *Client) HedgingDelay(fullMethod string) (d time.Duration, ok bool) {
	full, err := rpcname.FullMethod("HedgingDelay", fullMethod)
	if err != nil {
		c.log.warn(err.Error())
		return 0, false
	}
	mp := c.peek(full)
	if mp.hedge == nil {
		return 0, false
	}
	if d = mp.tail.delayOf(mp.hedge); d == noTimedCopies {
		return 0, false
	}
	return d, true
}

// hedged runs a unary call under a hedging policy (gRFC A6): the first copy
// at once, another after each HedgingDelay without an answer, and another at
// once after each non-fatal failure, up to maxAttempts copies in all. The
// first success wins and cancels the others; a fatal status (one not in
// NonFatalStatusCodes) ends the call, and so does any outcome of a copy that
// received response headers: A6 commits the call to it. Each copy gets its
// own reply message, header, trailer and peer; the winner's (or, for a
// failed call, those of the copy whose error is returned) are handed to the
// caller's reply and grpc.Header, grpc.Trailer and grpc.Peer options. The
// caller's grpc.OnFinish callbacks run once, with the call's error, when a
// copy ran (grpc promises once; each copy would call them).
//
// Every copy after the first is a retry for the budget, A6 throttling and
// the deadline: a copy starts only while they allow it, and a server
// pushback delays the next copy, or stops new copies when it says not to
// retry; a pushback after which no copy could follow (none left, or the
// wait past the deadline) ends the call once nothing runs, with the
// server's status. Copies go through the method's breaker and bulkhead like
// attempts; a copy that must wait in the bulkhead's queue waits on its own
// goroutine, so an answer that arrives meanwhile ends the call at once. Each
// copy settles its own accounts, so copies still running or queued when the
// call returns (they are cancelled) leave nothing behind.
//
// A per-attempt timeout (the PerAttemptTimeout call option, and
// WithDeadlineHeadroom) bounds every copy as it bounds every attempt of a
// retried call. A copy cut by its own timeout is a non-fatal failure,
// whatever NonFatalStatusCodes holds: the next copy goes out at once.
//
// A panic below the interceptor in a copy's goroutine is carried to the
// caller's goroutine, which panics again with a *copyPanic around it (as
// golang.org/x/sync/singleflight does), and runtime.Goexit likewise. A
// copy that panics after the call returned has no caller left to reach: its
// panic is dropped, its accounts settled.
//
// Only proto messages are hedged: each copy needs a clone of the request
// and a reply of its own. A call of a hedged method with other messages
// runs one attempt through the guards, as a method without a policy does
// (see hedgeable).
//
// in, out and opts are borrowed: hedged reads them only until it returns,
// and copies use their own copies of them.
func (c *Client) hedged(ctx context.Context, st *clientState, mp *methodPolicy, co *callOptions, maxAttempts int, method string,
	in, out proto.Message, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) error {
	h := c.newHedgeCall(ctx, st, mp, co, maxAttempts)
	defer h.close() // cancels the copies still running, on every way out
	if cc != nil && trail.Wanted(cc.Target()) {
		// Every copy carries the call's trail of endpoints, to which the
		// endpoint load-balancing policy adds each pick: a copy goes to
		// an endpoint no earlier copy of the call went to. One
		// allocation, made only when the channel's policy reads it, as
		// for a unary call that may retry (unaryCall.trailed).
		// A copy's per-attempt timeout is a call option's (the caller's)
		// or the deadline's headroom: none counts against an endpoint.
		h.copies = trail.NewContext(h.copies, time.Time{})
		h.trail = trail.FromContext(h.copies)
	}
	h.job = newHedgeJob(c, st, mp, h.hp.nonFatal, method, in, out, cc, invoker, opts, &h.caller)
	h.job.mm = h.r.mm
	err := h.run(in, out)
	if !h.idleAt.IsZero() { // the call ended with no copy running
		h.r.waited += time.Since(h.idleAt)
	}
	h.r.callEnded(cc)
	if h.r.attempts > 0 {
		h.caller.finish(err)
	}
	return err
}

// hedgeCall is the state of one hedged call, owned by the caller's
// goroutine: no copy reads or writes it.
type hedgeCall struct {
	c      *Client
	st     *clientState
	hp     hedgePolicy     // the method's, with this call's MaxAttempts
	r      retrier         // counts copies started; reports retries and the stop
	ctx    context.Context // the caller's, marked for one-layer mode
	copies context.Context // ctx, cancelled by close: every copy's parent
	cancel context.CancelFunc
	// trail is the copies' trail of endpoints; nil when the channel's
	// policy reads none.
	trail *trail.Trail
	job   *hedgeJob // what every copy reads; set before the first copy
	// caller holds where the caller's Header, Trailer and Peer options
	// want the deciding copy's values; set with job.
	caller callerDest

	// results has room for every copy, so a copy's send never blocks.
	results chan hedgeResult
	// running counts copies started whose result has not been received.
	running int
	// stopped says why no more copies start; StopNone while they may.
	stopped StopReason
	// timer sends the next copy when it fires. timerC is its channel while
	// it is armed and nil when not, so the loop can tell a pending copy
	// from none.
	timer  *time.Timer
	timerC <-chan time.Time
	// last is the result of the latest copy that failed.
	last hedgeResult
	// idleAt is when the last running copy failed while the call went on;
	// zero while a copy runs or none has failed.
	idleAt time.Time
	// tail is set while the timer is armed for the hedging delay (not a
	// server's pushback): the copy it sends is a timed one.
	tail bool
}

// hedgeable reports whether a call with req and reply can be hedged: both
// are proto messages, which each copy clones or makes anew.
func hedgeable(req, reply any) bool {
	_, in := req.(proto.Message)
	_, out := reply.(proto.Message)
	return in && out
}

// newHedgeCall returns the state of a call of mp hedged with maxAttempts
// copies, each bounded by the per-attempt timeout of the call options co,
// before its job is set and its first copy started.
func (c *Client) newHedgeCall(ctx context.Context, st *clientState, mp *methodPolicy, co *callOptions, maxAttempts int) *hedgeCall {
	h := &hedgeCall{c: c, st: st, hp: *mp.hedge}
	h.hp.maxAttempts = maxAttempts
	h.hp.delay = mp.tail.delayOf(mp.hedge) // one delay for the whole call
	h.r = retrier{ctx: ctx, c: c, st: st, mp: mp, mm: c.metrics.forCall(mp, co.static),
		rp: retryPolicy{maxAttempts: maxAttempts}, wrap: true, hedged: true}
	if co.setAttempt {
		h.r.rp.perAttempt = max(co.perAttempt, 0)
	}
	h.ctx = h.r.outgoing(ctx)
	h.copies, h.cancel = context.WithCancel(h.ctx)
	h.results = make(chan hedgeResult, maxAttempts)
	return h
}

// close ends the call: it cancels the copies still running, which then
// settle their own accounts, and stops the timer. While the caller is
// still there (callerErr, as onResult asks it: its deadline passed on the
// clock is the caller's end, though the context's timer has not run), the
// trail first says that the call ended: the endpoint policy then reads a
// running copy's cancellation as its endpoint not having answered in that
// time (a lower bound of its latency), not as the caller's.
func (h *hedgeCall) close() {
	if h.trail != nil && callerErr(h.ctx) == nil {
		h.trail.MarkEnded()
	}
	h.cancel()
	if h.timer != nil {
		h.timer.Stop()
	}
}

// run starts the first copy and loops until the call's outcome is known.
// After every event it checks that something is still running or a copy
// still pending, so a call never waits for nothing. req and out are the
// caller's, for the fallback and the winner's reply.
func (h *hedgeCall) run(req any, out proto.Message) error {
	now := time.Now()
	timeout, bounded := h.r.attemptTimeout(h.ctx, now)
	if bounded && timeout <= 0 {
		return h.r.outOfTime(nil)
	}
	if err := h.launch(budget.Retry{}, now, timeout); err != nil {
		return h.refused(err, req, out)
	}
	h.arm(h.hp.delay, true)
	for {
		select {
		case <-h.timerC:
			h.onTimer()
		case res := <-h.results:
			if done, err := h.onResult(res, out); done {
				return err
			}
		case <-h.ctx.Done():
			return h.r.cancelled(h.ctx.Err(), h.last.err)
		}
		if h.idle() {
			return h.end()
		}
	}
}

// refused ends a call whose first copy the breaker or bulkhead refused, or
// that the caller gave up while it queued: the fallback answers a local
// rejection when there is one.
func (h *hedgeCall) refused(err error, req, reply any) error {
	reason, rejected := isRejection(err)
	if rejected {
		h.r.onRejected(h.ctx, reason)
	}
	if rejected && h.r.mp.fallback != nil {
		return h.r.mp.fallback(h.ctx, h.job.method, req, reply, err)
	}
	if !rejected {
		reason = stopOfContext(h.ctx.Err())
	}
	return h.r.stopped(err, nil, reason)
}

// idle reports that the call can make no more progress: no copy is running
// and none can start, because none is pending or new ones are stopped.
func (h *hedgeCall) idle() bool {
	return h.running == 0 && (h.timerC == nil || h.stopped != StopNone)
}

// end returns the error of an idle call: the last failed copy's.
func (h *hedgeCall) end() error {
	if h.stopped == StopNone {
		h.stopped = StopExhausted
	}
	return h.fail(h.stopped)
}

// fail ends the call with the last failed copy's error, handing its header,
// trailer and peer to the caller.
func (h *hedgeCall) fail(reason StopReason) error {
	h.caller.hand(&h.last)
	return h.r.stopped(h.last.err, h.last.err, reason)
}

// arm makes the timer send the next copy after d, for the tail (the
// hedging delay) or not (a server's pushback); with noTimedCopies, it
// disarms it.
func (h *hedgeCall) arm(d time.Duration, tail bool) {
	h.tail = tail
	if d == noTimedCopies {
		if h.timer != nil {
			h.timer.Stop()
		}
		h.timerC = nil
		return
	}
	if h.timer == nil {
		h.timer = time.NewTimer(d)
	} else {
		h.timer.Reset(d)
	}
	h.timerC = h.timer.C
}

// onTimer sends the next copy, HedgingDelay (or a pushback) after the one
// before, and arms the timer for the one after while copies may follow.
func (h *hedgeCall) onTimer() {
	h.timerC = nil
	h.another(h.hp.delay, h.tail)
	if h.running > 0 && h.stopped == StopNone && h.r.attempts < h.hp.maxAttempts {
		h.arm(h.hp.delay, true)
	}
}

// onResult takes a copy's result. It reports done with the call's error
// when the result decides the call: a success, a fatal code, a committed
// copy, or the caller's context ending. A panic in the copy panics here.
func (h *hedgeCall) onResult(res hedgeResult, out proto.Message) (done bool, err error) {
	h.running--
	switch {
	case res.panicked != nil:
		if res.err == nil {
			// The copy succeeded and its release panicked (the breaker's
			// state-change hook on its verdict, the meter provider): the
			// call is settled as a success, and the panic goes on.
			h.r.succeeded()
		}
		panic(res.panicked)
	case res.goexit:
		runtime.Goexit()
	case res.halted: // never sent; the sibling's outcome decides
		h.r.attempts--
		return false, nil
	case res.refused:
		h.onRefused(res.err)
		return false, nil
	case res.err == nil:
		h.r.succeeded()
		h.caller.hand(&res)
		proto.Reset(out)
		proto.Merge(out, res.reply)
		return true, nil
	}
	h.last = res
	if cerr := callerErr(h.ctx); cerr != nil {
		return true, h.fail(stopOfContext(cerr))
	}
	if !res.timedOut && !nonFatal(h.hp.nonFatal, res.err) {
		return true, h.fail(StopNonRetryable)
	}
	if res.header != nil { // A6: response headers commit the call to this copy
		return true, h.fail(StopCommitted)
	}
	h.onNonFatal(&res)
	return false, nil
}

// onNonFatal goes on after a copy's non-fatal failure: the next copy at
// once, or after the server's pushback, or none when the server or A6
// throttling says to stop.
func (h *hedgeCall) onNonFatal(res *hedgeResult) {
	if h.running == 0 {
		h.idleAt = time.Now() // no copy runs: gRFC A96's retry delay starts
	}
	if th := h.st.storm.throttle; th != nil && !th.OnFailure() && h.stopped == StopNone {
		h.stopped = StopThrottled
	}
	switch hint, hinted, refuse := pushback.Hint(res.err, res.trailer); {
	case refuse:
		if h.stopped == StopNone {
			h.stopped = StopPushback
		}
	case hinted:
		// The next copy waits for the hint; with none to follow, or none
		// that would fit in the deadline, there is nothing to wait for.
		if d := min(hint, h.c.opts.maxPushback); h.mayFollow(d) {
			h.arm(d, false)
		}
	default:
		// A non-fatal failure sends the next copy in line at once (A6: its
		// hedging delay is shortcut); the one after it then waits a whole
		// HedgingDelay from now, so no more copies are out than A6 allows.
		before := h.r.attempts
		h.another(0, false)
		if h.r.attempts > before && h.timerC != nil {
			h.arm(h.hp.delay, true)
		}
	}
}

// onRefused takes the result of a copy that the bulkhead refused (or whose
// wait the call's end cut) while it queued: it was never sent, so it is not
// counted, and no further copy starts.
func (h *hedgeCall) onRefused(err error) {
	h.r.attempts--
	reason, rejected := isRejection(err)
	if rejected {
		h.r.onRejected(h.ctx, reason)
	} else {
		reason = stopOfContext(h.ctx.Err())
	}
	if h.stopped == StopNone {
		h.stopped = reason
	}
}

// another starts a copy if next allows it and the guards admit it, and
// reports it, sent delay after the one before, timed (tail) or after a
// failure. When it cannot, refused or stopped says why (see next).
func (h *hedgeCall) another(delay time.Duration, tail bool) {
	if h.job.halt.Load() {
		return // a copy's outcome, not yet taken, ends the copies
	}
	tok, ok := h.next(tail)
	if !ok {
		return
	}
	now := time.Now()
	timeout, bounded := h.r.attemptTimeout(h.ctx, now)
	if bounded && timeout <= 0 {
		h.job.refund(tok)
		h.stopped = h.r.skip(StopDeadline).stop
		return
	}
	if err := h.launch(tok, now, timeout); err != nil {
		if h.stopped, _ = isRejection(err); h.stopped == StopNone {
			h.stopped = stopOfContext(h.ctx.Err())
		} else {
			h.r.onRejected(h.ctx, h.stopped)
		}
		return
	}
	h.r.onRetryHedge(h.ctx, delay)
}

// next says whether another copy may start now, taking a retry budget
// token for it: one gRFC A6 throttling allows (as A6 specifies for every
// copy after the first), that fits in the deadline, and that the budget
// pays for (hedge_delay.go). A timed copy (tail) that may not is not sent
// and the call goes on: a failure, or the next delay, may still send a
// copy. A copy after a failure that may not stops the copies, stopped
// saying why, as a refused retry ends a retried call.
func (h *hedgeCall) next(tail bool) (budget.Retry, bool) {
	if !h.copiesLeft() {
		return budget.Retry{}, false
	}
	if th := h.st.storm.throttle; th != nil && !th.Allow() {
		h.refuse(tail, StopThrottled)
		return budget.Retry{}, false
	}
	now := time.Now()
	if !h.fits(now, 0) {
		return budget.Retry{}, false
	}
	if b := h.st.storm.budget; b != nil {
		tok, ok := b.TryRetry(now)
		if !ok {
			h.refuse(tail, StopBudget)
		}
		return tok, ok
	}
	return budget.Retry{}, true
}

// refuse records that a copy was not sent for why: the metrics count the
// denial, and one after a failure stops the copies (stopped); a timed one
// stops nothing.
func (h *hedgeCall) refuse(tail bool, why StopReason) {
	h.r.skip(why)
	if !tail {
		h.stopped = why
	}
}

// copiesLeft reports whether a further copy may still start: none has
// stopped them and MaxAttempts is not reached (else stopped says so).
func (h *hedgeCall) copiesLeft() bool {
	switch {
	case h.stopped != StopNone:
		return false
	case h.r.attempts >= h.hp.maxAttempts:
		h.stopped = StopExhausted
		return false
	}
	return true
}

// fits reports whether a copy sent delay after now fits in the call's
// deadline (with the client's headroom and the method's expected attempt
// duration); when not, stopped says so and the skip is recorded.
func (h *hedgeCall) fits(now time.Time, delay time.Duration) bool {
	if dl, ok := h.ctx.Deadline(); ok && !deadline.Fit(dl, now, delay, h.r.estimate(), h.c.opts.headroom).OK() {
		h.stopped = h.r.skip(StopDeadline).stop
		return false
	}
	return true
}

// mayFollow reports whether a further copy could go out delay from now:
// copiesLeft, and fits.
func (h *hedgeCall) mayFollow(delay time.Duration) bool {
	return h.copiesLeft() && h.fits(time.Now(), delay)
}

// launch starts the next copy at now, bounded by timeout when positive and
// holding tok, the budget's token for it (zero for the first copy). When
// the guards refuse it, tok is refunded (by the copy, when it is refused in
// the queue), and so it is when a panic ends the admission (the breaker's
// state-change hook): the copy is never sent.
// The first copy waits here for a bulkhead slot, as an attempt does
// (nothing else can end the call meanwhile); a later copy that must queue
// waits on its own goroutine, so that a sibling's answer is taken at once.
func (h *hedgeCall) launch(tok budget.Retry, now time.Time, timeout time.Duration) error {
	h.r.begin(now)
	g := &h.job.mp.g
	var (
		adm   admission
		queue bool
		err   error
	)
	admitted := false
	defer func() {
		if !admitted {
			h.job.refund(tok)
		}
	}()
	if h.r.attempts == 0 {
		adm, err = g.admit(h.copies, now, 0)
	} else {
		adm, queue, err = g.admitNow(now)
	}
	if err != nil {
		return err
	}
	admitted = true
	if adm.paced {
		now = adm.start // the wait at the rate limit is no part of the copy
	}
	if h.running == 0 && !h.idleAt.IsZero() {
		h.r.waited += now.Sub(h.idleAt)
		h.idleAt = time.Time{}
	}
	h.r.attempts++
	h.running++
	cp := &hedgeCopy{job: h.job, n: h.r.attempts, adm: adm, queued: queue, tok: tok, start: now, timeout: timeout, results: h.results}
	go cp.run(h.copies)
	return nil
}

// onRetryHedge reports a copy sent delay after the one before.
func (r *retrier) onRetryHedge(ctx context.Context, delay time.Duration) {
	r.onHedged(ctx, delay)
	if f := r.c.opts.onRetry; f != nil {
		f(ctx, RetryEvent{FullMethod: r.mp.fullMethod, Attempt: r.attempts - 1, Delay: delay, Hedge: true})
	}
}

// hedgeJob is what every copy of one call reads. It is built before the
// first copy starts and never written after, and it holds nothing the
// caller owns or pools: copies may read it after the call returned.
type hedgeJob struct {
	c        *Client
	mp       *methodPolicy
	mm       *methodMetrics // the call's attribute sets (retrier.mm)
	nonFatal rescodes.Set
	budget   *budget.Budget // nil: none
	method   string
	req      proto.Message // a clone of the caller's request
	// replyType makes each copy's own reply; the caller's is written on
	// the caller's goroutine only.
	replyType protoreflect.MessageType
	cc        *grpc.ClientConn
	invoker   grpc.UnaryInvoker
	// opts are the caller's call options, copied, without the Header,
	// Trailer and Peer options (they are in the call's callerDest).
	opts []grpc.CallOption
	// halt is set, by the copy whose outcome ends the sending of copies
	// (see ends), before that copy gives back its bulkhead slot: a copy
	// that was waiting in the queue, and gets the slot, is then not sent.
	// The one field written after the first copy starts.
	halt atomic.Bool
}

// ends reports whether a copy's outcome ends the sending of copies, as the
// call's loop will decide on it (onResult, onNonFatal): a success, a fatal
// status, a committed copy, or a server's pushback that says to stop.
func (j *hedgeJob) ends(res *hedgeResult) bool {
	switch {
	case res.err == nil, res.header != nil:
		return true
	case !res.timedOut && !nonFatal(j.nonFatal, res.err):
		return true
	}
	_, _, refuse := pushback.Hint(res.err, res.trailer)
	return refuse
}

// newHedgeJob copies what the copies of a call need: the request, the
// reply's type and the call options, whose Header, Trailer and Peer
// destinations it moves to dest.
func newHedgeJob(c *Client, st *clientState, mp *methodPolicy, nonFatal rescodes.Set, method string, req, out proto.Message,
	cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption, dest *callerDest) *hedgeJob {
	return &hedgeJob{
		c: c, mp: mp, nonFatal: nonFatal, budget: st.storm.budget, method: method,
		req: proto.Clone(req), replyType: out.ProtoReflect().Type(),
		cc: cc, invoker: invoker, opts: dest.take(opts),
	}
}

// refund gives back tok, taken from the retry budget for a copy that was
// never sent (the zero token, the first copy's, is a no-op).
func (j *hedgeJob) refund(tok budget.Retry) {
	if tok != (budget.Retry{}) {
		j.budget.Refund(tok)
	}
}

// hedgeCopy is one copy of a hedged call: what its goroutine needs beyond
// the job, built before the go statement.
type hedgeCopy struct {
	job *hedgeJob
	n   int       // 1 for the first copy
	adm admission // the copy's breaker token and bulkhead slot
	// queued is set when adm holds no slot yet: the copy waits in the
	// bulkhead's queue (guards.queue) before it is sent.
	queued  bool
	tok     budget.Retry  // the budget's token for the copy, refunded if it is never sent
	start   time.Time     // when it was admitted; once queued, when it got its slot
	timeout time.Duration // the copy's own timeout from start; 0: none
	results chan<- hedgeResult
}

// hedgeResult is what one copy ended with.
type hedgeResult struct {
	reply proto.Message
	err   error
	// header is nil when no response headers arrived (none at all, or a
	// trailers-only response); non-nil, the copy committed the call.
	header  metadata.MD
	trailer metadata.MD
	peer    peer.Peer
	// panicked is set when the copy panicked below the interceptor; goexit
	// when it called runtime.Goexit. err is then errCopyAborted.
	panicked *copyPanic
	goexit   bool
	// refused is set when the copy was never sent: the bulkhead refused it
	// while it queued, or the call ended; err says which. halted is set
	// with it when the copy got its slot after a sibling's outcome ended
	// the copies (hedgeJob.halt): that outcome says why.
	refused, halted bool
	// timedOut is set when the copy's own timeout ended it while the
	// caller's context was live.
	timedOut bool
}

// errCopyAborted is the outcome of a copy that panicked or exited: its
// guards are abandoned (guards.abandon), as a plain call's are after a
// panic below: no breaker verdict, no answer for adaptive throttling.
var errCopyAborted = status.Error(codes.Canceled, "resilience: hedged copy aborted by a panic or runtime.Goexit")

// errCopyHalted is the outcome of a queued copy that was not sent because
// a sibling's outcome ended the copies; the caller never sees it.
var errCopyHalted = status.Error(codes.Canceled, "resilience: queued hedged copy not sent: a sibling's outcome ended the copies")

// run is a copy's goroutine: it invokes the rest of the chain and, deferred
// in finish, settles the copy's accounts and sends its one result, however
// the invoker ends: returning, panicking or calling runtime.Goexit.
func (cp *hedgeCopy) run(ctx context.Context) {
	res := hedgeResult{err: errCopyAborted}
	returned := false
	defer cp.finish(ctx, &res, &returned)
	j := cp.job
	if cp.queued {
		// Until it has its slot the copy is unsent: should the user's code
		// panic as its guards are given back (the breaker's state-change
		// hook, in the record of its token), it is settled as refused,
		// with nothing recorded or released twice.
		res.refused = true
		if err := j.mp.g.queue(ctx, &cp.adm, cp.start); err != nil {
			res.err, returned = err, true
			return
		}
		if j.halt.Load() { // a sibling's outcome ended the copies while this one queued
			j.mp.g.unused(cp.adm)
			res.err, res.halted, returned = errCopyHalted, true, true
			return
		}
		res.refused = false
		cp.start = time.Now()
	}
	res.reply = j.replyType.New().Interface()
	opts := make([]grpc.CallOption, len(j.opts), len(j.opts)+3)
	copy(opts, j.opts)
	opts = append(opts, grpc.Header(&res.header), grpc.Trailer(&res.trailer), grpc.Peer(&res.peer))
	actx := attemptContext(ctx, cp.n)
	if cp.timeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithDeadline(actx, cp.start.Add(cp.timeout))
		defer cancel()
	}
	res.err = j.invoker(actx, j.method, j.req, res.reply, j.cc, opts...)
	if res.err != nil && cp.timeout > 0 {
		// Its own timeout fired if its deadline has passed (on the clock:
		// the error may come before the context's timer has run) while
		// the call's context is live.
		end := since(cp.start)
		res.timedOut = !end.Before(cp.start.Add(cp.timeout)) && callerErrAt(ctx, end) == nil
	}
	if j.ends(&res) {
		j.halt.Store(true) // before finish gives the slot to a queued copy
	}
	returned = true
}

// finish ends a copy, deferred by run: it recovers a panic from below (the
// invoker did not return), settles the copy's accounts, and sends the
// result. A panic while settling (a user's hook) is carried too.
func (cp *hedgeCopy) finish(ctx context.Context, res *hedgeResult, returned *bool) {
	if !*returned {
		if v := recover(); v != nil {
			res.panicked = newCopyPanic(v)
		} else {
			res.goexit = true
		}
	}
	defer func() {
		if v := recover(); v != nil && res.panicked == nil {
			res.panicked = newCopyPanic(v)
		}
		cp.results <- *res
	}()
	cp.settle(ctx, res)
}

// settle closes a copy's accounts: its bulkhead slot and breaker token, its
// metrics and latency. Its budget token stays spent: a copy that reached
// the server was extra load whether it won, lost or failed, and the retry
// budget exists to bound extra load (a refund for every cancelled loser
// would let a too-short hedging delay send a copy on every call). Only a
// copy the guards refused before it was sent gets its token back (launch).
//
// The method's window (hedgeTail, whose delay every hedging policy reads
// once it holds enough copies) gets the copy's duration when it
// succeeded, and a lower bound of it when the copy was cut off (a sibling
// won, or the caller gave up): a cancelled slow copy is the tail the
// quantile must see. Other failures say nothing of how long an answer
// takes.
func (cp *hedgeCopy) settle(ctx context.Context, res *hedgeResult) {
	j := cp.job
	if res.refused { // never sent: queue gave its breaker token back
		if q := j.mp.g.rate; q != nil {
			q.giveBack(time.Now(), cp.adm.pace) // its token and slot at the gate, as admit's refusal past the gate does
		}
		j.refund(cp.tok)
		return
	}
	if res.panicked != nil || res.goexit {
		// The backend said nothing: released as a plain call's attempt is
		// after a panic below (abandon), its outcome counted nowhere.
		j.mp.g.abandon(cp.adm)
		return
	}
	if q := j.mp.g.rate; q != nil {
		q.answer(ctx, res.err, res.trailer, time.Now())
	}
	end := j.mp.g.release(ctx, cp.adm, res.err, true)
	j.c.metrics.attempt(ctx, j.mm, res.err)
	j.c.metrics.replayed(ctx, j.mm, res.header)
	if end.IsZero() && (j.mp.latency != nil || j.mp.tail != nil) {
		end = since(cp.start)
	}
	if res.err == nil && j.mp.latency != nil {
		j.mp.latency.Observe(end.Sub(cp.start))
	}
	if t := j.mp.tail; t != nil {
		switch {
		case res.err == nil:
			t.observe(end.Sub(cp.start), false)
		case ctx.Err() != nil || res.timedOut:
			t.observe(end.Sub(cp.start), true)
		}
	}
}

// copyPanic is the value a hedged call panics with on the caller's
// goroutine when one of its copies panicked below the interceptor.
type copyPanic struct {
	value any    // what the copy panicked with
	stack []byte // the copy's stack at the panic
}

func newCopyPanic(v any) *copyPanic {
	return &copyPanic{value: v, stack: debug.Stack()}
}

// Error describes the panic with the copy's stack.
func (p *copyPanic) Error() string {
	return fmt.Sprintf("resilience: a hedged copy panicked: %v\n\n%s", p.value, p.stack)
}

// Unwrap returns the panic's value when it is an error.
func (p *copyPanic) Unwrap() error {
	err, _ := p.value.(error)
	return err
}

// callerDest holds where the caller's grpc.Header, grpc.Trailer and
// grpc.Peer options want a call's header, trailer and peer, and the
// caller's grpc.OnFinish callbacks. Copies do not get those options (a
// losing copy would write the caller's variables, or call its callback,
// after the call returned); the call hands the deciding copy's values over,
// and calls the callbacks once, on the caller's goroutine.
type callerDest struct {
	header   []*metadata.MD
	trailer  []*metadata.MD
	peer     []*peer.Peer
	onFinish []func(error)
}

// take returns a copy of opts without the Header, Trailer, Peer and
// OnFinish options, whose destinations and callbacks it records.
func (d *callerDest) take(opts []grpc.CallOption) []grpc.CallOption {
	own := make([]grpc.CallOption, 0, len(opts))
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.HeaderCallOption:
			d.header = append(d.header, o.HeaderAddr)
		case *grpc.HeaderCallOption:
			d.header = append(d.header, o.HeaderAddr)
		case grpc.TrailerCallOption:
			d.trailer = append(d.trailer, o.TrailerAddr)
		case *grpc.TrailerCallOption:
			d.trailer = append(d.trailer, o.TrailerAddr)
		case grpc.PeerCallOption:
			d.peer = append(d.peer, o.PeerAddr)
		case *grpc.PeerCallOption:
			d.peer = append(d.peer, o.PeerAddr)
		case grpc.OnFinishCallOption:
			d.onFinish = append(d.onFinish, o.OnFinish)
		case *grpc.OnFinishCallOption:
			d.onFinish = append(d.onFinish, o.OnFinish)
		default:
			own = append(own, o)
		}
	}
	return own
}

// hand writes res's header, trailer and peer where the caller asked, as
// grpc would have: the peer only when the copy learned it.
func (d *callerDest) hand(res *hedgeResult) {
	for _, p := range d.header {
		if p != nil {
			*p = res.header
		}
	}
	for _, p := range d.trailer {
		if p != nil {
			*p = res.trailer
		}
	}
	for _, p := range d.peer {
		if p != nil && res.peer.Addr != nil {
			*p = res.peer
		}
	}
}

// finish calls the caller's OnFinish callbacks with the call's error.
func (d *callerDest) finish(err error) {
	for _, f := range d.onFinish {
		if f != nil {
			f(err)
		}
	}
}

// nonFatal reports whether a copy's failure with err lets hedging go on:
// its code is in set, and it is not one of grpc-go's message errors
// (isMessageError), which another copy would meet again.
func nonFatal(set rescodes.Set, err error) bool {
	return set.Has(rescodes.Classify(err)) && !isMessageError(err)
}
