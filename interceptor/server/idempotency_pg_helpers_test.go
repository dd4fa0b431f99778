package server

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
)

// The PostgreSQL store runs the semantics tests too, in its two modes:
// lease mode as the other stores, joined mode where its semantics differ
// (env.joined).
func init() {
	idemSUTs = append(idemSUTs,
		idemSUT{name: "postgres", setup: func(t *testing.T) func(*testing.T, func(*testing.T, *idemEnv)) {
			return pgSUT(t, false)
		}},
		idemSUT{name: "postgres-joined", setup: func(t *testing.T) func(*testing.T, func(*testing.T, *idemEnv)) {
			return pgSUT(t, true)
		}},
	)
}

// pgLockTimeout is the joined store's wait for an owner's transaction in
// the semantics tests, which expect duplicates to wait for the owner's
// outcome (a thousand keys at once under -race take a while);
// TestIdempotencyJoinedDuplicateWaitsForTheOwnersCommit sets a short one.
const pgLockTimeout = 3 * time.Second

func pgSUT(t *testing.T, joined bool) func(*testing.T, func(*testing.T, *idemEnv)) {
	dsn := pgtest.DSN(t)
	return func(t *testing.T, f func(*testing.T, *idemEnv)) {
		admin := pgtest.Pool(t, dsn)
		schema := pgtest.Schema(t, admin)
		if err := pgstore.Migrate(context.Background(), admin, schema); err != nil {
			t.Fatal(err)
		}
		open := func(dsn string, warm bool) idempotency.Store {
			cfg, err := pgxpool.ParseConfig(dsn)
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 64
			pool := pgtest.PoolConfig(t, cfg)
			// The semantics tests send bursts (a thousand keys at once) of
			// fast calls in one scope: no bound on the joined transactions
			// open but the pool's (WithJoinedTxLimit's own tests pin it).
			s, err := pgstore.New(pool, pgstore.WithSchema(schema), pgstore.WithMaxRecordBytes(idemMaxRecord),
				pgstore.WithLockTimeout(pgLockTimeout), pgstore.WithJoinedTxLimit(int(cfg.MaxConns), int(cfg.MaxConns)))
			if err != nil {
				t.Fatal(err)
			}
			if warm {
				pgWarm(t, s)
			}
			if joined {
				return s.Joined()
			}
			return s
		}
		// A replica's store, connected and warm before the test: tests time
		// what follows newStore, and a new PostgreSQL connection is slower
		// than a Redis client's.
		spare := open(dsn, true)
		newStore := func() idempotency.Store {
			if s := spare; s != nil {
				spare = nil
				return s
			}
			return open(dsn, true)
		}
		f(t, &idemEnv{
			store:     open(dsn, true),
			newStore:  newStore,
			advance:   func(d time.Duration) { pgAdvance(t, admin, schema, d) },
			downStore: func() idempotency.Store { return open(pgtest.ClosedDSN(t), false) },
			joined:    joined,
		})
	}
}

// pgAdvance makes the rows of schema behave as if d had passed.
func pgAdvance(t testing.TB, pool *pgxpool.Pool, schema string, d time.Duration) {
	t.Helper()
	q := "UPDATE " + pgtest.Ident(schema) + ".resilience_idempotency SET lease_until = lease_until - $1::interval, " +
		"retain_until = retain_until - $1::interval, expires_at = expires_at - $1::interval"
	if _, err := pool.Exec(context.Background(), q, d); err != nil {
		t.Fatalf("advance(%v): %v", d, err)
	}
}

// pgWarm claims and releases a key of its own on s, so that the pool has a
// connection and the store's statements are prepared on it: tests that
// give a first call 50 ms expect it to reach the handler.
func pgWarm(t testing.TB, s *pgstore.Store) {
	t.Helper()
	ctx := context.Background()
	k := idempotency.RecordKey{Scope: "warm-up", FullMethod: idemEchoMethod, Key: "warm-up"}
	c, err := s.Claim(ctx, k, []byte("fp"), time.Minute)
	if err != nil {
		t.Fatalf("warming the store up: %v", err)
	}
	if err := s.Release(ctx, k, c.Token); err != nil {
		t.Fatalf("warming the store up: %v", err)
	}
}
