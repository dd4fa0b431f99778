package server

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// Joined mode: the steps claim, run and settle of a keyed call whose store
// is an idempotency.TxStore (pgstore.Store.Joined). The claim is a
// transaction that holds the key's row; the handler joins it (its context
// carries it); settle commits the handler's writes with the record, or
// rolls both back:
//
//	claimJoined ──► runJoined ──► settleJoined: Commit (stored code), or Rollback
//	     │
//	     └─ Completed: replay; Mismatch: FAILED_PRECONDITION; InProgress
//	        (the owner's transaction holds the key): poll, as for a lease
//	        elsewhere, claiming again (the store's lookup, one round trip,
//	        no connection held between), or ABORTED with pushback when
//	        waiting is off; never a second execution
//
// There is no lease to renew: the open transaction holds the key, and the
// database rolls back a dead owner's transaction, which frees it. Nothing
// of the other path changes for the memory or Redis store: claim branches
// here only when srvIdem.tx is set.

// claimJoined is step claim in joined mode, for the flight the call leads
// (claim finishes the flight).
func (c *srvIdemCall) claimJoined() (any, error) {
	for {
		start := c.s.m.start()
		cl, txn, err := c.s.tx.ClaimTx(c.ctx, c.f.key.rk, c.f.key.fp[:], c.s.lease)
		c.s.m.storeDone(c.ctx, c.info.FullMethod, srvOpClaim, start, err)
		if err != nil {
			return c.claimFailed(err)
		}
		switch cl.State {
		case idempotency.Owned:
			if txn == nil {
				return nil, status.Error(codes.Internal, "idempotency: the store returned an owned claim without its transaction")
			}
			return c.runJoined(txn)
		case idempotency.Completed:
			return c.completed(cl.Record)
		case idempotency.Mismatch:
			return c.mismatch()
		case idempotency.InProgress:
			// The owner's transaction holds the key. The store answered at
			// once and holds no connection: wait here, as for a lease held
			// elsewhere, and claim again.
			if c.s.noWait {
				c.f.out = c.s.inProgress
				c.s.m.conflict(c.ctx, c.info.FullMethod, srvInProgress)
				return c.s.replayShared(c.ctx, &c.f.out)
			}
			c.s.m.wait(c.ctx, c.info.FullMethod, srvWaitPoll)
			if err := c.poll(cl.RetryAfter); err != nil {
				return nil, err
			}
		default:
			return nil, status.Errorf(codes.Internal, "idempotency: store returned claim state %v", cl.State)
		}
	}
}

// runJoined is step run in joined mode: the handler runs with the
// transaction in its context (pgstore.Tx reads it), detached from the
// caller as in run (the caller's end must not cancel a transaction that
// is about to commit), bounded by the server's maximum; then settleJoined
// ends the transaction, deferred so that a panic rolls it back before it
// goes on.
func (c *srvIdemCall) runJoined(txn idempotency.Txn) (resp any, err error) {
	c.sctx = context.WithoutCancel(c.ctx)
	var hctx *srvDetached
	if c.s.detachMax > 0 {
		hctx = newSrvDetached(c.sctx, time.Now().Add(c.s.detachMax))
		deadline := time.AfterFunc(c.s.detachMax, func() { hctx.end(context.DeadlineExceeded) })
		defer deadline.Stop()
	} else {
		hctx = newSrvAttached(c.ctx)
	}
	defer hctx.release() // after settleJoined: deferred calls run last in, first out
	c.own = &srvOwned{fp: c.f.key.fp, method: c.info.FullMethod, caller: c.ctx, stream: grpc.ServerTransportStreamFromContext(c.ctx)}
	panicked := true
	running := c.s.handlers.add(hctx) // Shutdown waits for it, or cancels it
	if running {
		defer c.s.handlers.remove(hctx)
	}
	defer func() { resp, err = c.settleJoined(txn, resp, err, panicked) }()
	if !running {
		panicked = false
		return nil, c.s.refused.shutdown(c.ctx, c.info.FullMethod)
	}
	c.s.m.execution(c.ctx, c.info.FullMethod)
	resp, err = c.s.runHandler(c.ctx, grpc.NewContextWithServerTransportStream(txn.Context(hctx), c.own), c.req, c.info, c.handler)
	panicked = false
	return resp, err
}

// settleJoined is step settle in joined mode, the one place where the
// transaction ends, once, whichever way the handler ended:
//
//   - success, or an error with a stored code: Commit stores the outcome
//     with the handler's writes (for an error, the store first undoes the
//     writes) and commits, before the reply is sent; the flight's waiters
//     take the outcome only then. If Commit fails, the outcome did not
//     happen, or is unknown: the call gets UNAVAILABLE with the retry hint,
//     never the reply, and its retry replays the committed record or runs
//     the call again after a rollback (see package pgstore).
//   - the server's refusal on the admission path (a *srvShed), an
//     unstored code (UNAVAILABLE, ABORTED, ...), a panic, or an outcome
//     that cannot be recorded (a reply that is not a proto message):
//     Rollback, of the writes and the claim; the call gets the handler's
//     error, the panic goes on, or INTERNAL.
//
// The store calls use sctx, which the caller's end does not reach.
func (c *srvIdemCall) settleJoined(txn idempotency.Txn, resp any, herr error, panicked bool) (any, error) {
	c.own.close()
	// Bounded, so that a database that hangs does not hold the call for
	// ever: a Commit cut short is an unknown outcome (notCommitted).
	sctx, cancel := context.WithTimeout(c.sctx, c.s.lease)
	defer cancel()
	c.sctx = sctx
	if panicked || isShed(herr) || c.s.retryable.Has(rescodes.Classify(herr)) {
		c.rollbackJoined(txn)
		return resp, herr
	}
	if err := srvRecord(c.own, resp, herr); err != nil {
		c.rollbackJoined(txn)
		c.s.log.warn("idempotency: outcome not recorded, its transaction rolled back", "method", c.info.FullMethod, "error", err)
		return nil, status.Error(codes.Internal, "idempotency: the outcome could not be recorded, so its writes were rolled back: "+err.Error())
	}
	rec := &c.own.rec
	rec.Header, rec.Trailer = c.s.omitted(rec.Header), c.s.omitted(rec.Trailer)
	start := c.s.m.start()
	err := txn.Commit(c.sctx, rec, c.s.ttl)
	c.s.m.storeDone(c.sctx, c.info.FullMethod, srvOpComplete, start, err)
	if replaced, ok := errors.AsType[*idempotency.ReplacedError](err); ok && replaced.Record != nil {
		// The store stored its own verdict for the key (the handler broke
		// its transaction's rules): the call gets it, as every duplicate.
		c.s.log.warn("idempotency: the store replaced the call's outcome with its verdict", "method", c.info.FullMethod, "error", err)
		return c.completed(replaced.Record)
	}
	if err != nil {
		return nil, c.notCommitted(err)
	}
	c.f.out = srvOutcome{ok: true, rec: rec}
	return resp, herr
}

// rollbackJoined rolls the transaction back; a failure is logged (the
// database rolls back a transaction whose connection is gone).
func (c *srvIdemCall) rollbackJoined(txn idempotency.Txn) {
	start := c.s.m.start()
	err := txn.Rollback(c.sctx)
	c.s.m.storeDone(c.sctx, c.info.FullMethod, srvOpRelease, start, err)
	if err != nil {
		c.s.log.warn("idempotency: rolling back the joined transaction failed", "method", c.info.FullMethod, "error", err)
	}
}

// notCommitted answers a call whose transaction did not commit, or may
// not have: UNAVAILABLE with the retry hint (a conflict with another
// transaction: ABORTED with the hint; a record over the store's bound:
// INTERNAL, which a retry would meet again).
func (c *srvIdemCall) notCommitted(err error) error {
	if errors.Is(err, idempotency.ErrTxConflict) {
		return c.retryLater(codes.Aborted, "idempotency: the call's transaction met a conflict with another "+
			"(serialization failure, deadlock, lock or statement timeout) and was rolled back; retry with the same key: "+err.Error(),
			idempotency.ErrTxConflict)
	}
	if errors.Is(err, idempotency.ErrRecordTooLarge) {
		c.s.log.warn("idempotency: outcome larger than the store's bound; its transaction was rolled back",
			"method", c.info.FullMethod, "error", err)
		return status.Error(codes.Internal, "idempotency: the outcome is larger than the store's bound, so its writes were rolled back")
	}
	c.s.log.warn("idempotency: the joined transaction did not commit, or its outcome is unknown; the caller retries",
		"method", c.info.FullMethod, "error", err)
	return c.retryLater(codes.Unavailable, "idempotency: the call's transaction did not commit (or its outcome is unknown); "+
		"retry with the same key: "+err.Error(), ErrIdempotencyStoreUnavailable)
}
