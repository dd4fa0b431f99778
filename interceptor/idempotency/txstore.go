package idempotency

import (
	"context"
	"errors"
	"time"
)

// TxStore is a Store that can hold a call's claim in a database
// transaction which the call's handler joins, so that the handler's own
// writes and the call's record commit together or not at all (package
// pgstore's joined mode). server.Server recognises it: when the store
// of server.Idempotency is a TxStore, a keyed unary call is claimed with
// ClaimTx instead of Claim, and, when Owned, its handler runs with the
// transaction in its context ([Txn.Context]); its outcome is then stored
// with [Txn.Commit], or the transaction rolled back ([Txn.Rollback]) after
// an unstored code or a panic. Nothing renews a lease: the transaction
// holds the key while it is open, and a crashed owner's transaction is
// rolled back by the database, which frees the key.
//
// The Store methods keep their own meaning (a lease held outside any
// transaction); the interceptor does not call them for a TxStore.
type TxStore interface {
	Store

	// ClaimTx claims key for the request whose fingerprint is given inside
	// a new transaction. Its states are those of Claim: Owned with a
	// non-nil Txn, which the caller must end with exactly one Commit or
	// Rollback; Completed with the record; Mismatch; InProgress, when
	// another owner holds the key (the store may have waited for it, up to
	// a bound of its own: the caller should not wait more, but answer
	// ABORTED with a pushback). lease bounds how long a takeover waits when
	// the owner is gone but its key is not yet free (a store that commits
	// progress before the end, as pgstore's phases do). An error means the
	// store could not answer; nothing is held then. A *FullError refuses
	// the claim for room, as with Claim.
	ClaimTx(ctx context.Context, key RecordKey, fingerprint []byte, lease time.Duration) (Claim, Txn, error)
}

// Txn is an owned claim of a [TxStore], held in a transaction that the
// handler joins. Its methods are called from one goroutine, the handler's.
type Txn interface {
	// Context returns ctx carrying the transaction, for the handler (pgstore
	// gives it to the handler through pgstore.Tx).
	Context(ctx context.Context) context.Context

	// Commit stores rec for ttl in the transaction and commits it: the
	// handler's writes and the record together. It ends the Txn. When it
	// returns an error the transaction did not commit, or, when the
	// connection broke during COMMIT, its outcome is unknown; either way
	// the caller must not answer with the outcome (its writes may not have
	// happened) but with a status its client retries: the retry finds the
	// record committed and replays it, or finds the key free, the writes
	// rolled back with it, and runs the call again. Two errors say more:
	// one wrapping ErrTxConflict (nothing committed, a retry would succeed:
	// answer ABORTED with a retry hint), and a *ReplacedError (the store
	// stored its own verdict as the key's outcome: answer with it).
	Commit(ctx context.Context, rec *Record, ttl time.Duration) error

	// Rollback rolls back the transaction: the handler's writes and the
	// claim. It ends the Txn; an error is only worth logging (the database
	// rolls back a transaction whose connection is gone).
	Rollback(ctx context.Context) error
}

// ErrTxConflict is wrapped by the error of Txn.Commit when the call's
// transaction failed with a conflict that a retry of it resolves, a
// serialization failure or a deadlock (PostgreSQL's SQLSTATE 40001 and
// 40P01), or a wait cut short by a lock or statement timeout (55P03,
// 57014), met by a statement of the handler or by the COMMIT: nothing was
// committed nor stored, so the key is free. The interceptor answers
// ABORTED with its retry hint, and the retry runs the call again.
var ErrTxConflict = errors.New("idempotency: the call's transaction met a conflict with another " +
	"(a serialization failure, a deadlock, a lock or statement timeout) and was rolled back; a retry runs it again")

// ReplacedError is the error of Txn.Commit when the store committed
// Record, its own verdict, as the key's outcome in place of the record it
// was given, because the handler broke the rules of its transaction (for
// pgstore: it ended the transaction itself, or answered success over an
// aborted one). The key is not run again: every duplicate gets Record.
// The interceptor answers the call with Record too, as it answers a
// replay.
type ReplacedError struct {
	// Record is the outcome stored for the key.
	Record *Record
	// Reason says what the handler did.
	Reason string
}

// Error returns the reason.
func (e *ReplacedError) Error() string {
	return "idempotency: the call's outcome was replaced by the store's verdict: " + e.Reason
}
