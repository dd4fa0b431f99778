package server

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/wire"
)

// The path of one keyed call, in named steps, each a method of srvIdemCall:
//
//	key ──► join ──► claim ──► run ──► settle: complete, or release
//	         │         │
//	         │         └─ in progress in another process: poll, claim again
//	         └─ a flight of this process runs: await its outcome, or join again
//
//   - key: the record key (scope, method, key) and the request's fingerprint.
//   - join: coalesce with a running in-process flight of the same key and
//     request, or lead a new one.
//   - claim: the leader asks the store; a stored outcome or a mismatch ends
//     the call, a live lease elsewhere makes it poll, a free key is owned.
//   - run: the owner runs the handler, capturing its metadata.
//   - settle: the owner ends its claim, once, whichever way the handler
//     ended: complete (store the outcome), else release.
//
// A call without a key never reaches these steps (intercept).

// srvIdemCall is one keyed call on its way through the steps. It lives on
// the stack of intercept; its fields are set by the steps in order.
type srvIdemCall struct {
	s       *srvIdem              // immutable
	ctx     context.Context       // the call's; immutable
	req     any                   // immutable
	info    *grpc.UnaryServerInfo // immutable
	handler grpc.UnaryHandler     // immutable

	// f is the call's flight: its key and fingerprint from step key on; once
	// the call leads it, its outcome, which the leader alone writes.
	f *srvFlight
	// backoff is the delay of the next poll of the store (step claim).
	backoff time.Duration

	// Set by step run, while the call owns the claim:
	token   string          // the claim's owner token
	sctx    context.Context // the store's context after the handler: not cancelled with ctx
	own     *srvOwned       // the handler's capturing stream and the record
	renewal *srvRenewal     // renews the lease while the handler runs
}

// intercept is the unary path of server-side idempotency: the key policy,
// then, for a keyed call, the steps of srvIdemCall.
func (s *srvIdem) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	pol := s.policy(info.FullMethod)
	if pol == KeyIgnored {
		hctx := ctx
		if hasKey(ctx) { // a caller that sent a key reads the replay mark: the handler must not forge it
			hctx = stripped(ctx)
		}
		return s.runHandler(ctx, hctx, req, info, handler)
	}
	key, ok, err := srvIdemKey(metadata.ValueFromIncomingContext(ctx, wire.IdempotencyKeyHeader))
	if err != nil {
		return nil, err
	}
	if !ok {
		if pol == KeyRequired {
			return nil, srvInvalidKey("method " + info.FullMethod + " requires idempotency-key metadata")
		}
		return s.runHandler(ctx, ctx, req, info, handler)
	}
	c := srvIdemCall{s: s, ctx: ctx, req: req, info: info, handler: handler, backoff: s.pollInitial}
	if err := c.key(key); err != nil {
		return nil, err
	}
	return c.join()
}

// key is step key: it takes a flight for the call and fills in its record
// key (the caller's scope, the method, key) and the request's fingerprint.
// On error the call holds nothing.
func (c *srvIdemCall) key(key string) error {
	scope, err := c.s.scope(c.ctx)
	if err != nil {
		return err
	}
	f := c.s.flights.get()
	f.key.fp, f.buf, err = srvFingerprintAppend(f.buf, c.req)
	if err != nil {
		c.s.flights.put(f)
		return err
	}
	c.s.flights.setKey(f, idempotency.RecordKey{Scope: scope, FullMethod: c.info.FullMethod, Key: key})
	c.f = f
	return nil
}

// join is step join: it leads the call's flight when no flight of this
// process runs for the same key and request; otherwise it awaits the
// running flight and takes its outcome, or joins again when the flight
// ended with none to share.
func (c *srvIdemCall) join() (any, error) {
	for {
		running, done := c.s.flights.join(c.f)
		if done == nil {
			return c.claim()
		}
		// c.f did not start: it is still ours, to join again or put back.
		// Its marshalled request served the fingerprint; drop it before the
		// wait (finding 9 of issue 14: 800 waiters with 256 KiB requests
		// held 201 MB of copies). Small buffers stay, for the pool.
		if cap(c.f.buf) > srvKeepBuf {
			c.f.buf = nil
		}
		out, err := c.await(running, done)
		if out == nil && err == nil {
			continue
		}
		c.s.flights.put(c.f)
		if err != nil {
			return nil, err
		}
		c.shared(out)
		return c.s.replayShared(c.ctx, out)
	}
}

// await waits for the running flight, whose done channel is given, and
// returns its outcome when its waiters take it; nil and nil when they
// compete again; an error when the call's context ends first. With waiting
// off, it returns ABORTED with pushback at once.
func (c *srvIdemCall) await(running *srvFlight, done <-chan struct{}) (*srvOutcome, error) {
	if c.s.noWait {
		return &c.s.inProgress, nil
	}
	c.s.m.wait(c.ctx, c.info.FullMethod, srvWaitFlight)
	select {
	case <-done:
	case <-c.ctx.Done():
		return nil, status.FromContextError(c.ctx.Err()).Err()
	}
	if running.out.ok {
		return &running.out, nil
	}
	return nil, nil
}

// claim is step claim, for the flight the call leads: it claims the key in
// the store, until the store has an answer other than "in progress
// elsewhere", and finishes the flight on every way out, panics included.
func (c *srvIdemCall) claim() (any, error) {
	defer c.s.flights.finish(c.f) // after c.f.out is written, or with it unset: waiters compete again
	if c.s.tx != nil {
		return c.claimJoined()
	}
	for {
		start := c.s.m.start() // zero without metrics
		if start.IsZero() {
			start = time.Now() // the lease runs from here at the latest
		}
		cl, err := c.s.store.Claim(c.ctx, c.f.key.rk, c.f.key.fp[:], c.s.lease)
		c.s.m.storeDone(c.ctx, c.info.FullMethod, srvOpClaim, start, err)
		if err != nil {
			return c.claimFailed(err)
		}
		switch cl.State {
		case idempotency.Completed:
			return c.completed(cl.Record)
		case idempotency.Mismatch:
			return c.mismatch()
		case idempotency.InProgress:
			if c.s.noWait {
				c.f.out = c.s.inProgress
				c.s.m.conflict(c.ctx, c.info.FullMethod, srvInProgress)
				return c.s.replayShared(c.ctx, &c.f.out)
			}
			c.s.m.wait(c.ctx, c.info.FullMethod, srvWaitPoll)
			if err := c.poll(cl.RetryAfter); err != nil {
				return nil, err
			}
		case idempotency.Owned:
			return c.run(cl.Token, start)
		default:
			return nil, status.Errorf(codes.Internal, "idempotency: store returned claim state %v", cl.State)
		}
	}
}

// completed answers the leader of a flight whose key holds a stored
// outcome: a replay, which the flight's waiters share.
func (c *srvIdemCall) completed(rec *idempotency.Record) (any, error) {
	c.f.out = srvOutcome{ok: true, rec: rec}
	c.s.m.replay(c.ctx, c.info.FullMethod, srvFromStore, rec)
	return c.s.replay(c.ctx, rec)
}

// mismatch answers the leader of a flight whose key is held for another
// request: FAILED_PRECONDITION, which the flight's waiters share.
func (c *srvIdemCall) mismatch() (any, error) {
	c.f.out = srvOutcome{ok: true, err: &srvRejection{code: codes.FailedPrecondition,
		msg:      "idempotency: idempotency-key was already used with a different request to " + c.info.FullMethod,
		sentinel: ErrIdempotencyKeyReused}}
	c.s.m.conflict(c.ctx, c.info.FullMethod, srvMismatch)
	return nil, c.f.out.err
}

// claimFailed answers a call whose Claim failed. The call holds no claim:
// the store's contract is that a failed Claim leaves the key to others
// (the Redis store releases an orphan claim itself). The call's own end
// wins; then a store refusing for room (idempotency.FullError) gets
// RESOURCE_EXHAUSTED with its hint, fail open or not: the store works, and
// running the handler unrecorded would undo the bound; then fail open runs
// the handler plainly, and fail closed refuses with UNAVAILABLE and the
// retry hint (pushback trailer and RetryInfo).
func (c *srvIdemCall) claimFailed(err error) (any, error) {
	if c.ctx.Err() != nil {
		return nil, status.FromContextError(c.ctx.Err()).Err()
	}
	if full, ok := errors.AsType[*idempotency.FullError](err); ok {
		serr := srvStoreFull(full)
		c.s.refused.report(c.ctx, Refusal{FullMethod: c.info.FullMethod, Reason: RefusalStoreFull, Err: serr})
		return nil, serr
	}
	if c.s.failOpen {
		c.s.log.warn("idempotency: store failed, running the handler without idempotency (fail open)",
			"method", c.info.FullMethod, "error", err)
		c.s.refused.report(c.ctx, Refusal{FullMethod: c.info.FullMethod, Reason: RefusalStoreFailedOpen, Err: err})
		return c.s.runHandler(c.ctx, stripped(c.ctx), c.req, c.info, c.handler)
	}
	// Fail closed, with the retry hint.
	rej := c.retryLater(codes.Unavailable, "idempotency: store unavailable: "+err.Error(), ErrIdempotencyStoreUnavailable)
	c.s.refused.report(c.ctx, Refusal{FullMethod: c.info.FullMethod, Reason: RefusalStoreUnavailable, Err: rej})
	return nil, rej
}

// retryLater returns the rejection of a call that the server asks to come
// back: code and msg, with the retry hint both ways a client may read it
// (a google.rpc.RetryInfo detail, and the grpc-retry-pushback-ms trailer,
// which it sets). errors.Is of it matches sentinel.
func (c *srvIdemCall) retryLater(code codes.Code, msg string, sentinel error) *srvRejection {
	st := status.New(code, msg)
	if withHint, err := st.WithDetails(c.s.retryHint); err == nil {
		st = withHint
	}
	_ = grpc.SetTrailer(c.ctx, c.s.pushbackMD)
	return &srvRejection{code: code, msg: msg, sentinel: sentinel, st: st}
}

// poll is the wait of step claim for an owner in another process: it sleeps
// the current backoff, never past the owner's remaining lease (retryAfter),
// and doubles the backoff up to the poll maximum. It returns the call's
// status when its context ends first.
func (c *srvIdemCall) poll(retryAfter time.Duration) error {
	d := min(c.backoff, max(retryAfter, time.Millisecond))
	c.backoff = min(2*c.backoff, c.s.pollMax)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-c.ctx.Done():
		return status.FromContextError(c.ctx.Err()).Err()
	}
}

// run is step run: the call owns the claim (token) and runs the handler,
// whose metadata it captures, under the lease's renewal (srvRenewal), which
// cancels the handler's context at the lease's cutoff on the server's own
// clock; then it settles the claim: deferred, so that a panic settles it
// too before it goes on. By default the handler runs detached from the
// caller (srvDetached), until the server's maximum, counted, as its lease
// is, from claimed: a time before the Claim was sent. A claim that came
// back too late to run under its lease (the store answered after the
// cutoff) does not run the handler: it is released, and the call gets
// UNAVAILABLE, which a retry may try again.
func (c *srvIdemCall) run(token string, claimed time.Time) (resp any, err error) {
	c.token, c.sctx = token, c.ctx
	if c.s.detach || c.s.detachMax > 0 {
		c.sctx = context.WithoutCancel(c.ctx)
	}
	var hctx *srvDetached
	if c.s.detachMax > 0 {
		// Idempotency.DetachedMax: the caller's end does not reach the
		// handler; the server's maximum and the lease do (the renewal ends
		// hctx), and so does the handler's return, as grpc ends a call's
		// context (deferred after settle, so it runs last).
		hctx = newSrvDetached(c.sctx, claimed.Add(c.s.detachMax))
	} else {
		hctx = newSrvAttached(c.ctx)
	}
	defer hctx.release()
	c.own = &srvOwned{fp: c.f.key.fp, method: c.info.FullMethod, caller: c.ctx, stream: grpc.ServerTransportStreamFromContext(c.ctx)}
	tooLate := !time.Now().Before(claimed.Add(c.s.lease - srvLeaseMargin(c.s.lease)))
	if !tooLate { // else its cutoff has passed: the renewal would cut, and log, a handler that never runs
		c.renewal = startRenewal(c.s, c.sctx, c.f.key.rk, token, c.s.lease, c.info.FullMethod, hctx, claimed)
	}
	panicked := true
	running := c.s.handlers.add(hctx) // Shutdown waits for it, or cancels it
	if running {
		defer c.s.handlers.remove(hctx) // after settle
	}
	defer func() { c.settle(resp, err, panicked) }()
	switch {
	case !running:
		panicked = false
		return nil, c.s.refused.shutdown(c.ctx, c.info.FullMethod)
	case tooLate:
		panicked = false
		return nil, c.claimedTooLate()
	}
	c.s.m.execution(c.ctx, c.info.FullMethod)
	resp, err = c.s.runHandler(c.ctx, grpc.NewContextWithServerTransportStream(hctx, c.own), c.req, c.info, c.handler)
	panicked = false
	return resp, err
}

// claimedTooLate is the answer of a call whose Claim came back after its
// lease's cutoff: the handler does not run, since a duplicate may claim the
// key before it ends. UNAVAILABLE, with the retry hint, and not stored.
func (c *srvIdemCall) claimedTooLate() error {
	c.s.log.warn("idempotency: the store answered the claim too late to run the handler under its lease; not running it",
		"method", c.info.FullMethod)
	shed := &srvShed{c.retryLater(codes.Unavailable, "idempotency: the store answered too late to run the call under its lease; retry",
		ErrIdempotencyStoreUnavailable)}
	c.s.refused.report(c.ctx, Refusal{FullMethod: c.info.FullMethod, Reason: RefusalStoreUnavailable, Err: shed})
	return shed
}

// settle is step settle: the one place where an owned claim ends. It stops
// the lease's renewal and the capture of metadata, then completes the claim with the handler's
// outcome (complete) or, failing that, releases it: this is the only
// release of a claim the interceptor holds. How each end of the call leads
// here, and what it does:
//
//   - handler success, or an error with a stored code: complete, and the
//     flight's waiters take the outcome, stored or not. When the outcome
//     cannot be stored (the reply is not a proto message, the record is
//     over the store's bound, the store fails): release, so a later
//     duplicate runs the handler again. When the lease has ended and the
//     key is absent, Complete stores it all the same; when another call
//     has claimed it since (ErrNotOwner): nothing, the key is not ours.
//   - handler error with an unstored code (UNAVAILABLE, RESOURCE_EXHAUSTED,
//     ABORTED, ... see Idempotency.UnstoredCodes): release, so a retry
//     runs the handler again.
//   - caller cancellation: the handler returns CANCELLED or
//     DEADLINE_EXCEEDED, unstored by default: release. The store calls here
//     use sctx, which the caller's cancellation does not reach; a store
//     over the network gets one lease for them (a Release that takes longer
//     is no use: the lease ends by then; a store that hangs does not hold
//     the call for ever).
//   - the server's refusal on the admission path (a *srvShed: shed by the
//     limit or the CPU, shutting down, the caller gone while queued, the
//     claim answered too late): release, whatever UnstoredCodes says.
//   - handler panic: release (run's defer), and the panic goes on.
//   - store error: in Complete, as above, release; in Claim, no claim is
//     held (see claimFailed).
func (c *srvIdemCall) settle(resp any, herr error, panicked bool) {
	if c.renewal != nil { // nil for a claim that came back too late
		c.renewal.stop()
		c.renewal = nil // pooled: no longer the call's
	}
	c.own.close()
	if c.s.detach { // a store over the network: bound its calls (the memory store never blocks)
		var cancel context.CancelFunc
		c.sctx, cancel = context.WithTimeout(c.sctx, c.s.lease)
		defer cancel()
	}
	if !panicked && c.complete(resp, herr) {
		return
	}
	start := c.s.m.start()
	err := c.s.store.Release(c.sctx, c.f.key.rk, c.token)
	c.s.m.storeDone(c.sctx, c.info.FullMethod, srvOpRelease, start, err)
	if err != nil && !errors.Is(err, idempotency.ErrNotOwner) {
		c.s.log.warn("idempotency: releasing the claim failed; it ends with its lease", "method", c.info.FullMethod, "error", err)
	}
}

// complete stores the handler's outcome under the claim and reports whether
// the claim has ended: stored (c.f.out then holds the outcome for the
// flight's waiters), or no longer ours. false: the caller must release it.
func (c *srvIdemCall) complete(resp any, herr error) bool {
	method := c.info.FullMethod
	if isShed(herr) || c.s.retryable.Has(rescodes.Classify(herr)) { // the server's refusal is never the key's outcome
		return false
	}
	if err := srvRecord(c.own, resp, herr); err != nil {
		c.s.log.warn("idempotency: outcome not stored", "method", method, "error", err)
		return false
	}
	rec := &c.own.rec
	rec.Header, rec.Trailer = c.s.omitted(rec.Header), c.s.omitted(rec.Trailer)
	// The flight's waiters are duplicates of this very request: they take
	// this outcome whatever the store does with it, rather than run the
	// handler again (finding 4 of issue 14).
	c.f.out = srvOutcome{ok: true, rec: rec}
	start := c.s.m.start()
	err := c.s.store.Complete(c.sctx, c.f.key.rk, c.token, rec, c.s.ttl)
	c.s.m.storeDone(c.sctx, c.info.FullMethod, srvOpComplete, start, err)
	switch {
	case err == nil:
		return true
	case errors.Is(err, idempotency.ErrNotOwner):
		c.s.log.warn("idempotency: outcome not stored: another call claimed the key after this one's lease ended",
			"method", method, "error", err)
		return true
	case errors.Is(err, idempotency.ErrRecordTooLarge):
		c.s.log.warn("idempotency: outcome not stored: larger than the store's bound; duplicates will run the handler again",
			"method", method, "bytes", rec.Size(), "error", err)
	default:
		c.s.log.warn("idempotency: outcome not stored: store failed", "method", method, "error", err)
	}
	return false
}

// shared records how a flight's outcome reaches a call that awaited it: a
// replay, or a conflict (the key reused with another request, or in
// progress with waiting off).
func (c *srvIdemCall) shared(out *srvOutcome) {
	switch {
	case out.rec != nil:
		c.s.m.replay(c.ctx, c.info.FullMethod, srvFromFlight, out.rec)
	case out.pushback:
		c.s.m.conflict(c.ctx, c.info.FullMethod, srvInProgress)
	case out.err != nil:
		c.s.m.conflict(c.ctx, c.info.FullMethod, srvMismatch)
	}
}
