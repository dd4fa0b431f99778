package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
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
//     SendBatch until its results are closed. One at a time: a statement
//     sent while another is under way (from another goroutine, or rows not
//     yet closed) fails at once with ErrTxBusy and sends nothing. pgx says
//     "conn busy" in that case when it sees it, but its check is not safe
//     for concurrent use: two goroutines' statements at once race on the
//     connection, and leave it in a state where the store's commit fails.
//   - a phase's commit stops new statements (they wait for it) and waits
//     for those under way; the end of the txn (Commit, Rollback) stops
//     them for good (they fail with pgx.ErrTxClosed) and waits likewise.
//   - that wait is bounded by the lock timeout (WithLockTimeout): a
//     statement that does not end by then (rows never closed, a goroutine's
//     long query) has the connection abandoned: it leaves the pool, and its
//     socket is closed, which ends the session, so PostgreSQL rolls the
//     transaction back; the call is not committed, and an error is logged.
//
// When a statement's round trip ends (txn.exit), the gate reads what it
// did to the transaction (txn.observe): the connection left outside any
// transaction (the handler's COMMIT or ROLLBACK: every statement after is
// refused with ErrTxEnded), a serialization failure, a deadlock, or a lock
// or statement timeout (isTransient), the failure that aborted the
// transaction. The commit reads them.

// enter admits a statement of the handler: it returns the connection and
// the transaction's generation; the caller calls exit once the statement's
// round trip has ended. While a phase commits, it waits for the commit;
// once the txn has ended, it returns pgx.ErrTxClosed, once the handler
// ended the transaction itself, ErrTxEnded, and while another statement is
// under way, ErrTxBusy.
func (t *txn) enter() (*pgx.Conn, int, error) {
	t.mu.Lock()
	for t.excl != nil && !t.done {
		wait := t.excl
		t.mu.Unlock()
		<-wait
		t.mu.Lock()
	}
	defer t.mu.Unlock()
	switch {
	case t.done:
		return nil, 0, pgx.ErrTxClosed
	case t.ended:
		return nil, 0, ErrTxEnded
	case t.busy > 0:
		return nil, 0, ErrTxBusy
	}
	t.busy++
	return t.conn.Conn(), t.gen, nil
}

// exit ends a statement that enter admitted, whose error was err.
func (t *txn) exit(err error) {
	t.mu.Lock()
	t.observe(err)
	t.busy--
	if t.busy == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
	t.mu.Unlock()
}

// errAbortedUnseen stands for the failure that aborted the transaction
// when the gate did not see its error (a batch's).
var errAbortedUnseen = errors.New("a statement failed")

// observe records what a statement of the handler, whose error was err,
// did to the transaction. t.mu is held.
func (t *txn) observe(err error) {
	if err != nil && t.conflict == nil && isTransient(err) {
		t.conflict = err
	}
	pc := t.conn.Conn().PgConn()
	if pc.IsClosed() {
		return
	}
	switch pc.TxStatus() {
	case 'I':
		t.ended = true
	case 'E':
		if t.aborted == nil {
			t.aborted = err
			if err == nil {
				t.aborted = errAbortedUnseen
			}
		}
	case 'T':
		t.aborted = nil // a rollback to a savepoint
	}
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
func (t *txn) exclusive() (*pgx.Conn, ending, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return nil, ending{}, pgx.ErrTxClosed
	}
	excl := make(chan struct{})
	t.excl = excl
	if !t.quiesce() || t.done { // quiesce lets go of t.mu: an end may have begun
		t.excl = nil
		close(excl)
		if t.done {
			return nil, ending{}, pgx.ErrTxClosed
		}
		return nil, ending{}, fmt.Errorf("a statement of the handler (rows not closed, or a goroutine it started) was still under way after %v",
			t.j.opts.lockTimeout)
	}
	t.busy++
	return t.conn.Conn(), ending{bad: t.bad, ended: t.ended, conflict: t.conflict, aborted: t.aborted, xid: t.xid, gen: t.gen}, nil
}

// endExclusive ends what exclusive began.
func (t *txn) endExclusive() {
	t.mu.Lock()
	close(t.excl)
	t.excl = nil
	t.busy--
	if t.busy == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
	t.mu.Unlock()
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
// enter admits a statement on the view's transaction, exit ends it with the
// statement's error.
type stmtGate interface {
	enter() (*pgx.Conn, error)
	exit(err error)
}

// The statements of a view, each entered for its round trip. A view that
// cannot enter answers with enter's error.

func gatedExec(g stmtGate, ctx context.Context, sql string, args ...any) (tag pgconn.CommandTag, err error) {
	c, err := g.enter()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer func() { g.exit(err) }()
	return c.Exec(ctx, sql, args...)
}

func gatedPrepare(g stmtGate, ctx context.Context, name, sql string) (sd *pgconn.StatementDescription, err error) {
	c, err := g.enter()
	if err != nil {
		return nil, err
	}
	defer func() { g.exit(err) }()
	return c.Prepare(ctx, name, sql)
}

func gatedCopyFrom(g stmtGate, ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (n int64, err error) {
	c, err := g.enter()
	if err != nil {
		return 0, err
	}
	defer func() { g.exit(err) }()
	return c.CopyFrom(ctx, table, cols, src)
}

func gatedQuery(g stmtGate, ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c, err := g.enter()
	if err != nil {
		return &errRows{err: err}, err
	}
	rows, err := c.Query(ctx, sql, args...)
	if err != nil {
		g.exit(err)
		return rows, err
	}
	return &gatedRows{Rows: rows, g: g}, nil
}

func gatedQueryRow(g stmtGate, ctx context.Context, sql string, args ...any) pgx.Row {
	c, err := g.enter()
	if err != nil {
		return errRow{err}
	}
	return &gatedRow{row: c.QueryRow(ctx, sql, args...), g: g}
}

func gatedSendBatch(g stmtGate, ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c, err := g.enter()
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return &gatedBatch{BatchResults: c.SendBatch(ctx, b), g: g}
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
		r.g.exit(r.Rows.Err())
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

// Conn is nil: the connection is the store's (see Tx).
func (r *gatedRows) Conn() *pgx.Conn { return nil }

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
		scanErr := err
		if errors.Is(err, pgx.ErrNoRows) {
			scanErr = nil // the statement ran
		}
		r.g.exit(scanErr)
	}
	return err
}

// gatedBatch holds its statements entered until the results are closed,
// and remembers the first error of its statements for the gate.
type gatedBatch struct {
	pgx.BatchResults
	g      stmtGate
	first  error
	exited bool
}

func (b *gatedBatch) keep(err error) {
	if b.first == nil && err != nil && !errors.Is(err, pgx.ErrNoRows) {
		b.first = err
	}
}

func (b *gatedBatch) Exec() (pgconn.CommandTag, error) {
	tag, err := b.BatchResults.Exec()
	b.keep(err)
	return tag, err
}

func (b *gatedBatch) Query() (pgx.Rows, error) {
	rows, err := b.BatchResults.Query()
	b.keep(err)
	return noConnRows{rows}, err
}

// noConnRows are rows of a batch of the handler's, whose Conn is nil (see
// Tx).
type noConnRows struct{ pgx.Rows }

func (noConnRows) Conn() *pgx.Conn { return nil }

func (b *gatedBatch) QueryRow() pgx.Row {
	return batchRow{row: b.BatchResults.QueryRow(), b: b}
}

func (b *gatedBatch) Close() error {
	err := b.BatchResults.Close()
	if !b.exited {
		b.exited = true
		b.keep(err)
		b.g.exit(b.first)
	}
	return err
}

// batchRow is a row of a gatedBatch, whose Scan's error the batch keeps.
type batchRow struct {
	row pgx.Row
	b   *gatedBatch
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	r.b.keep(err)
	return err
}

// errRow is a pgx.Row whose Scan returns err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errRows is pgx.Rows that failed with err before any row.
type errRows struct{ err error }

func (r *errRows) Close()                                       {}
func (r *errRows) Err() error                                   { return r.err }
func (r *errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r *errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r *errRows) Next() bool                                   { return false }
func (r *errRows) Scan(...any) error                            { return r.err }
func (r *errRows) Values() ([]any, error)                       { return nil, r.err }
func (r *errRows) RawValues() [][]byte                          { return nil }
func (r *errRows) Conn() *pgx.Conn                              { return nil }
func (r *errRows) TypeMap() *pgtype.Map                         { return nil }
