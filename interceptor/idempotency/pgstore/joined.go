package pgstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
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

// ClaimTx implements idempotency.TxStore. A duplicate of a completed call
// costs one round trip: a lookup, on which it replays. A first execution
// costs one more: the lookup, then BEGIN, the claim (an INSERT of the key's
// row, which stays invisible to others until the transaction commits), and
// a savepoint, in one pipeline. A concurrent claim of the same key waits in
// that INSERT for the first transaction, up to WithLockTimeout: it then
// replays the committed outcome, owns the key after a rollback, or, past
// the bound, is InProgress.
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
		cl, owned, again, err := j.claimOn(ctx, conn, &k, fingerprint, lease, attempt)
		if owned == nil {
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

// claimOn is one attempt of ClaimTx on conn: the lookup, then the claim in
// a new transaction. again reports a lost race, worth another attempt. A
// returned txn owns conn; otherwise the caller releases it.
func (j *JoinedStore) claimOn(ctx context.Context, conn *pgxpool.Conn, k *recordKey, fp []byte, lease time.Duration,
	attempt int) (cl idempotency.Claim, owned idempotency.Txn, again bool, err error) {
	if cl, found, err := j.lookup(ctx, conn, k, fp); err != nil || found {
		return cl, nil, false, err
	}
	if err := j.slots.take(k.scope); err != nil {
		return idempotency.Claim{}, nil, false, err
	}
	defer func() {
		if owned == nil {
			j.slots.put(k.scope)
		}
	}()
	token := newToken()
	b := &pgx.Batch{}
	b.BeginTx(j.opts.txOptions)
	b.Queue(j.sql.setTimeouts, strconv.FormatInt(j.opts.lockTimeout.Milliseconds(), 10),
		strconv.FormatInt(j.opts.txIdleTimeout.Milliseconds(), 10))
	b.Queue(j.sql.claimTx, k.id, k.scope, k.part, k.rk.FullMethod, k.rk.Key, fp, token, millis(lease),
		rowSize(k, fp, 0), j.quota.entries, j.quota.bytes)
	b.Queue("SAVEPOINT " + savepoint)
	var (
		state   int16
		record  []byte
		waitMs  int64
		phases  []string
		results [][]byte
	)
	br := conn.Conn().SendBatch(ctx, b)
	tx := br.Tx()
	err = readBatch(br, 2, func() error { return br.QueryRow().Scan(&state, &record, &waitMs, &phases, &results) }, 1)
	if err != nil {
		j.rollback(ctx, tx)
		var pgErr *pgconn.PgError
		switch {
		case isLockTimeout(err): // the owner's transaction runs on
			return idempotency.Claim{State: idempotency.InProgress, RetryAfter: j.opts.lockTimeout}, nil, false, nil
		case errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01"): // serialization failure, deadlock
			return idempotency.Claim{}, nil, true, err
		}
		return idempotency.Claim{}, nil, false, fmt.Errorf("pgstore: claim: %w", err)
	}
	switch state {
	case stOwned:
		t := &txn{j: j, k: *k, token: token, lease: lease, conn: conn, tx: tx}
		t.view.t = t
		if len(phases) > 0 {
			t.phases = make(map[string][]byte, len(phases))
			for i, name := range phases {
				t.phases[name] = results[i]
			}
		}
		return idempotency.Claim{State: idempotency.Owned}, t, false, nil
	case stFull:
		j.rollback(ctx, tx)
		var wait int64
		if err := conn.QueryRow(ctx, j.sql.room, k.scope, k.part, rowSize(k, fp, 0), j.quota.entries, j.quota.bytes).Scan(&wait); err != nil {
			return idempotency.Claim{}, nil, false, fmt.Errorf("pgstore: claim: making room: %w", err)
		}
		if wait == 0 && attempt == 1 {
			return idempotency.Claim{}, nil, true, nil // room was made: claim again
		}
		return idempotency.Claim{}, nil, false, &idempotency.FullError{Scope: true, RetryAfter: time.Duration(max(wait, 1)) * time.Millisecond}
	}
	j.rollback(ctx, tx)
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

// lookup reads the key's row outside any transaction: found reports an
// answer (a completed record, a mismatch, a live lease); otherwise the key
// is free, or its owner is gone and a retry may resume its phases, and the
// caller claims it.
func (j *JoinedStore) lookup(ctx context.Context, conn *pgxpool.Conn, k *recordKey, fp []byte) (cl idempotency.Claim, found bool, err error) {
	var (
		storedFP           []byte
		record             []byte
		waitMs             *int64
		leaseLive, rowLive *bool
	)
	err = conn.QueryRow(ctx, j.sql.lookup, k.id).Scan(&storedFP, &record, &waitMs, &leaseLive, &rowLive)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return idempotency.Claim{}, false, nil
	case err != nil:
		return idempotency.Claim{}, false, fmt.Errorf("pgstore: claim: %w", err)
	case rowLive == nil || !*rowLive:
		return idempotency.Claim{}, false, nil
	case !bytes.Equal(storedFP, fp):
		return idempotency.Claim{State: idempotency.Mismatch}, true, nil
	case record != nil:
		cl, err := claimResult(stCompleted, record, 0, "")
		return cl, true, err
	case leaseLive != nil && *leaseLive:
		return idempotency.Claim{State: idempotency.InProgress, RetryAfter: time.Duration(*waitMs) * time.Millisecond}, true, nil
	}
	return idempotency.Claim{}, false, nil
}

// rollback rolls back tx, on a context detached from ctx (whose end may be
// why), bounded by cleanupTimeout. A failure leaves the connection closed
// (pgx closes it), and the database rolls the transaction back.
func (j *JoinedStore) rollback(ctx context.Context, tx pgx.Tx) {
	if tx.Conn().PgConn().TxStatus() == 'I' {
		return // nothing open (the begin failed, or COMMIT ended it): no round trip
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = tx.Rollback(ctx)
}

// txn is an owned claim of joined mode: the transaction that holds the
// key's row, on its own pool connection, until Commit or Rollback. The
// handler sees it as a pgx.Tx (joinedTx) that refuses Commit and Rollback.
type txn struct {
	j       *JoinedStore      // immutable
	k       recordKey         // immutable
	token   string            // immutable
	lease   time.Duration     // immutable
	conn    *pgxpool.Conn     // released when the txn ends
	view    joinedTx          // the handler's pgx.Tx; immutable
	mu      sync.Mutex        // guards the fields below
	tx      pgx.Tx            // the current transaction: a new one after each phase
	gen     int               // phases committed by this txn: savepoints of an older gen are gone
	done    bool              // Commit or Rollback has run
	bad     error             // a phase's commit failed: the txn can only roll back
	inPhase bool              // a Phase's fn runs: another Phase is refused
	phases  map[string][]byte // phases committed, by this call or the one it resumes
	busy    int               // the handler's statements under way, and a phase's commit (see joined_gate.go)
	idle    chan struct{}     // closed when busy drops to 0; made by a wait for it
	excl    chan struct{}     // set while a phase commits, closed when it has: statements wait for it
}

var _ idempotency.Txn = (*txn)(nil)

type txKey struct{}

// Context implements idempotency.Txn: Tx(ctx) returns the handler's view of
// the transaction.
func (t *txn) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, &t.view)
}

// current returns the current transaction, or why there is none.
func (t *txn) current() (pgx.Tx, int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return nil, 0, pgx.ErrTxClosed
	}
	return t.tx, t.gen, nil
}

// end marks t done, which closes the handler's view, and waits up to the
// lock timeout for its statements under way (see joined_gate.go). It
// returns the transaction, whether it may commit (bad), and whether those
// statements ended (quiet): if not, the caller abandons the connection.
func (t *txn) end() (tx pgx.Tx, bad error, quiet bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return nil, pgx.ErrTxClosed, false
	}
	t.done = true
	quiet = t.quiesce()
	return t.tx, t.bad, quiet
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
// writes are undone, the error is stored), then the record's update and
// COMMIT, and, after it, the row's charge to the quota (see WithScopeQuota)
// in a transaction of its own.
func (t *txn) Commit(ctx context.Context, rec *idempotency.Record, ttl time.Duration) error {
	tx, err, quiet := t.end()
	if tx == nil {
		return err
	}
	if !quiet {
		return fmt.Errorf("pgstore: not committed: %w", t.abandon("commit"))
	}
	defer t.release()
	ctx, cancel := context.WithTimeout(ctx, commitTimeout)
	defer cancel()
	if err != nil {
		t.j.rollback(ctx, tx)
		return fmt.Errorf("pgstore: not committed: %w", err)
	}
	data, err := t.j.marshal(rec)
	if err != nil {
		t.j.rollback(ctx, tx)
		return err
	}
	b := &pgx.Batch{}
	if endedBySQL(tx) {
		// The handler ended the transaction with SQL of its own: its writes
		// are committed, and cannot be undone. The outcome is stored as it
		// is, outside any transaction, so that a retry replays it rather
		// than run the handler a second time.
		t.j.opts.logger.Error("pgstore: the handler ended its joined transaction with SQL of its own (COMMIT or ROLLBACK); " +
			"its writes are not undone, and its outcome is stored without them")
	} else if rec.Code != codes.OK {
		if tx.Conn().PgConn().TxStatus() == 'E' {
			// A statement of the handler failed: pgx cannot prepare the
			// batch in an aborted transaction. Roll back to the savepoint
			// first, without arguments: the simple protocol, no prepare.
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
				t.j.rollback(ctx, tx)
				return fmt.Errorf("pgstore: commit: %w", err)
			}
		} else {
			b.Queue("ROLLBACK TO SAVEPOINT " + savepoint)
		}
	}
	b.Queue(t.j.sql.completeTx, t.k.id, t.token, data, rowSize(&t.k, rec.Fingerprint, len(data)), millis(ttl),
		millis(min(t.j.opts.minRetention, ttl)))
	if err := t.j.commitBatch(ctx, tx, b, &t.k); err != nil {
		return fmt.Errorf("pgstore: commit: %w", err)
	}
	return nil
}

// commitBatch sends b, then COMMIT, then the row's charge, in one round
// trip. An error means b or COMMIT failed: the transaction did not commit
// (it is rolled back here), or, when the connection broke, its outcome is
// unknown. A charge that fails after COMMIT is only logged.
func (j *JoinedStore) commitBatch(ctx context.Context, tx pgx.Tx, b *pgx.Batch, k *recordKey) error {
	work := b.Len()
	b.Queue("COMMIT")
	if j.quota.on() {
		b.Queue(j.sql.charge, k.id)
	}
	br := tx.SendBatch(ctx, b)
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
	j.rollback(ctx, tx)
	return failed
}

// endedBySQL reports whether the handler ended tx with SQL of its own
// (tx.Exec of COMMIT or ROLLBACK), which ErrHandlerCommit cannot refuse:
// the connection is outside any transaction while pgx holds tx open.
func endedBySQL(tx pgx.Tx) bool {
	c := tx.Conn()
	return c != nil && !c.IsClosed() && c.PgConn().TxStatus() == 'I'
}

// Rollback implements idempotency.Txn. After phases were committed, the
// row's lease is ended too, in the same round trip, so a retry resumes at
// once rather than wait for it. When the handler ended the transaction
// with SQL of its own, its writes are committed: the row, if that COMMIT
// kept it, is held for WithPhaseRetention, so that no retry runs the
// handler a second time, and Rollback returns an error that says so.
func (t *txn) Rollback(ctx context.Context) error {
	tx, bad, quiet := t.end()
	if tx == nil {
		return pgx.ErrTxClosed
	}
	if !quiet {
		// Rolled back by the session's end. A lease that phases renewed
		// is not ended: a retry waits it out.
		_ = t.abandon("rollback")
		return nil
	}
	defer t.release()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	if bad == nil && endedBySQL(tx) {
		_, err := tx.Conn().Exec(ctx, t.j.sql.holdLease, t.k.id, t.token, millis(t.j.opts.phaseRetention))
		return errors.Join(fmt.Errorf("pgstore: rollback: the handler ended its joined transaction with SQL of its own; "+
			"its writes stay committed, and its key, if that COMMIT kept it, is held for %v, not run again", t.j.opts.phaseRetention), err)
	}
	t.mu.Lock()
	committed := t.gen > 0
	t.mu.Unlock()
	if !committed || tx.Conn().PgConn().TxStatus() == 'I' {
		if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
			return fmt.Errorf("pgstore: rollback: %w", err)
		}
		return nil
	}
	b := &pgx.Batch{}
	b.Queue("ROLLBACK")
	b.Queue(t.j.sql.endLease, t.k.id, t.token)
	if err := tx.Conn().SendBatch(ctx, b).Close(); err != nil {
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

// Tx returns the transaction of a keyed call in joined mode, for its
// handler: its writes commit with the call's record, or not at all. ok is
// false when ctx has none: a call without a key, a store not in joined
// mode, an interceptor that failed open. The transaction is valid until the
// handler returns; its Commit and Rollback return ErrHandlerCommit.
func Tx(ctx context.Context) (tx pgx.Tx, ok bool) {
	v, ok := ctx.Value(txKey{}).(*joinedTx)
	return v, ok
}

// joinedTx is the handler's pgx.Tx: the current transaction of its txn,
// without Commit and Rollback; closed once the txn has ended.
type joinedTx struct{ t *txn }

var _ pgx.Tx = (*joinedTx)(nil)

func (v *joinedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, gen, err := v.t.enter()
	if err != nil {
		return closedTx().Begin(ctx)
	}
	defer v.t.exit()
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &savepointTx{t: v.t, gen: gen, sp: sp}, nil
}

func (v *joinedTx) Commit(context.Context) error   { return ErrHandlerCommit }
func (v *joinedTx) Rollback(context.Context) error { return ErrHandlerCommit }

func (v *joinedTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	return gatedCopyFrom(v, ctx, table, cols, src)
}

func (v *joinedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return gatedSendBatch(v, ctx, b)
}

// LargeObjects returns the large objects of the current transaction:
// valid, as the transaction, until the handler returns or its next phase.
// Their statements do not take turns with the store's (see Tx): use them
// from the handler's goroutine only.
func (v *joinedTx) LargeObjects() pgx.LargeObjects {
	return v.current().LargeObjects()
}

func (v *joinedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return gatedPrepare(v, ctx, name, sql)
}

func (v *joinedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return gatedExec(v, ctx, sql, args...)
}

func (v *joinedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return gatedQuery(v, ctx, sql, args...)
}

func (v *joinedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return gatedQueryRow(v, ctx, sql, args...)
}

// Conn returns the transaction's connection: valid, as the transaction,
// until the handler returns; nil after (the connection is back in the
// pool, another call's). Statements sent on it directly do not take turns
// with the store's (see Tx): use it from the handler's goroutine only.
func (v *joinedTx) Conn() *pgx.Conn {
	return v.current().Conn()
}

// current returns the current transaction, or a closed one.
func (v *joinedTx) current() pgx.Tx {
	tx, _, err := v.t.current()
	if err != nil {
		return closedTx()
	}
	return tx
}

// closedTx returns a pgx.Tx that is closed: its methods, and those of its
// LargeObjects, return pgx.ErrTxClosed.
func closedTx() pgx.Tx {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(b, pgx.ErrTxClosed).Tx()
}

// savepointTx is a savepoint the handler set (joinedTx.Begin): a pgx
// pseudo-nested transaction, closed once its txn ends or commits a phase
// (which releases the savepoint).
type savepointTx struct {
	t   *txn
	gen int
	sp  pgx.Tx
}

var _ pgx.Tx = (*savepointTx)(nil)

// current returns the savepoint's transaction, or a closed one.
func (s *savepointTx) current() pgx.Tx {
	if _, gen, err := s.t.current(); err != nil || gen != s.gen {
		return closedTx()
	}
	return s.sp
}

func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	sp, err := s.enter()
	if err != nil {
		return closedTx().Begin(ctx)
	}
	defer s.exit()
	inner, err := sp.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &savepointTx{t: s.t, gen: s.gen, sp: inner}, nil
}

func (s *savepointTx) Commit(ctx context.Context) error {
	sp, err := s.enter()
	if err != nil {
		return err
	}
	defer s.exit()
	return sp.Commit(ctx)
}

func (s *savepointTx) Rollback(ctx context.Context) error {
	sp, err := s.enter()
	if err != nil {
		return err
	}
	defer s.exit()
	return sp.Rollback(ctx)
}

func (s *savepointTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	return gatedCopyFrom(s, ctx, table, cols, src)
}

func (s *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return gatedSendBatch(s, ctx, b)
}

// LargeObjects: see joinedTx.LargeObjects.
func (s *savepointTx) LargeObjects() pgx.LargeObjects { return s.current().LargeObjects() }

func (s *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return gatedPrepare(s, ctx, name, sql)
}

func (s *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return gatedExec(s, ctx, sql, args...)
}

func (s *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return gatedQuery(s, ctx, sql, args...)
}

func (s *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return gatedQueryRow(s, ctx, sql, args...)
}

// Conn returns the savepoint's connection; nil once it is closed (see
// joinedTx.Conn).
func (s *savepointTx) Conn() *pgx.Conn { return s.current().Conn() }
