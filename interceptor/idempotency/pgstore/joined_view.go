package pgstore

import (
	"context"
	"reflect"
	"strconv"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The handler's views of its txn: joinedTx, the call's transaction, and
// savepointTx, a savepoint the handler set in it (Begin). Both are pgx.Tx
// whose statements pass the gate (joined_gate.go) on the txn's connection;
// neither hands the connection out: Conn is nil, and LargeObjects run their
// statements through the view.

// joinedTx is the handler's pgx.Tx: the current transaction of its txn,
// without Commit and Rollback; closed once the txn has ended.
type joinedTx struct{ t *txn }

var _ pgx.Tx = (*joinedTx)(nil)

func (v *joinedTx) enter() (*pgx.Conn, error) {
	c, _, err := v.t.enter()
	return c, err
}

func (v *joinedTx) exit(err error) { v.t.exit(err) }

// Begin sets a savepoint (SAVEPOINT), as pgx's Begin on a transaction does:
// its Commit releases it, its Rollback rolls back to it.
func (v *joinedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	return v.t.savepoint(ctx)
}

// Commit commits nothing: it returns ErrHandlerCommit. A handler that
// answers with that error (`return tx.Commit(ctx)`) gets the store's
// verdict, an INTERNAL error, and its writes are rolled back (see Tx).
func (v *joinedTx) Commit(context.Context) error {
	v.t.mu.Lock()
	v.t.commitCalled = true
	v.t.mu.Unlock()
	return ErrHandlerCommit
}

// Rollback rolls nothing back: it returns ErrHandlerCommit, so that the
// idiom `defer tx.Rollback(ctx)` changes nothing. To undo its writes, a
// handler returns an error.
func (v *joinedTx) Rollback(context.Context) error { return ErrHandlerCommit }

func (v *joinedTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	return gatedCopyFrom(v, ctx, table, cols, src)
}

func (v *joinedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return gatedSendBatch(v, ctx, b)
}

// LargeObjects returns the large objects of the transaction, whose
// statements pass the gate as the view's own do (and fail once the call has
// ended).
func (v *joinedTx) LargeObjects() pgx.LargeObjects { return largeObjectsOf(v) }

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

// Conn is nil: the transaction's connection is the store's, and goes back
// to the pool, to another call, when the handler returns; a handler that
// kept it would write into that call's transaction.
func (v *joinedTx) Conn() *pgx.Conn { return nil }

// savepoint sets a savepoint of the handler's in t's current transaction.
func (t *txn) savepoint(ctx context.Context) (pgx.Tx, error) {
	c, gen, err := t.enter()
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	t.sps++
	name := "resilience_sp_" + strconv.Itoa(t.sps)
	t.mu.Unlock()
	_, err = c.Exec(ctx, "SAVEPOINT "+name)
	t.exit(err)
	if err != nil {
		return nil, err
	}
	return &savepointTx{t: t, gen: gen, name: name}, nil
}

// savepointTx is a savepoint the handler set (joinedTx.Begin): a pgx
// pseudo-nested transaction, closed by its Commit (RELEASE SAVEPOINT) or
// Rollback (ROLLBACK TO SAVEPOINT), and once its txn ends or commits a
// phase (which releases the savepoint).
type savepointTx struct {
	t      *txn
	gen    int
	name   string
	closed bool // guarded by t.mu
}

var _ pgx.Tx = (*savepointTx)(nil)

func (s *savepointTx) enter() (*pgx.Conn, error) {
	c, gen, err := s.t.enter()
	if err != nil {
		return nil, err
	}
	s.t.mu.Lock()
	closed := s.closed
	s.t.mu.Unlock()
	if gen != s.gen || closed { // a phase committed since, or the savepoint ended: it is gone
		s.t.exit(nil)
		return nil, pgx.ErrTxClosed
	}
	return c, nil
}

func (s *savepointTx) exit(err error) { s.t.exit(err) }

func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if _, err := s.enter(); err != nil {
		return nil, err
	}
	s.exit(nil)
	return s.t.savepoint(ctx)
}

// end runs sql (RELEASE or ROLLBACK TO the savepoint), and closes s.
func (s *savepointTx) end(ctx context.Context, sql string) (err error) {
	c, err := s.enter()
	if err != nil {
		return err
	}
	defer func() { s.exit(err) }()
	s.t.mu.Lock()
	s.closed = true
	s.t.mu.Unlock()
	_, err = c.Exec(ctx, sql+s.name)
	return err
}

func (s *savepointTx) Commit(ctx context.Context) error {
	return s.end(ctx, "RELEASE SAVEPOINT ")
}

func (s *savepointTx) Rollback(ctx context.Context) error {
	return s.end(ctx, "ROLLBACK TO SAVEPOINT ")
}

func (s *savepointTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	return gatedCopyFrom(s, ctx, table, cols, src)
}

func (s *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return gatedSendBatch(s, ctx, b)
}

// LargeObjects: see joinedTx.LargeObjects.
func (s *savepointTx) LargeObjects() pgx.LargeObjects { return largeObjectsOf(s) }

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

// Conn is nil (see joinedTx.Conn).
func (s *savepointTx) Conn() *pgx.Conn { return nil }

// largeObjectsOf returns the pgx.LargeObjects of tx, a view: every
// statement of theirs (lo_open, loread, lowrite, ...) runs through tx.
//
// pgx makes LargeObjects only over its own transactions, and a
// LargeObjects over the transaction's own connection would escape the gate:
// a large object kept by the handler would write into the next call's
// transaction on that connection. Its one field is the pgx.Tx its methods
// run on; largeObjectsLayout checks that, once, and when a pgx release
// changes it, LargeObjects are refused (their methods return
// pgx.ErrTxClosed) rather than given unguarded. TestLargeObjectsPassTheGate
// pins it.
func largeObjectsOf(tx pgx.Tx) pgx.LargeObjects {
	if !largeObjectsLayout {
		return closedTx().LargeObjects()
	}
	lo := largeObjectsFields{tx: tx}
	return *(*pgx.LargeObjects)(unsafe.Pointer(&lo))
}

// largeObjectsFields has the layout of pgx.LargeObjects (checked by
// largeObjectsLayout).
type largeObjectsFields struct{ tx pgx.Tx }

// largeObjectsLayout reports whether pgx.LargeObjects is a struct of one
// field, a pgx.Tx.
var largeObjectsLayout = func() bool {
	t := reflect.TypeFor[pgx.LargeObjects]()
	return t.Kind() == reflect.Struct && t.NumField() == 1 && t.Field(0).Type == reflect.TypeFor[pgx.Tx]() &&
		t.Size() == reflect.TypeFor[largeObjectsFields]().Size()
}()

// closedTx returns a pgx.Tx that is closed: its methods, and those of its
// LargeObjects, return pgx.ErrTxClosed.
func closedTx() pgx.Tx {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(b, pgx.ErrTxClosed).Tx()
}
