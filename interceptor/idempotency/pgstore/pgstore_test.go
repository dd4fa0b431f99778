package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/storetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const testMaxRecord = 4096

// migrated returns a pool on the shared cluster and a fresh schema of the
// test's own with the store's tables in it.
func migrated(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	pool := pgtest.Pool(t, pgtest.DSN(t))
	schema := pgtest.Schema(t, pool)
	if err := pgstore.Migrate(context.Background(), pool, schema); err != nil {
		t.Fatalf("Migrate() error = %v", err)
	}
	return pool, schema
}

// advance makes the rows of schema behave as if d had passed: their
// leases, retentions and ends come d sooner. PostgreSQL's clock cannot be
// faked; this moves the rows instead.
func advance(t testing.TB, pool *pgxpool.Pool, schema string, d time.Duration) {
	t.Helper()
	q := "UPDATE " + pgtest.Ident(schema) + ".resilience_idempotency SET lease_until = lease_until - $1::interval, " +
		"retain_until = retain_until - $1::interval, expires_at = expires_at - $1::interval"
	if _, err := pool.Exec(context.Background(), q, d); err != nil {
		t.Fatalf("advance(%v): %v", d, err)
	}
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		pool, schema := migrated(t)
		// The store under test reaches PostgreSQL through a proxy that can
		// stop forwarding (a partition, a server that hangs): its calls
		// must still end with their contexts (Harness.Stall). Advance and
		// the quota store go straight to the server.
		cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
		if err != nil {
			t.Fatal(err)
		}
		proxy := redistest.StartProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
		host, port, err := net.SplitHostPort(proxy.Addr)
		if err != nil {
			t.Fatal(err)
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
		s, err := pgstore.New(pgtest.PoolConfig(t, cfg), pgstore.WithSchema(schema), pgstore.WithMaxRecordBytes(testMaxRecord))
		if err != nil {
			t.Fatalf("New() error = %v", err)
		}
		q, err := pgstore.New(pool, pgstore.WithSchema(schema), pgstore.WithScopeQuota(4, 0), pgstore.WithScopePartitions(1))
		if err != nil {
			t.Fatalf("New() error = %v", err)
		}
		return storetest.Harness{
			Store:          s,
			QuotaStore:     q,
			QuotaEntries:   4,
			MaxRecordBytes: testMaxRecord,
			Advance:        func(t testing.TB, d time.Duration) { advance(t, pool, schema, d) },
			Stall: func(testing.TB) func() {
				proxy.Stall()
				return proxy.Resume
			},
		}
	})
}

// TestLeaseQuotaEvictsRecordsPastTheirMinimumRetention: in lease mode, a
// scope at its quota of completed records is refused while they are within
// their minimum retention (a FullError whose RetryAfter is when the oldest
// passes it), and, once they are past it, a claim evicts the scope's
// oldest record and goes through; another scope is never touched.
func TestLeaseQuotaEvictsRecordsPastTheirMinimumRetention(t *testing.T) {
	pool, schema := migrated(t)
	s, err := pgstore.New(pool, pgstore.WithSchema(schema), pgstore.WithScopeQuota(3, 0), pgstore.WithScopePartitions(1),
		pgstore.WithMinRetention(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fp := []byte("fingerprint")
	in := func(scope string, i int) idempotency.RecordKey {
		return idempotency.RecordKey{Scope: scope, FullMethod: "/shop.v1.Shop/Order", Key: fmt.Sprint("q-", i)}
	}
	rec := &idempotency.Record{Fingerprint: fp, ReplyType: "shop.v1.OrderReply", Reply: []byte("done")}
	complete := func(k idempotency.RecordKey) error {
		c, err := s.Claim(ctx, k, fp, time.Minute)
		if err != nil {
			return err
		}
		if c.State != idempotency.Owned {
			return fmt.Errorf("Claim(%v) = %v, want Owned", k.Key, c.State)
		}
		return s.Complete(ctx, k, c.Token, rec, time.Hour)
	}
	if err := complete(in("b", 0)); err != nil { // another scope's record, older than scope a's
		t.Fatal(err)
	}
	for i := range 3 {
		if err := complete(in("a", i)); err != nil {
			t.Fatal(err)
		}
	}
	_, err = s.Claim(ctx, in("a", 3), fp, time.Minute)
	full, isFull := errors.AsType[*idempotency.FullError](err)
	if !isFull || !full.Scope || full.RetryAfter <= 0 || full.RetryAfter > time.Minute {
		t.Fatalf("Claim past the quota, records within their minimum retention = %v, want a scope FullError "+
			"with a RetryAfter within the minute", err)
	}
	advance(t, pool, schema, time.Minute) // every record passes its minimum retention
	if err := complete(in("a", 3)); err != nil {
		t.Fatalf("Claim once the records may be evicted = %v, want it to go through", err)
	}
	// a-0 last: its claim takes a new entry, for which the scope evicts again.
	for _, k := range []idempotency.RecordKey{in("b", 0), in("a", 1), in("a", 2), in("a", 0)} {
		c, err := s.Claim(ctx, k, fp, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		want := idempotency.Completed
		if k == in("a", 0) {
			want = idempotency.Owned // evicted: the scope's oldest
		}
		if c.State != want {
			t.Errorf("Claim(%s/%s) = %v, want %v", k.Scope, k.Key, c.State, want)
		}
		if c.State == idempotency.Owned {
			_ = s.Release(ctx, k, c.Token)
		}
	}
}

// TestLeaseReplayTakesNoRowLock: a lease-mode Claim that finds a completed
// record (a replay, or a mismatch) reads it without a row lock. A lock
// (SELECT ... FOR UPDATE) gives the statement a transaction id, and its
// commit a WAL flush: a disk write per replay (3.4 ms against joined
// mode's 0.24 ms in bench, fsync on). The locker's id would be left in the
// row's xmax.
func TestLeaseReplayTakesNoRowLock(t *testing.T) {
	pool, schema := migrated(t)
	s, err := pgstore.New(pool, pgstore.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fp := []byte("fingerprint")
	k := idempotency.RecordKey{Scope: "tenant", FullMethod: "/shop.v1.Shop/Order", Key: "replayed"}
	c, err := s.Claim(ctx, k, fp, time.Minute)
	if err != nil || c.State != idempotency.Owned {
		t.Fatalf("Claim() = %v, %v", c.State, err)
	}
	rec := &idempotency.Record{Fingerprint: fp, ReplyType: "shop.v1.OrderReply", Reply: []byte("done")}
	if err := s.Complete(ctx, k, c.Token, rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	xmax := func() string {
		var x string
		q := "SELECT xmax::text FROM " + pgtest.Ident(schema) + ".resilience_idempotency WHERE key = $1"
		if err := pool.QueryRow(ctx, q, k.Key).Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	before := xmax()
	for _, f := range [][]byte{fp, []byte("another request")} {
		c, err := s.Claim(ctx, k, f, time.Minute)
		want := idempotency.Completed
		if string(f) != string(fp) {
			want = idempotency.Mismatch
		}
		if err != nil || c.State != want {
			t.Fatalf("Claim(%q) = %v, %v, want %v", f, c.State, err, want)
		}
	}
	if after := xmax(); after != before {
		t.Errorf("the record's xmax went from %s to %s: a replay or mismatch locked the row", before, after)
	}
}
