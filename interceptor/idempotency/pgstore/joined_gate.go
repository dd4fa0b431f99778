package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The gate between the handler's statements and the ends of its txn.
//
// A pgx connection serves one statement at a time, from one goroutine. The
// handler's statements (through Tx, from the handler or from a goroutine it
// started and that outlives it) and the store's own (a phase's commit, the
// commit or rollback when the handler has returned) share the txn's
// connection, so they take turns:
//
//   - a handler's statement enters (txn.enter) for its whole round trip:
//     Exec, Prepare, CopyFrom and Begin until they return; Query until its
//     rows are closed (Close, or Next returning false); QueryRow until Scan;
//     SendBatch until its results are closed. Statements enter together, as
//     they do without the store: the handler orders them.
//   - a phase's commit stops new statements (they wait for it) and waits
//     for those under way; the end of the txn (Commit, Rollback) stops
//     them for good (they fail with pgx.ErrTxClosed) and waits likewise.
//   - that wait is bounded by the lock timeout (WithLockTimeout): a
//     statement that does not end by then (rows never closed, a goroutine's
//     long query) has the connection abandoned: it leaves the pool, and its
//     socket is closed, which ends the session, so PostgreSQL rolls the
//     transaction back; the call is not committed, and an error is logged.

// enter admits a statement of the handler: it returns the current
// transaction and its generation; the caller calls exit once the
// statement's round trip has ended. While a phase commits, it waits for
// the commit; once the txn has ended, it returns pgx.ErrTxClosed.
func (t *txn) enter() (pgx.Tx, int, error) {
	t.mu.Lock()
	for t.excl != nil && !t.done {
		wait := t.excl
		t.mu.Unlock()
		<-wait
		t.mu.Lock()
	}
	defer t.mu.Unlock()
	if t.done {
		return nil, 0, pgx.ErrTxClosed
	}
	t.busy++
	return t.tx, t.gen, nil
}

// exit ends a statement that enter admitted.
func (t *txn) exit() {
	t.mu.Lock()
	t.busy--
	if t.busy == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
	t.mu.Unlock()
}

// quiesce waits, up to the lock timeout, for the statements under way to
// end, and reports whether they did. t.mu is held on entry and on return;
// the caller has stopped new statements (done, or excl).
func (t *txn) quiesce() bool {
	if t.busy == 0 {
		return true
	}
	if t.idle == nil {
		t.idle = make(chan struct{})
	}
	idle := t.idle
	t.mu.Unlock()
	timer := time.NewTimer(t.j.opts.lockTimeout)
	select {
	case <-idle:
	case <-timer.C:
	}
	timer.Stop()
	t.mu.Lock()
	return t.busy == 0
}

// exclusive stops the handler's statements for a phase's commit: new ones
// wait for it (enter), those under way have up to the lock timeout to end.
// The commit counts as a statement under way, so that an end waits for it
// too. endExclusive ends it.
func (t *txn) exclusive() (pgx.Tx, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return nil, pgx.ErrTxClosed
	}
	excl := make(chan struct{})
	t.excl = excl
	if !t.quiesce() || t.done { // quiesce lets go of t.mu: an end may have begun
		t.excl = nil
		close(excl)
		if t.done {
			return nil, pgx.ErrTxClosed
		}
		return nil, fmt.Errorf("a statement of the handler (rows not closed, or a goroutine it started) was still under way after %v",
			t.j.opts.lockTimeout)
	}
	t.busy++
	return t.tx, nil
}

// endExclusive ends what exclusive began.
func (t *txn) endExclusive() {
	t.mu.Lock()
	close(t.excl)
	t.excl = nil
	t.mu.Unlock()
	t.exit()
}

// abandon ends a txn whose handler's statements were still under way a
// lock timeout after its end began: the connection must not go back to
// the pool, nor take the commit, while one of them may use it. It leaves
// the pool (another connection takes its place), and its socket is closed
// (the one call on it that is safe from another goroutine), which ends the
// session: PostgreSQL rolls the transaction back, and the statements under
// way fail. What the goroutine does with the pgx connection after that is
// its own: nothing else holds it.
func (t *txn) abandon(op string) error {
	t.j.slots.put(t.k.scope) // first, as in release
	c := t.conn.Hijack()
	_ = c.PgConn().Conn().Close()
	err := fmt.Errorf("pgstore: %s: a statement of the handler (rows not closed, or a goroutine it started) was still under way "+
		"%v after it returned; its connection was closed, which rolls the transaction back", op, t.j.opts.lockTimeout)
	t.j.opts.logger.Error(err.Error(), "method", t.k.rk.FullMethod)
	return err
}

// stmtGate is a view of a txn the handler uses (joinedTx, savepointTx):
// enter admits a statement on the view's transaction, exit ends it.
type stmtGate interface {
	enter() (pgx.Tx, error)
	exit()
}

func (v *joinedTx) enter() (pgx.Tx, error) {
	tx, _, err := v.t.enter()
	return tx, err
}

func (v *joinedTx) exit() { v.t.exit() }

func (s *savepointTx) enter() (pgx.Tx, error) {
	_, gen, err := s.t.enter()
	if err != nil {
		return nil, err
	}
	if gen != s.gen { // a phase committed since: the savepoint is gone
		s.t.exit()
		return nil, pgx.ErrTxClosed
	}
	return s.sp, nil
}

func (s *savepointTx) exit() { s.t.exit() }

// The statements of a view, each entered for its round trip. A view that
// cannot enter answers as a closed pgx.Tx does.

func gatedExec(g stmtGate, ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tx, err := g.enter()
	if err != nil {
		return closedTx().Exec(ctx, sql, args...)
	}
	defer g.exit()
	return tx.Exec(ctx, sql, args...)
}

func gatedPrepare(g stmtGate, ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, err := g.enter()
	if err != nil {
		return closedTx().Prepare(ctx, name, sql)
	}
	defer g.exit()
	return tx.Prepare(ctx, name, sql)
}

func gatedCopyFrom(g stmtGate, ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	tx, err := g.enter()
	if err != nil {
		return closedTx().CopyFrom(ctx, table, cols, src)
	}
	defer g.exit()
	return tx.CopyFrom(ctx, table, cols, src)
}

func gatedQuery(g stmtGate, ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, err := g.enter()
	if err != nil {
		return closedTx().Query(ctx, sql, args...)
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		g.exit()
		return rows, err
	}
	return &gatedRows{Rows: rows, g: g}, nil
}

func gatedQueryRow(g stmtGate, ctx context.Context, sql string, args ...any) pgx.Row {
	tx, err := g.enter()
	if err != nil {
		return closedTx().QueryRow(ctx, sql, args...)
	}
	return &gatedRow{row: tx.QueryRow(ctx, sql, args...), g: g}
}

func gatedSendBatch(g stmtGate, ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	tx, err := g.enter()
	if err != nil {
		return closedTx().SendBatch(ctx, b)
	}
	return &gatedBatch{BatchResults: tx.SendBatch(ctx, b), g: g}
}

// gatedRows holds its statement entered until the rows are closed: by
// Close, or by Next returning false (pgx closes them then).
type gatedRows struct {
	pgx.Rows
	g      stmtGate
	exited bool // exit was called; the rows belong to one goroutine, as pgx's
}

func (r *gatedRows) done() {
	if !r.exited {
		r.exited = true
		r.g.exit()
	}
}

func (r *gatedRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.done()
	return false
}

func (r *gatedRows) Close() {
	r.Rows.Close()
	r.done()
}

// gatedRow holds its statement entered until Scan.
type gatedRow struct {
	row    pgx.Row
	g      stmtGate
	exited bool
}

func (r *gatedRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if !r.exited {
		r.exited = true
		r.g.exit()
	}
	return err
}

// gatedBatch holds its statements entered until the results are closed.
type gatedBatch struct {
	pgx.BatchResults
	g      stmtGate
	exited bool
}

func (b *gatedBatch) Close() error {
	err := b.BatchResults.Close()
	if !b.exited {
		b.exited = true
		b.g.exit()
	}
	return err
}
