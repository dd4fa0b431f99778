package pgstore_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
	"github.com/grpc-resilience/resilience/interceptor/server"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// Adversarial review of issue 31: handlers that do what the documentation
// forbids, or does not mention, and settings at their worst.

// TestJoinedCommitIsDurableWhateverTheHandlerSetsInItsTransaction: the
// claim pins synchronous_commit on, but a statement of the handler comes
// after it in the same transaction: SET LOCAL synchronous_commit = off (a
// library's "fast audit insert"), a plain SET of it (which overrides a SET
// LOCAL for the rest of the transaction), or RESET ALL (which goes back to
// the database's setting, here off). The call's record and writes are
// acknowledged; a crash of PostgreSQL must not lose them. Before the fix,
// all 15 acknowledged calls were lost: the store's pin was undone by the
// handler, and nothing pinned it again before COMMIT.
func TestJoinedCommitIsDurableWhateverTheHandlerSetsInItsTransaction(t *testing.T) {
	c := startCrashCluster(t)
	srv, schema, table := c.srv, c.schema, c.table
	ctx := context.Background()
	j, pool := joinedStore(t, srv.DSN, schema, nil)
	c.stopWALWriter(t)
	handlers := []string{
		"SET LOCAL synchronous_commit = off",
		"SET synchronous_commit = off",
		"RESET ALL",
	}
	const n = 5
	for h, stmt := range handlers {
		for i := range n {
			key := "joined-" + strconv.Itoa(h) + "-" + strconv.Itoa(i)
			cl, txn, err := j.ClaimTx(ctx, rk(key), fp, time.Minute)
			if err != nil || cl.State != idempotency.Owned {
				t.Fatalf("ClaimTx(%s) = %v, %v, want Owned", key, cl.State, err)
			}
			tx, _ := pgstore.Tx(txn.Context(ctx))
			if _, err := tx.Exec(ctx, stmt); err != nil {
				t.Fatalf("the handler's %q: %v", stmt, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (key) VALUES ($1)", key); err != nil {
				t.Fatal(err)
			}
			if err := txn.Commit(ctx, ok(), time.Hour); err != nil {
				t.Fatalf("Commit(%s) = %v", key, err)
			}
		}
	}
	for i := range n { // plain commits after the joined ones: the control
		if _, err := pool.Exec(ctx, "INSERT INTO "+table+" (key) VALUES ($1)", "control-"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Restart(true); err != nil {
		t.Fatal(err)
	}
	after := pgtest.Pool(t, srv.DSN)
	for h, stmt := range handlers {
		var got int
		if err := after.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE key LIKE $1", "joined-"+strconv.Itoa(h)+"-%").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != n {
			t.Errorf("handler that ran %q: %d of %d acknowledged calls survived the crash, want all", stmt, got, n)
		}
	}
	var control int
	if err := after.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE key LIKE 'control-%'").Scan(&control); err != nil {
		t.Fatal(err)
	}
	if control == n {
		t.Fatalf("the crash lost none of the %d plain commits made with synchronous_commit off: the test does not reach the danger", n)
	}
}

// TestLeaseCompleteIsDurableUnderSynchronousCommitOff: lease mode's
// Complete is acknowledged to the interceptor, which then answers the
// caller; with synchronous_commit off for the database, a crash of
// PostgreSQL lost the record, and the next duplicate ran the handler
// again. Before the fix, 0 of 10 acknowledged records survived the crash.
func TestLeaseCompleteIsDurableUnderSynchronousCommitOff(t *testing.T) {
	c := startCrashCluster(t)
	srv, schema := c.srv, c.schema
	ctx := context.Background()
	j, _ := joinedStore(t, srv.DSN, schema, nil)
	s := j.Store
	c.stopWALWriter(t)
	const n = 10
	for i := range n {
		key := rk("lease-" + strconv.Itoa(i))
		cl, err := s.Claim(ctx, key, fp, time.Minute)
		if err != nil || cl.State != idempotency.Owned {
			t.Fatalf("Claim() = %v, %v, want Owned", cl.State, err)
		}
		if err := s.Complete(ctx, key, cl.Token, ok(), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Restart(true); err != nil {
		t.Fatal(err)
	}
	j2, _ := joinedStore(t, srv.DSN, schema, nil)
	completed := 0
	for i := range n {
		cl, err := j2.Store.Claim(ctx, rk("lease-"+strconv.Itoa(i)), fp, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if cl.State == idempotency.Completed {
			completed++
		}
	}
	if completed != n {
		t.Errorf("acknowledged lease-mode records that survived the crash = %d of %d, want all: the others run again", completed, n)
	}
}

// TestJoinedTimeoutIsNeverStored: under a session's lock_timeout or
// statement_timeout (a role's default, a common guard), the handler's own
// statement fails with 55P03 (a row held by another transaction) or 57014,
// and the handler returns the database's error, as handlers do: UNKNOWN.
// Before the fix, that UNKNOWN was stored with the key and replayed for the
// TTL, though a retry, once the other transaction had ended, would have
// succeeded (as for a serialization failure, which is never stored). The
// call is ABORTED with the retry hint, nothing is stored, and the retry
// runs: one charge.
func TestJoinedTimeoutIsNeverStored(t *testing.T) {
	tests := []struct {
		name    string
		session map[string]string
		stmt    func(b *bank) string
	}{
		{"LockTimeout", map[string]string{"lock_timeout": "100ms"},
			func(b *bank) string { return "UPDATE " + b.account + " SET n = n + 1 WHERE id = 1" }},
		{"StatementTimeout", map[string]string{"statement_timeout": "100ms"},
			func(b *bank) string { return "UPDATE " + b.account + " SET n = n + 1 WHERE id = 1" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBank(t)
			j, _ := joinedStore(t, pgtest.DSN(t), b.schema, func(c *pgxpool.Config) {
				for k, v := range tt.session {
					c.ConnConfig.RuntimeParams[k] = v
				}
			})
			ctx := context.Background()
			holder, err := b.admin.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = holder.Rollback(ctx) }()
			if _, err := holder.Exec(ctx, "SELECT FROM "+b.account+" WHERE id = 1 FOR UPDATE"); err != nil {
				t.Fatal(err)
			}
			e := &echoFunc{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
				tx, _ := pgstore.Tx(ctx)
				if err := b.charge(ctx, tx, req.Message, "charge"); err != nil {
					return nil, err
				}
				if _, err := tx.Exec(ctx, tt.stmt(b)); err != nil {
					return nil, err // UNKNOWN, the database's error
				}
				return &echov1.EchoResponse{Message: "charged"}, nil
			}}
			c := serve(t, e, server.Idempotency{Store: j})
			key := "timeout-" + tt.name
			_, err = call(t, c, key, key)
			wantAborted(t, "the call whose statement timed out", err)
			if err := holder.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := call(t, c, key, key); err != nil {
				t.Fatalf("retry once the row is free = %v, want it run again and answered", err)
			}
			if got := e.calls.Load(); got != 2 {
				t.Errorf("handler ran %d times, want 2 (the timeout, the retry)", got)
			}
			if n := b.rows(t, key, "charge"); n != 1 {
				t.Errorf("charges = %d, want 1", n)
			}
		})
	}
}

// TestJoinedTxRunsOneStatementAtATime: two goroutines of a handler that use
// its transaction at once (a fan-out of inserts) raced on the store's pgx
// connection (the race detector reports it in pgconn), and every other call
// failed at its commit, UNAVAILABLE with "failed to deallocate cached
// statement(s): conn busy", the connection left unable to commit. A
// statement sent while another is under way fails with ErrTxBusy and sends
// nothing; every call is answered, and commits exactly the statements that
// succeeded.
func TestJoinedTxRunsOneStatementAtATime(t *testing.T) {
	b := newBank(t)
	j, _ := joinedStore(t, pgtest.DSN(t), b.schema, nil)
	var (
		mu       sync.Mutex
		inserted = map[string]int{} // statements that succeeded, by key
		busy     int
	)
	e := &echoFunc{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		tx, _ := pgstore.Tx(ctx)
		// The same goroutine, rows open: the next statement is refused.
		rows, err := tx.Query(ctx, "SELECT generate_series(1, 3)")
		if err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); !errors.Is(err, pgstore.ErrTxBusy) {
			t.Errorf("a statement while rows are open = %v, want ErrTxBusy", err)
		}
		rows.Close()
		var wg sync.WaitGroup
		for g := range 2 {
			wg.Go(func() {
				for i := range 30 {
					_, err := tx.Exec(ctx, "INSERT INTO "+b.charges+" (key, what) VALUES ($1, $2)", req.Message, strconv.Itoa(g*100+i))
					mu.Lock()
					switch {
					case err == nil:
						inserted[req.Message]++
					case errors.Is(err, pgstore.ErrTxBusy):
						busy++
					default:
						t.Errorf("a statement of one of two goroutines at once = %v, want nil or ErrTxBusy", err)
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return &echov1.EchoResponse{Message: "ok"}, nil
	}}
	c := serve(t, e, server.Idempotency{Store: j})
	for k := range 6 {
		key := "one-at-a-time-" + strconv.Itoa(k)
		if _, err := call(t, c, key, key); err != nil {
			t.Errorf("call %d = %v, want it answered", k, err)
			continue
		}
		mu.Lock()
		want := inserted[key]
		mu.Unlock()
		var got int
		if err := b.admin.QueryRow(context.Background(), "SELECT count(*) FROM "+b.charges+" WHERE key = $1", key).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("call %d: %d rows committed, want the %d statements that succeeded", k, got, want)
		}
	}
	t.Logf("statements refused with ErrTxBusy: %d", busy)
}
