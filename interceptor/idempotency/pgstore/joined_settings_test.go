package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
)

// The settings the guarantee of joined mode rests on, each at its
// dangerous value: the store pins what it needs, for its transaction only.

// chargeJoined claims key on j, writes a charge row in the claim's
// transaction and commits it with a success record: one acknowledged
// joined call.
func chargeJoined(t *testing.T, j *pgstore.JoinedStore, table, key string) {
	t.Helper()
	ctx := context.Background()
	cl, txn, err := j.ClaimTx(ctx, rk(key), fp, time.Minute)
	if err != nil || cl.State != idempotency.Owned {
		t.Fatalf("ClaimTx(%s) = %v, %v, want Owned", key, cl.State, err)
	}
	tx, _ := pgstore.Tx(txn.Context(ctx))
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (key) VALUES ($1)", key); err != nil {
		_ = txn.Rollback(ctx)
		t.Fatal(err)
	}
	if err := txn.Commit(ctx, ok(), time.Hour); err != nil {
		t.Fatalf("Commit(%s) = %v", key, err)
	}
}

// TestJoinedAcknowledgedCommitSurvivesADatabaseCrashUnderSynchronousCommitOff
// (issue 31, finding 1): with synchronous_commit off for the database (a
// common tuning, set per database or role), a commit is acknowledged before
// its WAL reaches the disk, and a crash of PostgreSQL loses it; a joined
// call's record and writes must survive, since the caller was answered.
// The joined transaction sets it on for itself. A control, plain commits on
// the same database after the joined ones, shows the crash does lose
// acknowledged commits here. The WAL writer is stopped (SIGSTOP) so that
// nothing but a commit's own flush writes the WAL.
func TestJoinedAcknowledgedCommitSurvivesADatabaseCrashUnderSynchronousCommitOff(t *testing.T) {
	c := startCrashCluster(t)
	srv, schema, table := c.srv, c.schema, c.table
	ctx := context.Background()
	j, pool := joinedStore(t, srv.DSN, schema, nil)
	var setting string
	if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&setting); err != nil || setting != "off" {
		t.Fatalf("the store's sessions run with synchronous_commit %q, %v; want off, the setting under test", setting, err)
	}
	c.stopWALWriter(t)
	const n = 20
	for i := range n {
		chargeJoined(t, j, table, "joined-"+strconv.Itoa(i))
	}
	for i := range n { // after the last joined commit, whose flush would take them along
		if _, err := pool.Exec(ctx, "INSERT INTO "+table+" (key) VALUES ($1)", "control-"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Restart(true); err != nil { // -m immediate: the stopped WAL writer is killed with the rest
		t.Fatal(err)
	}
	after := pgtest.Pool(t, srv.DSN)
	var joined, control int
	if err := after.QueryRow(ctx, "SELECT count(*) FILTER (WHERE key LIKE 'joined-%'), count(*) FILTER (WHERE key LIKE 'control-%') FROM "+
		table).Scan(&joined, &control); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the crash: %d of %d acknowledged joined calls, %d of %d acknowledged plain commits", joined, n, control, n)
	if joined != n {
		t.Errorf("acknowledged joined calls whose writes survived the crash = %d, want %d", joined, n)
	}
	if control == n {
		t.Fatalf("the crash lost none of the %d plain commits made with synchronous_commit off: the test does not reach the danger", n)
	}
	j2, _ := joinedStore(t, srv.DSN, schema, nil)
	for i := range n {
		if cl, _, err := j2.ClaimTx(ctx, rk("joined-"+strconv.Itoa(i)), fp, time.Minute); err != nil || cl.State != idempotency.Completed {
			t.Errorf("ClaimTx(joined-%d) after the crash = %v, %v, want Completed: the record was acknowledged", i, cl.State, err)
		}
	}
}

// waitForStatement waits until a backend of admin's cluster runs a
// statement starting with prefix, and returns its pid.
func waitForStatement(t *testing.T, admin *pgxpool.Pool, prefix string) uint32 {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		var pid uint32
		err := admin.QueryRow(context.Background(), "SELECT pid FROM pg_stat_activity WHERE state = 'active' AND starts_with(query, $1)",
			prefix).Scan(&pid)
		if err == nil {
			return pid
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // polling the server's view
	}
	t.Fatalf("no backend ran %q within 10s", prefix)
	return 0
}

// heldFor claims key on j until it is owned, and returns how long that
// took, at most limit (then it gives up and returns limit).
func heldFor(t *testing.T, j *pgstore.JoinedStore, key string, limit time.Duration) time.Duration {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	for time.Since(start) < limit {
		cl, txn, err := j.ClaimTx(ctx, rk(key), fp, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if cl.State == idempotency.Owned {
			held := time.Since(start)
			_ = txn.Rollback(ctx)
			return held
		}
		time.Sleep(20 * time.Millisecond) // the key is in progress: poll, as the interceptor does
	}
	return limit
}

// TestJoinedOwnerDeadMidStatementFreesItsKeyWithinASecond (finding 2): an
// owner whose process dies while a statement of its handler runs (a slow
// query, a lock wait) held its key until that statement ended (8 s in the
// review), since PostgreSQL notices a closed connection only when it next
// reads or writes it. The joined transaction sets
// client_connection_check_interval, so the key is free within about the
// interval; set to 0 (the server's default), the key stays held as long as
// the statement runs.
func TestJoinedOwnerDeadMidStatementFreesItsKeyWithinASecond(t *testing.T) {
	const sleep = 3 * time.Second
	tests := []struct {
		name       string
		opts       []pgstore.Option
		atMost     time.Duration
		atLeastDur time.Duration
	}{
		{"Default", nil, time.Second + 500*time.Millisecond, 0},
		{"CheckOff", []pgstore.Option{pgstore.WithConnCheckInterval(0)}, 0, sleep - 500*time.Millisecond},
	}
	pool, schema := migrated(t)
	dsn := pgtest.DSN(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var faults *pgtest.Faults
			owner, _ := joinedStore(t, dsn, schema, func(c *pgxpool.Config) { faults = pgtest.InjectFaults(c) }, tt.opts...)
			dup, _ := joinedStore(t, dsn, schema, nil)
			ctx := context.Background()
			key := "dead-mid-statement-" + tt.name
			cl, txn, err := owner.ClaimTx(ctx, rk(key), fp, time.Minute)
			if err != nil || cl.State != idempotency.Owned {
				t.Fatalf("ClaimTx() = %v, %v, want Owned", cl.State, err)
			}
			tx, _ := pgstore.Tx(txn.Context(ctx))
			stmt := fmt.Sprintf("SELECT pg_sleep(%d) /* %s */", int(sleep.Seconds()), key)
			done := make(chan error, 1)
			go func() {
				_, err := tx.Exec(ctx, stmt)
				done <- err
			}()
			waitForStatement(t, pool, stmt)
			faults.Sever() // the owner's process dies
			held := heldFor(t, dup, key, 10*time.Second)
			<-done
			_ = txn.Rollback(ctx)
			t.Logf("a dead owner's key was held %v after its death, its statement running %v", held, sleep)
			if tt.atMost > 0 && held > tt.atMost {
				t.Errorf("key held %v after its owner died mid-statement, want at most %v", held, tt.atMost)
			}
			if held < tt.atLeastDur {
				t.Errorf("with the check off, the key was held %v, want the statement's %v: the test does not reach the danger",
					held, tt.atLeastDur)
			}
		})
	}
}

// TestJoinedCutOffOwnerLosesItsKeyAtTheIdleTimeout (finding 3, second
// part): an owner cut off inside its transaction (a partition, a frozen
// process: its connection stays open) holds its key until
// idle_in_transaction_session_timeout ends its session. The store sets it
// for its transaction; WithTxIdleTimeout(0) leaves the server's, here
// PostgreSQL's default, 0, which never ends it.
func TestJoinedCutOffOwnerLosesItsKeyAtTheIdleTimeout(t *testing.T) {
	tests := []struct {
		name   string
		idle   time.Duration
		freeBy time.Duration // 0: still held then
	}{
		{"Set", 300 * time.Millisecond, 3 * time.Second},
		{"ServersZero", 0, 0},
	}
	_, schema := migrated(t)
	dsn := pgtest.DSN(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			owner, _ := joinedStore(t, dsn, schema, nil, pgstore.WithTxIdleTimeout(tt.idle))
			dup, _ := joinedStore(t, dsn, schema, nil)
			ctx := context.Background()
			key := "cut-off-" + tt.name
			cl, txn, err := owner.ClaimTx(ctx, rk(key), fp, time.Minute)
			if err != nil || cl.State != idempotency.Owned {
				t.Fatalf("ClaimTx() = %v, %v, want Owned", cl.State, err)
			}
			defer func() { _ = txn.Rollback(ctx) }() // the frozen owner's end, after the test
			limit := tt.freeBy
			if limit == 0 {
				limit = 1500 * time.Millisecond
			}
			held := heldFor(t, dup, key, limit)
			t.Logf("a cut-off owner's key, idle timeout %v: held %v (gave up at %v)", tt.idle, held, limit)
			switch {
			case tt.freeBy > 0 && held >= limit:
				t.Errorf("a cut-off owner kept its key %v, past its idle timeout %v", held, tt.idle)
			case tt.freeBy == 0 && held < limit:
				t.Errorf("with the server's idle timeout (0) the key was free after %v: the test does not reach the danger", held)
			}
		})
	}
}

// TestJoinedLockTimeoutIsTheClaimStatementsOnly (finding 3): the claim's
// lock_timeout covered the whole transaction, so the handler's own UPDATE
// of a row locked elsewhere failed with 55P03 after 1 s. The claim sets it
// for its statement only and restores the session's (here 5 s, as a role's
// setting would give): the handler's UPDATE waits for the other
// transaction, as it would without the store.
func TestJoinedLockTimeoutIsTheClaimStatementsOnly(t *testing.T) {
	pool, schema := migrated(t)
	ctx := context.Background()
	accounts := pgtest.Ident(schema) + ".accounts"
	if _, err := pool.Exec(ctx, "CREATE TABLE "+accounts+" (id int PRIMARY KEY, n int NOT NULL); INSERT INTO "+accounts+" VALUES (1, 0)"); err != nil {
		t.Fatal(err)
	}
	const lockTimeout = 200 * time.Millisecond
	j, _ := joinedStore(t, pgtest.DSN(t), schema, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["lock_timeout"] = "5s" },
		pgstore.WithLockTimeout(lockTimeout))
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, "SELECT FROM "+accounts+" WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	cl, txn, err := j.ClaimTx(ctx, rk("lock-timeout"), fp, time.Minute)
	if err != nil || cl.State != idempotency.Owned {
		t.Fatalf("ClaimTx() = %v, %v, want Owned", cl.State, err)
	}
	tx, _ := pgstore.Tx(txn.Context(ctx))
	var inTx string
	if err := tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&inTx); err != nil || inTx != "5s" {
		t.Errorf("lock_timeout in the handler's transaction = %q, %v; want the session's 5s", inTx, err)
	}
	updated := make(chan error, 1)
	go func() {
		_, err := tx.Exec(ctx, "UPDATE "+accounts+" SET n = n + 1 WHERE id = 1 /* the handler's */")
		updated <- err
	}()
	waitForStatement(t, pool, "UPDATE "+accounts)
	select {
	case err := <-updated:
		t.Fatalf("the handler's UPDATE of a row locked elsewhere ended while the lock was held: %v; want it waiting", err)
	case <-time.After(3 * lockTimeout): // the claim's timeout, had it leaked, would have fired
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-updated; err != nil {
		t.Errorf("the handler's UPDATE = %v, want it done once the other transaction committed", err)
	}
	if err := txn.Commit(ctx, ok(), time.Hour); err != nil {
		t.Fatal(err)
	}
}

// TestJoinedPinsItsSettingsForItsTransactionOnly: whatever the session's
// settings (here as a database or role would set them, the dangerous ones),
// the joined transaction runs with synchronous_commit on, the store's idle
// timeout and connection check, and the session's lock_timeout; 0 options
// leave the session's; and the next user of the pooled connection finds
// the session's settings again.
func TestJoinedPinsItsSettingsForItsTransactionOnly(t *testing.T) {
	_, schema := migrated(t)
	session := map[string]string{
		"synchronous_commit":                  "off",
		"idle_in_transaction_session_timeout": "4321ms",
		"client_connection_check_interval":    "0",
		"lock_timeout":                        "7s",
	}
	names := []string{"synchronous_commit", "idle_in_transaction_session_timeout", "client_connection_check_interval", "lock_timeout"}
	tests := []struct {
		name string
		opts []pgstore.Option
		want []string // in the transaction, in the order of names
	}{
		{"Defaults", nil, []string{"on", "1min", "250ms", "7s"}},
		{"ZeroLeavesTheSessions", []pgstore.Option{pgstore.WithTxIdleTimeout(0), pgstore.WithConnCheckInterval(0)},
			[]string{"on", "4321ms", "0", "7s"}},
		{"Set", []pgstore.Option{pgstore.WithTxIdleTimeout(90 * time.Second), pgstore.WithConnCheckInterval(time.Second),
			pgstore.WithLockTimeout(300 * time.Millisecond)}, []string{"on", "90s", "1s", "7s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, pool := joinedStore(t, pgtest.DSN(t), schema, func(c *pgxpool.Config) {
				c.MaxConns = 1
				for k, v := range session {
					c.ConnConfig.RuntimeParams[k] = v
				}
			}, tt.opts...)
			ctx := context.Background()
			show := func(q interface {
				QueryRow(context.Context, string, ...any) pgx.Row
			}) []string {
				got := make([]string, len(names))
				for i, n := range names {
					if err := q.QueryRow(ctx, "SELECT current_setting($1)", n).Scan(&got[i]); err != nil {
						t.Fatal(err)
					}
				}
				return got
			}
			cl, txn, err := j.ClaimTx(ctx, rk("settings-"+tt.name), fp, time.Minute)
			if err != nil || cl.State != idempotency.Owned {
				t.Fatalf("ClaimTx() = %v, %v, want Owned", cl.State, err)
			}
			tx, _ := pgstore.Tx(txn.Context(ctx))
			got := show(tx)
			if err := txn.Commit(ctx, ok(), time.Hour); err != nil {
				t.Fatal(err)
			}
			for i, n := range names {
				if got[i] != tt.want[i] {
					t.Errorf("%s in the joined transaction = %q, want %q", n, got[i], tt.want[i])
				}
			}
			after := show(pool) // the pool's one connection, the joined transaction's
			for i, n := range names {
				if after[i] != session[n] && !(n == "lock_timeout" && after[i] == "7s") {
					t.Errorf("%s after the joined transaction = %q, want the session's %q again", n, after[i], session[n])
				}
			}
		})
	}
}
