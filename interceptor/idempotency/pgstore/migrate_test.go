package pgstore_test

import (
	"context"
	_ "embed"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/outbox"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// schemaV1 is the migration of version 1, as the previous release applied
// it (__SCHEMA__ for the quoted schema).
//
//go:embed testdata/schema_v1.sql
var schemaV1 string

// TestMigrateOfACurrentSchemaTakesNoLock (finding 4): Migrate runs at every
// start; its CREATE INDEX IF NOT EXISTS took a SHARE lock even when the
// index existed, which waited for every open joined transaction while every
// new claim waited behind it (2.7 s in the review, and an unrelated key
// ABORTED as "in progress"). On a schema at its version, Migrate reads the
// version and changes nothing: it returns at once while a joined
// transaction stays open, and a claim of another key made meanwhile is
// owned.
func TestMigrateOfACurrentSchemaTakesNoLock(t *testing.T) {
	pool, schema := migrated(t)
	j, _ := joinedStore(t, pgtest.DSN(t), schema, nil)
	ctx := context.Background()
	cl, open, err := j.ClaimTx(ctx, rk("slow"), fp, time.Minute) // a slow call's transaction, open throughout
	if err != nil || cl.State != idempotency.Owned {
		t.Fatalf("ClaimTx() = %v, %v, want Owned", cl.State, err)
	}
	defer func() { _ = open.Rollback(ctx) }()
	for range 3 {
		mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		err := pgstore.Migrate(mctx, pool, schema)
		cancel()
		if err != nil {
			t.Fatalf("Migrate() of a current schema with a joined transaction open = %v, want nil at once", err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("Migrate() took %v with a joined transaction open; it should only read", took)
		}
		cl, other, err := j.ClaimTx(ctx, rk("unrelated"), fp, time.Minute)
		if err != nil || cl.State != idempotency.Owned {
			t.Fatalf("ClaimTx(unrelated key) after Migrate = %v, %v, want Owned", cl.State, err)
		}
		_ = other.Rollback(ctx)
	}
	var waits int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").Scan(&waits); err != nil {
		t.Fatal(err)
	}
	if waits > 0 {
		t.Errorf("%d backends wait on a lock after Migrate returned", waits)
	}
}

// applyV1 creates version 1 of the schema in schema, as the previous
// release's Migrate did.
func applyV1(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), strings.ReplaceAll(schemaV1, "__SCHEMA__", pgtest.Ident(schema))); err != nil {
		t.Fatalf("applying version 1: %v", err)
	}
}

// TestMigrateUpgradesVersion1KeepingItsRecords: a schema of the previous
// release is upgraded in place: its completed records still replay, its
// functions stay for replicas of the previous version that still run, and
// joined mode works.
func TestMigrateUpgradesVersion1KeepingItsRecords(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.DSN(t))
	schema := pgtest.Schema(t, pool)
	applyV1(t, pool, schema)
	ctx := context.Background()
	if err := pgstore.Check(ctx, pool, schema); !errors.Is(err, pgstore.ErrNotMigrated) || !strings.Contains(err.Error(), "version 1") {
		t.Fatalf("Check() of version 1 = %v, want ErrNotMigrated naming version 1", err)
	}
	old, err := pgstore.New(pool, pgstore.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	c, err := old.Claim(ctx, rk("before"), fp, time.Minute) // lease mode's functions are version 1's
	if err != nil || c.State != idempotency.Owned {
		t.Fatalf("Claim() on version 1 = %v, %v", c.State, err)
	}
	if err := old.Complete(ctx, rk("before"), c.Token, ok(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := pgstore.Migrate(ctx, pool, schema); err != nil {
		t.Fatalf("Migrate() from version 1 = %v", err)
	}
	if err := pgstore.Check(ctx, pool, schema); err != nil {
		t.Fatalf("Check() after the upgrade = %v", err)
	}
	var v1Funcs int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "+
		"WHERE n.nspname = $1 AND p.proname IN ('resilience_idem_claim_tx', 'resilience_idem_complete_tx', 'resilience_idem_phase', "+
		"'resilience_idem_relock')", schema).Scan(&v1Funcs); err != nil || v1Funcs != 4 {
		t.Errorf("version 1's joined functions after the upgrade = %d, %v; want the 4, for replicas still running it", v1Funcs, err)
	}
	j, _ := joinedStore(t, pgtest.DSN(t), schema, nil)
	if cl, _, err := j.ClaimTx(ctx, rk("before"), fp, time.Minute); err != nil || cl.State != idempotency.Completed {
		t.Errorf("ClaimTx() of a record of version 1 = %v, %v, want Completed", cl.State, err)
	}
	cl, txn, err := j.ClaimTx(ctx, rk("after"), fp, time.Minute)
	if err != nil || cl.State != idempotency.Owned {
		t.Fatalf("ClaimTx() after the upgrade = %v, %v, want Owned", cl.State, err)
	}
	if err := txn.Commit(ctx, ok(), time.Hour); err != nil {
		t.Fatal(err)
	}
}

// TestMigrateUpgradeGivesUpItsLockRatherThanStallClaims: an upgrade that
// changes the table needs a short ACCESS EXCLUSIVE lock, which waits for
// the transactions open on the table, while every claim queues behind it.
// It waits a second at most, gives the lock up, and tries again later:
// claims are held up a second at most, and the upgrade goes through once
// the long transaction has ended.
func TestMigrateUpgradeGivesUpItsLockRatherThanStallClaims(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.DSN(t))
	schema := pgtest.Schema(t, pool)
	applyV1(t, pool, schema)
	ctx := context.Background()
	long, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Rollback(ctx) }()
	if _, err := long.Exec(ctx, "SELECT FROM "+pgtest.Ident(schema)+".resilience_idempotency"); err != nil { // ACCESS SHARE, held
		t.Fatal(err)
	}
	migrated := make(chan error, 1)
	go func() { migrated <- pgstore.Migrate(ctx, pool, schema) }()
	waitForLockWait(t, pool, "-- The schema of package pgstore") // the upgrade's ALTER TABLE waits for the lock
	// A reader queued behind the waiting upgrade gets through within about
	// the upgrade's lock timeout (1 s), not when the long transaction ends.
	start := time.Now()
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgtest.Ident(schema)+".resilience_idempotency").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited > 3*time.Second {
		t.Errorf("a read of the table waited %v behind the upgrade; want about its 1 s lock timeout at most", waited)
	}
	select {
	case err := <-migrated:
		t.Fatalf("Migrate() returned %v while a transaction held the table; want it to try again", err)
	default:
	}
	if err := long.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-migrated; err != nil {
		t.Fatalf("Migrate() once the long transaction ended = %v", err)
	}
	if err := pgstore.Check(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
}

// hostileSchemas are schema names that broke the migration when they were
// spliced into it: a quote, dollar quotes, a double quote, a backslash, the
// migration's own body tag, a statement.
var hostileSchemas = []string{
	`o'brien`, `a$$b`, `$$`, `we"ird`, `back\slash`, `$resilience$`, `x'; DROP TABLE y; --`, `Ünïcödé schema`,
}

// TestHostileSchemaNamesAreQuotedEverywhere (finding 7): the schema's name
// is quoted as an identifier and as a string literal wherever the store
// uses it, the migration's function bodies included: Migrate, Check, both
// modes, phases, the reaper, the completer's listing and the outbox work in
// a schema with any name PostgreSQL accepts.
func TestHostileSchemaNamesAreQuotedEverywhere(t *testing.T) {
	admin := pgtest.Pool(t, pgtest.DSN(t))
	ctx := context.Background()
	for _, name := range hostileSchemas {
		t.Run(name, func(t *testing.T) {
			q := pgtest.Ident(name)
			if _, err := admin.Exec(ctx, "CREATE SCHEMA "+q); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA "+q+" CASCADE") })
			if err := pgstore.Migrate(ctx, admin, name); err != nil {
				t.Fatalf("Migrate(%q) = %v", name, err)
			}
			if err := pgstore.Migrate(ctx, admin, name); err != nil {
				t.Fatalf("Migrate(%q) again = %v", name, err)
			}
			s, err := pgstore.Open(ctx, admin, pgstore.WithSchema(name), pgstore.WithReaper(0, 0))
			if err != nil {
				t.Fatalf("Open(WithSchema(%q)) = %v", name, err)
			}
			defer s.Close()
			c, err := s.Claim(ctx, rk("lease"), fp, time.Minute)
			if err != nil || c.State != idempotency.Owned {
				t.Fatalf("Claim() = %v, %v", c.State, err)
			}
			if err := s.Complete(ctx, rk("lease"), c.Token, ok(), time.Hour); err != nil {
				t.Fatal(err)
			}
			j := s.Joined()
			cl, txn, err := j.ClaimTx(ctx, rk("joined"), fp, time.Minute)
			if err != nil || cl.State != idempotency.Owned {
				t.Fatalf("ClaimTx() = %v, %v", cl.State, err)
			}
			hctx := txn.Context(ctx)
			if _, err := pgstore.Phase(hctx, "one", func(context.Context, pgx.Tx) ([]byte, error) { return []byte("r"), nil }); err != nil {
				t.Fatalf("Phase() = %v", err)
			}
			tx, _ := pgstore.Tx(hctx)
			ob, err := outbox.New(name)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ob.Enqueue(hctx, tx, "/resilience.echo.v1.EchoService/Echo", &echov1.EchoRequest{Message: "m"}); err != nil {
				t.Fatalf("Enqueue() = %v", err)
			}
			if err := txn.Commit(ctx, ok(), time.Hour); err != nil {
				t.Fatalf("Commit() = %v", err)
			}
			if cl, _, err := j.ClaimTx(ctx, rk("joined"), fp, time.Minute); err != nil || cl.State != idempotency.Completed {
				t.Fatalf("ClaimTx() again = %v, %v, want Completed", cl.State, err)
			}
			if _, err := s.Reap(ctx); err != nil {
				t.Fatalf("Reap() = %v", err)
			}
			comp, err := pgstore.NewCompleter(j, func(context.Context, pgstore.Abandoned) (proto.Message, error) {
				return nil, pgstore.ErrLeave
			}, pgstore.CompleterConfig{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := comp.Once(ctx); err != nil {
				t.Fatalf("Completer.Once() = %v", err)
			}
			if !strings.Contains(pgstore.SQL(name), pgtest.Ident(name)) {
				t.Errorf("SQL(%q) lacks the quoted name %s", name, pgtest.Ident(name))
			}
		})
	}
}
