package interceptor

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/deadline"
	"github.com/grpc-resilience/resilience/internal/budget"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// hedgePolicy is a serviceconfig.HedgingPolicy with its defaults resolved.
type hedgePolicy struct {
	maxAttempts int           // ≥ 2, ≤ the client's cap
	delay       time.Duration // between copies; 0 sends them all at once
	nonFatal    rescodes.Set  // codes after which hedging goes on
}

func newHedgePolicy(p *serviceconfig.HedgingPolicy, maxCap int) *hedgePolicy {
	return &hedgePolicy{maxAttempts: min(p.MaxAttempts, maxCap), delay: p.HedgingDelay, nonFatal: p.NonFatalStatusCodes}
}

// hedgeResult is what one copy of a hedged call ended with.
type hedgeResult struct {
	reply   proto.Message
	err     error
	trailer metadata.MD
}

// hedged runs a unary call under a hedging policy (gRFC A6): the first copy
// at once, another after each HedgingDelay without an answer, and another at
// once after each non-fatal failure, up to MaxAttempts copies in all. The
// first success wins and cancels the others; a fatal status (one not in
// NonFatalStatusCodes) ends the call. Each copy gets its own reply message,
// so copies never write the caller's concurrently; the winner's is merged
// into it.
//
// Every copy after the first is a retry for the budget, A6 throttling and
// the deadline: a copy starts only while they allow it, and a server
// pushback delays the next copy, or stops new copies when it says not to
// retry. Copies go through the method's breaker and bulkhead like attempts,
// and each copy settles its own accounts, so copies still running when the
// call returns (they are cancelled) leave nothing behind.
func (c *Client) hedged(ctx context.Context, st *clientState, mp *methodPolicy, maxAttempts int, method string, req, reply any,
	cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) error {
	out, ok := reply.(proto.Message)
	if !ok {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	hp := *mp.hedge
	hp.maxAttempts = maxAttempts
	r := retrier{ctx: ctx, c: c, st: st, mp: mp, rp: retryPolicy{maxAttempts: hp.maxAttempts}, wrap: true}
	ctx = r.outgoing(ctx)
	hctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the copies still running when the call returns

	results := make(chan hedgeResult, hp.maxAttempts) // never blocks a copy
	running := 0
	stopped := StopNone // why no more copies start
	var lastErr error

	// launch starts the next copy, holding tok, the budget's token for it.
	launch := func(tok budget.Retry) error {
		now := time.Now()
		r.begin(now)
		adm, err := mp.g.admit(hctx, method, now)
		if err != nil {
			if tok != (budget.Retry{}) {
				st.storm.budget.Refund(tok)
			}
			return err
		}
		r.attempts++
		running++
		go c.hedgeCopy(hctx, mp, &hp, st.storm.budget, method, req, out, cc, invoker, opts, r.attempts, adm, now, tok, results)
		return nil
	}
	// next says whether another copy may start now, taking a budget token
	// for it; when not, it records why in stopped.
	next := func() (budget.Retry, bool) {
		switch {
		case stopped != StopNone:
			return budget.Retry{}, false
		case r.attempts >= hp.maxAttempts:
			stopped = StopExhausted
			return budget.Retry{}, false
		}
		if th := st.storm.throttle; th != nil && !th.Allow() {
			stopped = StopThrottled
			return budget.Retry{}, false
		}
		now := time.Now()
		if dl, ok := ctx.Deadline(); ok && !deadline.Fit(dl, now, 0, r.estimate(), c.opts.headroom).OK() {
			stopped = StopDeadline
			return budget.Retry{}, false
		}
		if b := st.storm.budget; b != nil {
			tok, ok := b.TryRetry(now)
			if !ok {
				stopped = StopBudget
			}
			return tok, ok
		}
		return budget.Retry{}, true
	}
	// another starts a copy if next allows it.
	another := func(delay time.Duration) {
		tok, ok := next()
		if !ok {
			return
		}
		if err := launch(tok); err != nil {
			if stopped, _ = isRejection(err); stopped == StopNone {
				stopped = stopOfContext(ctx.Err())
			}
			return
		}
		r.onRetryHedge(ctx, delay)
	}

	if err := launch(budget.Retry{}); err != nil {
		reason, rejected := isRejection(err)
		if rejected && mp.fallback != nil {
			return mp.fallback(ctx, method, req, reply, err)
		}
		if !rejected {
			reason = stopOfContext(ctx.Err())
		}
		return r.stopped(err, nil, reason)
	}
	timer := time.NewTimer(hp.delay)
	defer timer.Stop()
	timerC := timer.C
	rearm := func(d time.Duration) {
		timer.Reset(d)
		timerC = timer.C
	}
	for {
		select {
		case <-timerC:
			timerC = nil
			another(hp.delay)
			if running > 0 && stopped == StopNone && r.attempts < hp.maxAttempts {
				rearm(hp.delay)
			}
		case res := <-results:
			running--
			if res.err == nil {
				r.succeeded()
				proto.Reset(out)
				proto.Merge(out, res.reply)
				return nil
			}
			lastErr = res.err
			if cerr := callerErr(ctx); cerr != nil {
				return r.stopped(res.err, res.err, stopOfContext(cerr))
			}
			if !hp.nonFatal.Has(rescodes.Classify(res.err)) {
				return r.stopped(res.err, res.err, StopNonRetryable)
			}
			if th := st.storm.throttle; th != nil && !th.OnFailure() && stopped == StopNone {
				stopped = StopThrottled
			}
			switch hint, hinted, refuse := serverHint(res.err, res.trailer); {
			case refuse:
				if stopped == StopNone {
					stopped = StopPushback
				}
			case hinted:
				rearm(min(hint, c.opts.maxPushback)) // the next copy waits for the hint
			default:
				another(0) // a non-fatal failure sends the next copy at once
			}
			if running == 0 && timerC == nil || running == 0 && stopped != StopNone {
				if stopped == StopNone {
					stopped = StopExhausted
				}
				return r.stopped(lastErr, lastErr, stopped)
			}
		case <-ctx.Done():
			return r.cancelled(ctx.Err(), lastErr)
		}
	}
}

// hedgeCopy runs copy n of a hedged call and settles its own accounts: its
// breaker token and bulkhead slot, its metrics and latency, and its budget
// token, refunded unless the copy failed with a non-fatal code. It sends
// its result on results, which has room for every copy.
func (c *Client) hedgeCopy(ctx context.Context, mp *methodPolicy, hp *hedgePolicy, bg *budget.Budget, method string, req any, out proto.Message,
	cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption, n int, adm admission, start time.Time,
	tok budget.Retry, results chan<- hedgeResult) {
	res := hedgeResult{reply: out.ProtoReflect().New().Interface()}
	callOpts := append(append(make([]grpc.CallOption, 0, len(opts)+1), opts...), grpc.Trailer(&res.trailer))
	res.err = invoker(attemptContext(ctx, n), method, req, res.reply, cc, callOpts...)
	end := mp.g.release(ctx, adm, res.err, true)
	c.metrics.attempt(ctx, &mp.mm, res.err)
	if res.err == nil && mp.latency != nil {
		if end.IsZero() {
			end = since(start)
		}
		mp.latency.Observe(end.Sub(start))
	}
	if tok != (budget.Retry{}) && (res.err == nil || !hp.nonFatal.Has(rescodes.Classify(res.err))) {
		bg.Refund(tok)
	}
	results <- res
}

// onRetryHedge reports a copy sent delay after the one before.
func (r *retrier) onRetryHedge(ctx context.Context, delay time.Duration) {
	r.c.metrics.retry(ctx, &r.mp.mm)
	if f := r.c.opts.onRetry; f != nil {
		f(ctx, RetryEvent{FullMethod: r.mp.fullMethod, Attempt: r.attempts - 1, Delay: delay, Hedge: true})
	}
}
