package pgstore_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
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
		s, err := pgstore.New(pool, pgstore.WithSchema(schema), pgstore.WithMaxRecordBytes(testMaxRecord))
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
		}
	})
}
