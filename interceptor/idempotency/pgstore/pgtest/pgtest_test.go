package pgtest_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

func TestSharedClusterAnswersAndSchemasKeepApart(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.DSN(t))
	a, b := pgtest.Schema(t, pool), pgtest.Schema(t, pool)
	if a == b {
		t.Fatalf("Schema() twice = %q, want two schemas", a)
	}
	ctx := context.Background()
	for _, s := range []string{a, b} {
		if _, err := pool.Exec(ctx, "CREATE TABLE "+s+".x (v int)"); err != nil {
			t.Fatalf("CREATE TABLE in %s: %v", s, err)
		}
	}
	var who string
	if err := pool.QueryRow(ctx, "SELECT current_user").Scan(&who); err != nil || who != "postgres" {
		t.Fatalf("current_user = %q, %v, want postgres", who, err)
	}
}

func TestStartStopsItsOwnCluster(t *testing.T) {
	s := pgtest.Start(t)
	pool := pgtest.Pool(t, s.DSN)
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatalf("Ping() = %v", err)
	}
	pool.Close()
	s.Stop()
	cfg, _ := pgxpool.ParseConfig(s.DSN)
	p2, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	if err := p2.Ping(context.Background()); err == nil {
		t.Fatal("Ping() after Stop = nil, want an error: the cluster must be gone")
	}
}

func TestCountRoundTripsCountsABatchAsOne(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	rt := pgtest.CountRoundTrips(cfg)
	pool := pgtest.PoolConfig(t, cfg)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil { // connect, and prepare nothing later
		t.Fatal(err)
	}
	before := rt.N()
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if got := rt.N() - before; got != 1 {
		t.Errorf("one Exec = %d round trips, want 1", got)
	}
}
