package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
	"github.com/grpc-resilience/resilience/interceptor/server"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// Database errors read right (findings 5 and 6): a conflict a retry
// resolves is never stored; a handler that breaks its transaction's rules
// gets a clear error, its outcome is not stored as the call's, and the call
// never runs again with its key.

// bank is a schema with the store's tables, a charges table (the business
// writes, one row per execution that committed) and an accounts table of
// one row, for conflicts.
type bank struct {
	admin            *pgxpool.Pool
	schema           string
	charges, account string // quoted, schema-qualified
}

func newBank(t *testing.T) *bank {
	t.Helper()
	admin, schema := migrated(t)
	q := pgtest.Ident(schema)
	b := &bank{admin: admin, schema: schema, charges: q + ".charges", account: q + ".accounts"}
	if _, err := admin.Exec(context.Background(), "CREATE TABLE "+b.charges+" (key text NOT NULL, what text NOT NULL DEFAULT 'charge'); "+
		"CREATE TABLE "+b.account+" (id int PRIMARY KEY, n int NOT NULL); INSERT INTO "+b.account+" VALUES (1, 0), (2, 0)"); err != nil {
		t.Fatal(err)
	}
	return b
}

// charge writes the call's charge row through tx.
func (b *bank) charge(ctx context.Context, tx pgx.Tx, key, what string) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+b.charges+" (key, what) VALUES ($1, $2)", key, what)
	return err
}

func (b *bank) rows(t *testing.T, key, what string) int {
	t.Helper()
	var n int
	if err := b.admin.QueryRow(context.Background(), "SELECT count(*) FROM "+b.charges+" WHERE key = $1 AND what = $2", key, what).
		Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// wantAborted checks that err is ABORTED with a RetryInfo.
func wantAborted(t *testing.T, what string, err error) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.Aborted {
		t.Fatalf("%s = %v, want ABORTED", what, err)
	}
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.RetryInfo); ok {
			return
		}
	}
	t.Errorf("%s = %v: no RetryInfo, want the retry hint", what, err)
}

// TestJoinedConflictIsAbortedNeverStored: a serialization failure (under
// REPEATABLE READ, or SERIALIZABLE at COMMIT) or a deadlock, returned by
// the handler or swallowed by it, was stored as UNKNOWN and replayed for
// the TTL; a retry would have succeeded. It is ABORTED with the retry hint,
// nothing is stored, and the retry runs the call again: one charge.
func TestJoinedConflictIsAbortedNeverStored(t *testing.T) {
	tests := []struct {
		name     string
		iso      pgx.TxIsoLevel
		conflict func(t *testing.T, b *bank, ctx context.Context, tx pgx.Tx) error // the first run's, after its charge
		swallow  bool
	}{
		{"SerializationFailure", pgx.RepeatableRead, func(t *testing.T, b *bank, ctx context.Context, tx pgx.Tx) error {
			var n int
			if err := tx.QueryRow(ctx, "SELECT n FROM "+b.account+" WHERE id = 1").Scan(&n); err != nil { // the snapshot
				return err
			}
			if _, err := b.admin.Exec(ctx, "UPDATE "+b.account+" SET n = n + 1 WHERE id = 1"); err != nil {
				t.Fatal(err)
			}
			_, err := tx.Exec(ctx, "UPDATE "+b.account+" SET n = $1 WHERE id = 1", n+1)
			return err
		}, false},
		{"SerializationFailureSwallowed", pgx.RepeatableRead, func(t *testing.T, b *bank, ctx context.Context, tx pgx.Tx) error {
			var n int
			if err := tx.QueryRow(ctx, "SELECT n FROM "+b.account+" WHERE id = 1").Scan(&n); err != nil {
				return err
			}
			if _, err := b.admin.Exec(ctx, "UPDATE "+b.account+" SET n = n + 1 WHERE id = 1"); err != nil {
				t.Fatal(err)
			}
			_, _ = tx.Exec(ctx, "UPDATE "+b.account+" SET n = $1 WHERE id = 1", n+1)
			return nil
		}, true},
		{"SerializableAtCommit", pgx.Serializable, func(t *testing.T, b *bank, ctx context.Context, tx pgx.Tx) error {
			var n int
			if err := tx.QueryRow(ctx, "SELECT n FROM "+b.account+" WHERE id = 2").Scan(&n); err != nil {
				return err
			}
			err := pgx.BeginTxFunc(ctx, b.admin, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(o pgx.Tx) error {
				if err := o.QueryRow(ctx, "SELECT n FROM "+b.account+" WHERE id = 1").Scan(&n); err != nil {
					return err
				}
				_, err := o.Exec(ctx, "UPDATE "+b.account+" SET n = n + 1 WHERE id = 2")
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			_, err = tx.Exec(ctx, "UPDATE "+b.account+" SET n = n + 1 WHERE id = 1")
			return err
		}, false},
		{"Deadlock", "", func(t *testing.T, b *bank, ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT FROM "+b.account+" WHERE id = 1 FOR UPDATE"); err != nil {
				return err
			}
			bg := context.Background() // the other transaction outlives the handler's context
			other, err := b.admin.Begin(bg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := other.Exec(bg, "SELECT FROM "+b.account+" WHERE id = 2 FOR UPDATE"); err != nil {
				t.Fatal(err)
			}
			otherDone := make(chan error, 1)
			go func() {
				// After the handler waits for row 2, so that its own deadlock
				// check fires first and aborts it.
				waitForLockWait(t, b.admin, "SELECT FROM "+b.account+" WHERE id = 2 FOR UPDATE /* handler */")
				_, err := other.Exec(bg, "SELECT FROM "+b.account+" WHERE id = 1 FOR UPDATE")
				otherDone <- errors.Join(err, other.Commit(bg))
			}()
			_, err = tx.Exec(ctx, "SELECT FROM "+b.account+" WHERE id = 2 FOR UPDATE /* handler */")
			t.Cleanup(func() {
				if err := <-otherDone; err != nil {
					t.Errorf("the other transaction: %v", err)
				}
			})
			return err
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBank(t)
			j, _ := joinedStore(t, pgtest.DSN(t), b.schema, nil, pgstore.WithTxOptions(pgx.TxOptions{IsoLevel: tt.iso}))
			var runs atomic.Int32
			e := &echoFunc{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
				tx, _ := pgstore.Tx(ctx)
				if err := b.charge(ctx, tx, req.Message, "charge"); err != nil {
					return nil, err
				}
				if runs.Add(1) == 1 {
					if err := tt.conflict(t, b, ctx, tx); err != nil {
						return nil, err // UNKNOWN, as a handler that returns the database's error
					}
				}
				return &echov1.EchoResponse{Message: "charged"}, nil
			}}
			c := serve(t, e, server.Idempotency{Store: j})
			key := "conflict-" + tt.name
			_, err := call(t, c, key, key)
			wantAborted(t, "the call whose transaction met a conflict", err)
			if n := b.rows(t, key, "charge"); n != 0 {
				t.Errorf("charges after the conflict = %d, want 0", n)
			}
			if _, err := call(t, c, key, key); err != nil {
				t.Fatalf("retry = %v, want it run again and answered", err)
			}
			if got := e.calls.Load(); got != 2 {
				t.Errorf("handler ran %d times, want 2 (the conflict, the retry)", got)
			}
			if n := b.rows(t, key, "charge"); n != 1 {
				t.Errorf("charges = %d, want 1", n)
			}
		})
	}
}

// waitForLockWait waits until a backend waits on a lock in a statement
// starting with prefix.
func waitForLockWait(t *testing.T, admin *pgxpool.Pool, prefix string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		var n int
		if err := admin.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "+
			"AND starts_with(query, $1)", prefix).Scan(&n); err != nil {
			t.Error(err)
			return
		}
		if n > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond) // polling the server's view
	}
	t.Errorf("no backend waited on a lock in %q within 10s", prefix)
}

// TestJoinedHandlerThatBreaksItsTransactionNeverRunsAgain: a handler that
// ends its joined transaction itself (COMMIT, COMMIT AND CHAIN, ROLLBACK
// sent through Tx), answers success over a transaction a failed statement
// aborted (25P02 on every statement after), or answers tx.Commit's error
// (the habit `return tx.Commit(ctx)`), gets INTERNAL naming what it did;
// that verdict, not its outcome, is stored for the key, so that no retry
// runs it again, even past every lease (4 retries, 4 charges before). What
// it sent after ending the transaction is refused (ErrTxEnded) or rolled
// back, never committed.
func TestJoinedHandlerThatBreaksItsTransactionNeverRunsAgain(t *testing.T) {
	tests := []struct {
		name    string
		then    func(ctx context.Context, b *bank, tx pgx.Tx, key string) (string, error) // after the charge
		msg     string                                                                    // in the INTERNAL error
		charges int                                                                       // committed, at the end
	}{
		{"CommitAndChain", func(ctx context.Context, b *bank, tx pgx.Tx, key string) (string, error) {
			if _, err := tx.Exec(ctx, "COMMIT AND CHAIN"); err != nil {
				return "", err
			}
			return "ok", b.charge(ctx, tx, key, "after")
		}, "ended its joined transaction itself", 1},
		{"Commit", func(ctx context.Context, b *bank, tx pgx.Tx, key string) (string, error) {
			if _, err := tx.Exec(ctx, "COMMIT"); err != nil {
				return "", err
			}
			if err := b.charge(ctx, tx, key, "after"); !errors.Is(err, pgstore.ErrTxEnded) {
				return "", status.Errorf(codes.FailedPrecondition, "a statement after COMMIT = %v, want ErrTxEnded", err)
			}
			return "ok", nil
		}, "ended its joined transaction itself", 1},
		{"CommitThenUnstoredCode", func(ctx context.Context, b *bank, tx pgx.Tx, key string) (string, error) {
			if _, err := tx.Exec(ctx, "COMMIT"); err != nil {
				return "", err
			}
			return "", status.Error(codes.Unavailable, "downstream down") // the interceptor rolls back: Txn.Rollback
		}, "ended its joined transaction itself", 1},
		{"Rollback", func(ctx context.Context, b *bank, tx pgx.Tx, key string) (string, error) {
			if _, err := tx.Exec(ctx, "ROLLBACK"); err != nil {
				return "", err
			}
			_ = b.charge(ctx, tx, key, "after") // refused
			return "ok", nil
		}, "ended its joined transaction itself", 0},
		{"SuccessOverAnAbortedTransaction", func(ctx context.Context, b *bank, tx pgx.Tx, key string) (string, error) {
			_, _ = tx.Exec(ctx, "SELECT 1/0") // swallowed
			_ = b.charge(ctx, tx, key, "after")
			return "ok", nil
		}, "division by zero", 0},
		{"ReturnTxCommit", func(ctx context.Context, _ *bank, tx pgx.Tx, _ string) (string, error) {
			return "ok", tx.Commit(ctx)
		}, "Commit on its joined transaction", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBank(t)
			j, _ := joinedStore(t, pgtest.DSN(t), b.schema, nil)
			e := &echoFunc{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
				tx, _ := pgstore.Tx(ctx)
				if err := b.charge(ctx, tx, req.Message, "charge"); err != nil {
					return nil, err
				}
				msg, err := tt.then(ctx, b, tx, req.Message)
				if err != nil {
					return nil, err
				}
				return &echov1.EchoResponse{Message: msg}, nil
			}}
			c := serve(t, e, server.Idempotency{Store: j, Lease: time.Second})
			key := "broken-" + tt.name
			_, first := call(t, c, key, key)
			if tt.name != "CommitThenUnstoredCode" {
				if status.Code(first) != codes.Internal || !strings.Contains(status.Convert(first).Message(), tt.msg) {
					t.Errorf("first call = %v, want INTERNAL naming %q", first, tt.msg)
				}
			}
			for i := range 4 {
				advance(t, b.admin, b.schema, time.Hour) // past every lease
				_, err := call(t, c, key, key)
				if status.Code(err) != codes.Internal || !strings.Contains(status.Convert(err).Message(), "not run again") {
					t.Errorf("retry %d = %v, want the stored INTERNAL verdict", i+1, err)
				}
			}
			if got := e.calls.Load(); got != 1 {
				t.Errorf("handler ran %d times, want 1", got)
			}
			if n := b.rows(t, key, "charge"); n != tt.charges {
				t.Errorf("charges = %d, want %d", n, tt.charges)
			}
			if n := b.rows(t, key, "after"); n != 0 {
				t.Errorf("rows written after the transaction ended = %d, want 0", n)
			}
		})
	}
}

// TestJoinedDeferredRollbackIdiomChangesNothing: `defer tx.Rollback(ctx)`,
// pgx's idiom, must not undo nor poison a call that succeeds: Rollback
// does nothing but return ErrHandlerCommit.
func TestJoinedDeferredRollbackIdiomChangesNothing(t *testing.T) {
	b := newBank(t)
	j, _ := joinedStore(t, pgtest.DSN(t), b.schema, nil)
	e := &echoFunc{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		tx, _ := pgstore.Tx(ctx)
		defer func() { _ = tx.Rollback(ctx) }()
		if err := b.charge(ctx, tx, req.Message, "charge"); err != nil {
			return nil, err
		}
		return &echov1.EchoResponse{Message: "ok"}, nil
	}}
	c := serve(t, e, server.Idempotency{Store: j})
	for range 2 {
		if _, err := call(t, c, "idiom", "idiom"); err != nil {
			t.Fatal(err)
		}
	}
	if got, n := e.calls.Load(), b.rows(t, "idiom", "charge"); got != 1 || n != 1 {
		t.Errorf("handler ran %d times, %d charges; want 1 and 1", got, n)
	}
}

// TestJoinedTxHandsOutNothingThatOutlivesTheCall: a *pgx.Conn the handler
// kept (Tx's Conn, its rows' Conn) wrote into the next call's transaction
// on the pooled connection; so did large objects, which bypassed the gate.
// Conn is nil; large objects work in the call and fail once it has ended,
// never touching the connection's next transaction.
func TestJoinedTxHandsOutNothingThatOutlivesTheCall(t *testing.T) {
	b := newBank(t)
	j, _ := joinedStore(t, pgtest.DSN(t), b.schema, func(c *pgxpool.Config) { c.MaxConns = 1 })
	type kept struct {
		lo  pgx.LargeObjects
		obj *pgx.LargeObject
	}
	keep := make(chan kept, 1)
	// Large objects belong to the database, not to the test's schema: the
	// count is taken against those that exist before (a run before this one
	// under -count, another test's).
	largeObjects := func() int {
		t.Helper()
		var n int
		if err := b.admin.QueryRow(context.Background(), "SELECT count(*) FROM pg_largeobject_metadata").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := largeObjects()
	e := &echoFunc{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		tx, _ := pgstore.Tx(ctx)
		if req.Message != "first" {
			return &echov1.EchoResponse{Message: "ok"}, nil
		}
		if tx.Conn() != nil {
			return nil, status.Error(codes.Internal, "Tx(ctx).Conn() is not nil")
		}
		rows, err := tx.Query(ctx, "SELECT 1")
		if err != nil {
			return nil, err
		}
		conn := rows.Conn()
		rows.Close()
		if conn != nil {
			return nil, status.Error(codes.Internal, "rows.Conn() is not nil")
		}
		b := &pgx.Batch{}
		b.Queue("SELECT 1")
		br := tx.SendBatch(ctx, b)
		brows, err := br.Query()
		if err != nil {
			return nil, err
		}
		conn = brows.Conn()
		brows.Close()
		if err := br.Close(); err != nil {
			return nil, err
		}
		if conn != nil {
			return nil, status.Error(codes.Internal, "a batch's rows.Conn() is not nil")
		}
		lo := tx.LargeObjects()
		oid, err := lo.Create(ctx, 0)
		if err != nil {
			return nil, err
		}
		obj, err := lo.Open(ctx, oid, pgx.LargeObjectModeRead|pgx.LargeObjectModeWrite)
		if err != nil {
			return nil, err
		}
		if _, err := obj.Write([]byte("in the call")); err != nil {
			return nil, err
		}
		keep <- kept{lo, obj}
		return &echov1.EchoResponse{Message: "ok"}, nil
	}}
	c := serve(t, e, server.Idempotency{Store: j})
	if _, err := call(t, c, "first", "first"); err != nil {
		t.Fatal(err)
	}
	k := <-keep
	ctx := context.Background()
	if _, err := k.lo.Create(ctx, 0); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("a kept LargeObjects' Create after the call = %v, want pgx.ErrTxClosed", err)
	}
	if _, err := k.obj.Write([]byte("after")); err == nil {
		t.Errorf("a kept large object's Write after the call succeeded, want an error")
	}
	if _, err := call(t, c, "second", "second"); err != nil { // the pool's one connection, the next call's transaction
		t.Fatal(err)
	}
	if n := largeObjects() - before; n != 1 {
		t.Errorf("large objects made = %d, want the one the call committed", n)
	}
	if !pgstore.LargeObjectsLayout {
		t.Errorf("pgx.LargeObjects is no longer a struct of one pgx.Tx: large objects are refused in joined mode")
	}
}
