package pgstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// JoinedStore is a [Store] in joined mode: as the Store of a
// server.Idempotency, it runs each keyed call's handler in
// the transaction that holds the call's record (see the package
// documentation). It is an idempotency.TxStore; its Store methods are the
// lease mode's, on the same rows.
type JoinedStore struct{ *Store }

var _ idempotency.TxStore = (*JoinedStore)(nil)

// Joined returns the store in joined mode. The two views share their rows,
// options and reaper. The Joined of a nil *Store is nil, which
// server.WithIdempotency refuses.
func (s *Store) Joined() *JoinedStore {
	if s == nil {
		return nil
	}
	return &JoinedStore{Store: s}
}

// claimMargin bounds a ClaimTx beyond its lock waits: its pool
// acquisition and round trips, on a database that answers, take far less.
const claimMargin = 5 * time.Second

// maxClaimTxAttempts bounds the claims a ClaimTx makes when a claim loses
// a race (the key changed between the lookup and the claim, a
// serialization failure, a scope that made room).
const maxClaimTxAttempts = 3

// Claim states of joined mode beyond those of claimResult.
const (
	// stEnded: the key's first execution ended its joined transaction itself
	// (its row was committed pending, without its record): never run again.
	stEnded = 6
)

// ClaimTx implements idempotency.TxStore. A duplicate costs one round trip,
// a lookup outside any transaction, and holds no connection after it: a
// completed call is replayed; a call in progress, its owner's transaction
// holding the key's advisory lock, is InProgress at once, without a wait on
// a row lock. A first execution costs one more round trip: BEGIN, the claim
// (which pins the transaction's settings, takes the key's advisory lock and
// inserts the key's row, invisible to others until the transaction commits)
// and a savepoint, in one pipeline.
func (j *JoinedStore) ClaimTx(ctx context.Context, key idempotency.RecordKey, fingerprint []byte, lease time.Duration) (idempotency.Claim, idempotency.Txn, error) {
	k := j.recordKey(key)
	// A database that does not answer (a partition, a migration's lock on
	// the table) must not hold the call, its goroutine and a connection
	// until a deadline the caller may not have set: a claim waits up to
	// the lock timeout for a row, and claimMargin for everything else.
	ctx, cancel := context.WithTimeout(ctx, maxClaimTxAttempts*j.opts.lockTimeout+claimMargin)
	defer cancel()
	for attempt := 1; ; attempt++ {
		conn, err := j.pool.Acquire(ctx)
		if err != nil {
			return idempotency.Claim{}, nil, fmt.Errorf("pgstore: claim: %w", err)
		}
		if cl, found, err := j.lookup(ctx, conn, &k, fingerprint); err != nil || found {
			conn.Release()
			return cl, nil, err
		}
		if conn, err = j.takeSlot(ctx, conn, &k); err != nil {
			return idempotency.Claim{}, nil, err
		}
		cl, owned, again, err := j.claimOn(ctx, conn, &k, fingerprint, lease, attempt)
		if owned == nil {
			j.slots.put(k.scope)
			conn.Release()
		}
		if !again {
			return cl, owned, err
		}
		if attempt == maxClaimTxAttempts {
			return idempotency.Claim{}, nil, fmt.Errorf("pgstore: claim: the key changed under %d claims in a row", attempt)
		}
	}
}

// takeSlot takes a slot of WithJoinedTxLimit for the claim on conn. When
// none is free, it gives conn back, waits for a slot (up to the lock
// timeout) holding no connection, and acquires one again. On error it has
// released conn and holds no slot.
func (j *JoinedStore) takeSlot(ctx context.Context, conn *pgxpool.Conn, k *recordKey) (*pgxpool.Conn, error) {
	if err := j.slots.take(k.scope); err == nil {
		return conn, nil
	}
	conn.Release()
	if err := j.slots.wait(ctx, k.scope); err != nil {
		return nil, err
	}
	conn, err := j.pool.Acquire(ctx)
	if err != nil {
		j.slots.put(k.scope)
		return nil, fmt.Errorf("pgstore: claim: %w", err)
	}
	return conn, nil
}

// claimOn is one claim of ClaimTx on conn, in a new transaction, after the
// lookup found the key free and a slot was taken. again reports a lost
// race, worth another attempt. A returned txn owns conn and the slot;
// otherwise the caller gives both back.
func (j *JoinedStore) claimOn(ctx context.Context, conn *pgxpool.Conn, k *recordKey, fp []byte, lease time.Duration,
	attempt int) (cl idempotency.Claim, owned idempotency.Txn, again bool, err error) {
	token := newToken()
	b := &pgx.Batch{}
	b.Queue(j.sql.begin)
	b.Queue(j.sql.claimJoined, k.id, k.scope, k.part, k.rk.FullMethod, k.rk.Key, fp, token, millis(lease),
		millis(j.opts.phaseRetention), rowSize(k, fp, 0), j.quota.entries, j.quota.bytes, millis(j.opts.lockTimeout),
		j.opts.txIdleTimeout.Milliseconds(), j.opts.connCheck.Milliseconds())
	b.Queue("SAVEPOINT " + savepoint)
	var (
		state   int16
		record  []byte
		waitMs  int64
		phases  []string
		results [][]byte
		xid     *int64
	)
	c := conn.Conn()
	br := c.SendBatch(ctx, b)
	err = readBatch(br, 1, func() error { return br.QueryRow().Scan(&state, &record, &waitMs, &phases, &results, &xid) }, 1)
	if err != nil {
		j.rollback(ctx, c)
		switch {
		case isConflict(err): // a serialization failure under REPEATABLE READ or SERIALIZABLE, a deadlock
			return idempotency.Claim{}, nil, true, err
		case isLockTimeout(err):
			// No owner: the claim holds the key's advisory lock. A lock on
			// the table (a migration's, an operator's) outlasted the lock
			// timeout: the store cannot answer now.
			return idempotency.Claim{}, nil, false, fmt.Errorf("pgstore: claim: waited past the lock timeout (%v) "+
				"for a lock on the store's table, not for another call: %w", j.opts.lockTimeout, err)
		}
		return idempotency.Claim{}, nil, false, fmt.Errorf("pgstore: claim: %w", err)
	}
	switch state {
	case stOwned:
		if xid == nil {
			j.rollback(ctx, c)
			return idempotency.Claim{}, nil, false, errors.New("pgstore: claim: the claim returned no transaction id")
		}
		t := &txn{j: j, k: *k, fp: fp, token: token, lease: lease, conn: conn, xid: *xid}
		t.view.t = t
		if len(phases) > 0 {
			t.resumed = phases
			t.phases = make(map[string][]byte, len(phases))
			for i, name := range phases {
				t.phases[name] = results[i]
			}
		}
		return idempotency.Claim{State: idempotency.Owned}, t, false, nil
	case stFull:
		j.rollback(ctx, c)
		var wait int64
		if err := c.QueryRow(ctx, j.sql.room, k.scope, k.part, rowSize(k, fp, 0), j.quota.entries, j.quota.bytes).Scan(&wait); err != nil {
			return idempotency.Claim{}, nil, false, fmt.Errorf("pgstore: claim: making room: %w", err)
		}
		if wait == 0 && attempt == 1 {
			return idempotency.Claim{}, nil, true, nil // room was made: claim again
		}
		return idempotency.Claim{}, nil, false, &idempotency.FullError{Scope: true, RetryAfter: time.Duration(max(wait, 1)) * time.Millisecond}
	case stEnded:
		j.rollback(ctx, c)
		return idempotency.Claim{State: idempotency.Completed, Record: endedRecord(fp, endedByCommit)}, nil, false, nil
	}
	j.rollback(ctx, c)
	cl, err = claimResult(state, record, waitMs, "")
	return cl, nil, false, err
}

// readBatch reads the results of a batch: skip results of statements
// before, then row, then after results; it returns the first error, and
// closes br.
func readBatch(br pgx.BatchResults, before int, row func() error, after int) error {
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	for range before {
		_, err := br.Exec()
		keep(err)
	}
	if first == nil {
		keep(row())
	}
	if first == nil {
		for range after {
			_, err := br.Exec()
			keep(err)
		}
	}
	keep(br.Close())
	return first
}

// lookup reads the key's row outside any transaction, and tries the key's
// advisory lock (in SHARE mode, for this statement only): found reports an
// answer (a completed record, a mismatch, an owner at work); otherwise the
// key is free, or its owner is gone and a retry may resume its phases, and
// the caller claims it.
func (j *JoinedStore) lookup(ctx context.Context, conn *pgxpool.Conn, k *recordKey, fp []byte) (cl idempotency.Claim, found bool, err error) {
	var (
		storedFP                       []byte
		record                         []byte
		waitMs                         *int64
		leaseLive, rowLive, jnd, pndng *bool
		free                           bool
	)
	err = conn.QueryRow(ctx, j.sql.lookup, k.id, millis(j.opts.lockTimeout)).Scan(&storedFP, &record, &waitMs, &leaseLive,
		&rowLive, &jnd, &pndng, &free)
	if err != nil {
		return idempotency.Claim{}, false, fmt.Errorf("pgstore: claim: %w", err)
	}
	inProgress := idempotency.Claim{State: idempotency.InProgress, RetryAfter: j.opts.lockTimeout}
	switch {
	case rowLive == nil || !*rowLive: // no row, or an ended one
		if !free { // an owner's claim, not yet committed
			return inProgress, true, nil
		}
		return idempotency.Claim{}, false, nil
	case !bytes.Equal(storedFP, fp):
		return idempotency.Claim{State: idempotency.Mismatch}, true, nil
	case record != nil:
		cl, err := claimResult(stCompleted, record, 0, "")
		return cl, true, err
	case *jnd && *pndng:
		return idempotency.Claim{State: idempotency.Completed, Record: endedRecord(fp, endedByCommit)}, true, nil
	case *jnd: // committed phases: an owner at work holds the lock
		if !free {
			return inProgress, true, nil
		}
		return idempotency.Claim{}, false, nil
	case leaseLive != nil && *leaseLive: // a lease mode owner's
		return idempotency.Claim{State: idempotency.InProgress, RetryAfter: time.Duration(*waitMs) * time.Millisecond}, true, nil
	}
	return idempotency.Claim{}, false, nil
}

// rollback rolls back the transaction open on c, if any, on a context
// detached from ctx (whose end may be why), bounded by cleanupTimeout. A
// failure leaves the connection closed (pgx closes it on a cancelled
// round trip) or in a transaction, which the pool then closes, and the
// database rolls the transaction back.
func (j *JoinedStore) rollback(ctx context.Context, c *pgx.Conn) {
	if c.IsClosed() || c.PgConn().TxStatus() == 'I' {
		return // nothing open (the begin failed, or COMMIT ended it): no round trip
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, _ = c.Exec(ctx, "ROLLBACK")
}

// isConflict reports whether err is a failure that a retry of the
// transaction resolves: a serialization failure (40001) or a deadlock
// (40P01).
func isConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// isTransient reports whether err, met by a statement of the handler, is a
// failure of the moment that a retry of the call may well not meet: a
// conflict (isConflict), or a wait cut short, for a lock held by another
// transaction (lock_timeout, 55P03) or for the statement itself
// (statement_timeout, or a cancel request: 57014). Such an outcome is
// never stored: stored, it would be replayed for the TTL to every retry,
// long after the other transaction, or the load, had gone.
func isTransient(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "40001", "40P01", "55P03", "57014":
		return true
	}
	return false
}

// isEndedByHandler reports whether err is resilience_idem_owns's: the
// transaction is not the claim's, the handler ended it.
func isEndedByHandler(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "RSI01"
}

// txn is an owned claim of joined mode: the transaction that holds the
// key's row and advisory lock, on its own pool connection, until Commit or
// Rollback. The handler sees it as a pgx.Tx (joinedTx) that refuses Commit
// and Rollback, and whose statements pass the gate (joined_gate.go).
type txn struct {
	j     *JoinedStore  // immutable
	k     recordKey     // immutable
	fp    []byte        // the request's fingerprint; immutable
	token string        // immutable
	lease time.Duration // immutable
	conn  *pgxpool.Conn // released when the txn ends
	view  joinedTx      // the handler's pgx.Tx; immutable
	// resumed are the phases the call resumes after, in order; immutable
	resumed []string

	mu      sync.Mutex        // guards the fields below
	xid     int64             // the current transaction's id (txid_current()): a new one after each phase
	gen     int               // phases committed by this txn: savepoints of an older gen are gone
	sps     int               // savepoints the handler set: their names' numbers
	done    bool              // Commit or Rollback has run
	bad     error             // a phase's commit failed: the txn can only roll back
	inPhase bool              // a Phase's fn runs: another Phase is refused
	phases  map[string][]byte // phases committed, by this call or the one it resumes
	busy    int               // the handler's statements under way, and a phase's commit (see joined_gate.go)
	idle    chan struct{}     // closed when busy drops to 0; made by a wait for it
	excl    chan struct{}     // set while a phase commits, closed when it has: statements wait for it

	// What the handler's statements did, as the gate saw them:
	ended        bool  // one left the connection outside any transaction: the handler's COMMIT or ROLLBACK
	commitCalled bool  // the handler called the view's Commit (which refuses): see Commit
	conflict     error // one failed with a serialization failure, a deadlock, or a lock or statement timeout (isTransient)
	aborted      error // the failure that left the transaction aborted; nil while it is not
}

var _ idempotency.Txn = (*txn)(nil)

type txKey struct{}

// Context implements idempotency.Txn: Tx(ctx) returns the handler's view of
// the transaction.
func (t *txn) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, &t.view)
}

// ending is what end found: the state of the txn when its end began.
type ending struct {
	bad          error
	ended        bool
	commitCalled bool
	conflict     error
	aborted      error
	xid          int64
	gen          int
}

// end marks t done, which closes the handler's view, and waits up to the
// lock timeout for its statements under way (see joined_gate.go). It
// returns what the txn's statements left, and whether they ended (quiet):
// if not, the caller abandons the connection. ok is false when t had ended
// already.
func (t *txn) end() (e ending, quiet, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return ending{}, false, false
	}
	t.done = true
	quiet = t.quiesce()
	return ending{bad: t.bad, ended: t.ended, commitCalled: t.commitCalled, conflict: t.conflict, aborted: t.aborted,
		xid: t.xid, gen: t.gen}, quiet, true
}

// release gives the txn's slot (see WithJoinedTxLimit) back, then its
// connection, so that a claim that gets the connection finds the slot
// free; abandon is the other way a txn ends.
func (t *txn) release() {
	t.j.slots.put(t.k.scope)
	t.conn.Release()
}

// commitTimeout bounds a joined commit or rollback: past it the outcome is
// unknown, as when the connection breaks.
const commitTimeout = 10 * time.Second

// Commit implements idempotency.Txn in one round trip: for an outcome that
// is an error, a rollback to the savepoint set before the handler (its
// writes are undone, the error is stored), then the record's update, which
// checks that the transaction is still the claim's, and COMMIT, and, after
// it, the row's charge to the quota (see WithScopeQuota) in a transaction
// of its own.
//
// It stores nothing of the outcome, and returns an error that says why, when
// the transaction met a serialization failure, a deadlock, or a lock or
// statement timeout (wrapping
// idempotency.ErrTxConflict: nothing committed, the retry runs again), or
// when the handler broke the transaction's rules: it ended the transaction
// itself, or answered success over a transaction that a failed statement
// aborted. Then the key's outcome is the store's verdict, an INTERNAL error,
// returned in an *idempotency.ReplacedError, and the call never runs again
// with that key.
func (t *txn) Commit(ctx context.Context, rec *idempotency.Record, ttl time.Duration) error {
	e, quiet, ok := t.end()
	if !ok {
		return pgx.ErrTxClosed
	}
	if !quiet {
		return fmt.Errorf("pgstore: not committed: %w", t.abandon("commit"))
	}
	defer t.release()
	ctx, cancel := context.WithTimeout(ctx, commitTimeout)
	defer cancel()
	c := t.conn.Conn()
	status := c.PgConn().TxStatus()
	switch {
	case e.ended:
		return t.settleEnded(ctx, endedByCommit)
	case e.bad != nil:
		t.j.rollback(ctx, c)
		return fmt.Errorf("pgstore: not committed: %w", e.bad)
	case status == 'I': // ended by SQL the gate did not see end (a statement left under way)
		return t.settleEnded(ctx, endedByCommit)
	case e.conflict != nil && (rec.Code != codes.OK || status == 'E'):
		t.j.rollback(ctx, c)
		return fmt.Errorf("pgstore: not committed: %w: %w", idempotency.ErrTxConflict, e.conflict)
	case status == 'E' && rec.Code == codes.OK:
		return t.settleEnded(ctx, fmt.Sprintf("answered success while a failed statement had aborted its transaction (%v); "+
			"nothing it wrote was committed", e.aborted))
	case e.commitCalled && rec.Code != codes.OK:
		// `return tx.Commit(ctx)`: the handler meant its writes committed,
		// and answered ErrHandlerCommit, an error.
		return t.settleEnded(ctx, "answered the error of Commit on its joined transaction, which only the interceptor ends "+
			"(return nil to have its writes committed with the record, an error to have them undone); nothing it wrote was committed")
	}
	data, err := t.j.marshal(rec)
	if err != nil {
		t.j.rollback(ctx, c)
		return err
	}
	b := &pgx.Batch{}
	if rec.Code != codes.OK {
		if status == 'E' {
			// A statement of the handler failed: pgx cannot prepare the
			// batch in an aborted transaction. Roll back to the savepoint
			// first, without arguments: the simple protocol, no prepare.
			if _, err := c.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
				t.j.rollback(ctx, c)
				return fmt.Errorf("pgstore: commit: %w", err)
			}
		} else {
			b.Queue("ROLLBACK TO SAVEPOINT " + savepoint)
		}
	}
	b.Queue(t.j.sql.completeJoined, t.k.id, t.token, e.xid, data, rowSize(&t.k, rec.Fingerprint, len(data)), millis(ttl),
		millis(min(t.j.opts.minRetention, ttl)))
	err = t.j.commitBatch(ctx, c, b, &t.k)
	switch {
	case err == nil:
		return nil
	case isEndedByHandler(err): // COMMIT AND CHAIN: another transaction than the claim's
		return t.settleEnded(ctx, endedByCommit)
	case isConflict(err): // at COMMIT, under SERIALIZABLE
		return fmt.Errorf("pgstore: not committed: %w: %w", idempotency.ErrTxConflict, err)
	}
	return fmt.Errorf("pgstore: commit: %w", err)
}

// commitBatch sends b, then COMMIT, then the row's charge, in one round
// trip. An error means b or COMMIT failed: the transaction did not commit
// (it is rolled back here), or, when the connection broke, its outcome is
// unknown. A charge that fails after COMMIT is only logged.
func (j *JoinedStore) commitBatch(ctx context.Context, c *pgx.Conn, b *pgx.Batch, k *recordKey) error {
	work := b.Len()
	b.Queue("COMMIT")
	if j.quota.on() {
		b.Queue(j.sql.charge, k.id)
	}
	br := c.SendBatch(ctx, b)
	var failed error
	failedAt := -1
	for i := range b.Len() {
		tag, err := br.Exec()
		if err == nil && i == work && tag.String() == "ROLLBACK" {
			err = pgx.ErrTxCommitRollback
		}
		if err != nil && failed == nil {
			failed, failedAt = err, i
		}
	}
	if err := br.Close(); err != nil && failed == nil {
		failed, failedAt = err, b.Len()
	}
	switch {
	case failed == nil:
		return nil
	case failedAt > work && failedAt < b.Len(): // the charge, after COMMIT
		j.opts.logger.Warn("pgstore: a committed row was not counted in its scope's quota", "error", failed)
		return nil
	}
	j.rollback(ctx, c)
	return failed
}

// Why a call's first execution gets the store's verdict (endedRecord).
const endedByCommit = "ended its joined transaction itself (COMMIT or ROLLBACK through Tx, or another transaction after " +
	"COMMIT AND CHAIN): what it wrote before may be committed without its record"

// endedRecord is the store's verdict on a call whose handler broke the
// rules of its joined transaction: INTERNAL, stored as the key's outcome
// in place of the handler's, so that no retry runs it again.
func endedRecord(fp []byte, why string) *idempotency.Record {
	return &idempotency.Record{Fingerprint: fp, Code: codes.Internal, Message: "pgstore: the first execution of this call " + why +
		"; its outcome was not recorded, and the call is not run again with this idempotency key"}
}

// settleEnded ends a txn whose handler broke the rules of its transaction:
// it rolls back what is open (a chained transaction, or the aborted one),
// then stores the verdict as the key's outcome, in a statement of its own
// (resilience_idem_poison), for WithPhaseRetention, and returns it in an
// *idempotency.ReplacedError. A verdict the store cannot write is logged:
// a row the handler's COMMIT left pending answers the same verdict to every
// claim (stEnded), and a claim its ROLLBACK undid left nothing of the call
// committed.
func (t *txn) settleEnded(ctx context.Context, why string) error {
	c := t.conn.Conn()
	t.j.rollback(ctx, c)
	rec := endedRecord(t.fp, why)
	err := &idempotency.ReplacedError{Record: rec, Reason: "pgstore: the handler " + why}
	t.j.opts.logger.Error("pgstore: the handler broke the rules of its joined transaction; its outcome is replaced with an "+
		"INTERNAL error, stored for the key, and the call is not run again with it", "method", t.k.rk.FullMethod, "why", why)
	data, merr := t.j.marshal(rec)
	if merr != nil {
		return err
	}
	keep := millis(t.j.opts.phaseRetention)
	var stored bool
	if perr := c.QueryRow(ctx, t.j.sql.poison, t.k.id, t.k.scope, t.k.part, t.k.rk.FullMethod, t.k.rk.Key, t.fp, t.token, data,
		rowSize(&t.k, t.fp, len(data)), keep, keep).Scan(&stored); perr != nil {
		t.j.opts.logger.Error("pgstore: storing the verdict on a handler that broke the rules of its joined transaction failed",
			"method", t.k.rk.FullMethod, "error", perr)
	}
	return err
}

// Rollback implements idempotency.Txn: the handler's writes and the claim
// are rolled back, and the key's advisory lock is released with them, so a
// retry resumes after the last committed phase at once. When the handler
// ended the transaction itself, its writes may be committed: the key gets
// the store's verdict (see Commit) and is not run again, and Rollback
// returns an error that says so.
func (t *txn) Rollback(ctx context.Context) error {
	e, quiet, ok := t.end()
	if !ok {
		return pgx.ErrTxClosed
	}
	if !quiet {
		// Rolled back by the session's end.
		_ = t.abandon("rollback")
		return nil
	}
	defer t.release()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	c := t.conn.Conn()
	if e.ended || c.PgConn().TxStatus() == 'I' && e.bad == nil {
		return fmt.Errorf("pgstore: rollback: %w", t.settleEnded(ctx, endedByCommit))
	}
	if c.PgConn().TxStatus() == 'I' {
		return nil
	}
	if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
		return fmt.Errorf("pgstore: rollback: %w", err)
	}
	return nil
}

// ErrHandlerCommit is returned by the Commit and Rollback of the
// transaction that Tx gives a handler: the interceptor ends it, once the
// handler has returned, with the record of its outcome. To undo its writes,
// a handler returns an error: one whose code is stored (INVALID_ARGUMENT,
// FAILED_PRECONDITION, ...) rolls back to the point before the handler
// and stores the error; one that is not (UNAVAILABLE, ABORTED, ...) rolls
// back everything. Savepoints (Begin) commit and roll back as usual.
var ErrHandlerCommit = errors.New("pgstore: the joined transaction is committed by the interceptor, after the handler returns; return an error to undo its writes")

// ErrTxEnded is returned by every statement of a joined transaction once
// the handler has ended it with SQL of its own (COMMIT or ROLLBACK sent
// through Tx): nothing it sends after runs, in autocommit or in the next
// call's transaction. The call's outcome is then the store's verdict (see
// [Tx]), not the handler's.
var ErrTxEnded = errors.New("pgstore: the handler ended its joined transaction itself (COMMIT or ROLLBACK through Tx); " +
	"no statement runs after it, and the call's outcome is an INTERNAL error stored for its key")

// ErrTxBusy is returned by a statement of a joined transaction sent while
// another statement of it is under way: from another goroutine of the
// handler's, or from the same one with rows not yet closed (Query until
// Close, QueryRow until Scan, SendBatch until Close). A PostgreSQL
// connection runs one statement at a time; the statement is not sent. pgx
// answers "conn busy" in the same case when it notices, but two goroutines
// at once on one connection race, and can leave it unable to commit.
var ErrTxBusy = errors.New("pgstore: another statement of the joined transaction is under way " +
	"(a connection runs one at a time: wait for it, and close its rows)")

// Tx returns the transaction of a keyed call in joined mode, for its
// handler: its writes commit with the call's record, or not at all. ok is
// false when ctx has none: a call without a key, a store not in joined
// mode, an interceptor that failed open ([InTx] serves all three with one
// code path). The transaction is valid until the handler returns; its
// Commit and Rollback return ErrHandlerCommit.
//
// The handler must not end the transaction with SQL of its own (Exec of
// COMMIT, ROLLBACK, COMMIT AND CHAIN): the store notices (the connection
// leaves the transaction, or the transaction is not the claim's), refuses
// every statement after it (ErrTxEnded), rolls back what is open, and
// stores an INTERNAL error as the key's outcome, so that the call, whose
// writes before the COMMIT may be committed, never runs again. So does a
// handler that answers success while one of its statements failed and
// aborted the transaction (SQLSTATE 25P02 for every statement after):
// nothing of it commits, and the INTERNAL error names the failure.
//
// Its Conn is nil, and its LargeObjects pass the gate as its statements
// do: nothing a handler can reach through it outlives the call.
func Tx(ctx context.Context) (tx pgx.Tx, ok bool) {
	v, ok := ctx.Value(txKey{}).(*joinedTx)
	return v, ok
}

// Beginner begins a transaction: a *pgxpool.Pool, a *pgx.Conn, or a pgx.Tx
// (a savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// InTx runs fn with the transaction of the keyed call whose handler's
// context is ctx, when it has one ([Tx]), and otherwise with a new
// transaction of db, which InTx commits when fn returns nil and rolls back
// when it does not. So a handler is written once for the calls in joined
// mode (its writes commit with the call's record, when the interceptor
// commits), for calls without a key, and for calls an interceptor that
// failed open runs without a transaction of its own.
//
// In joined mode InTx neither commits nor rolls back: fn's error is
// returned as it is, for the handler to return, and the interceptor undoes
// fn's writes according to it (see ErrHandlerCommit).
func InTx(ctx context.Context, db Beginner, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if tx, ok := Tx(ctx); ok {
		return fn(ctx, tx)
	}
	if db == nil {
		return errors.New("pgstore: InTx: no joined transaction in the context, and no db to begin one")
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return fn(ctx, tx) })
}
