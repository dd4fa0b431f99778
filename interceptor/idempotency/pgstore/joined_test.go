package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
)

var fp = []byte("fingerprint-of-the-request-------")

func rk(key string) idempotency.RecordKey {
	return idempotency.RecordKey{Scope: "tenant", FullMethod: "/shop.v1.Shop/Order", Key: key}
}

// ok is a record of a successful outcome.
func ok() *idempotency.Record {
	return &idempotency.Record{Fingerprint: fp, ReplyType: "shop.v1.OrderReply", Reply: []byte("done")}
}

// foreignAPI stands for a payment provider that deduplicates by key: it
// counts the calls it received and the charges it made.
type foreignAPI struct {
	mu      sync.Mutex
	calls   int
	charges map[string]int
}

func (f *foreignAPI) charge(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.charges == nil {
		f.charges = make(map[string]int)
	}
	if _, seen := f.charges[key]; !seen {
		f.charges[key] = 1
	}
}

// TestPhaseResumesAfterAKillAtEveryBoundary runs a handler of three phases
// (an order row; a foreign charge with its derived key and a payment row;
// a receipt row) and the record's commit, and kills its owner (its
// backend terminated, its goroutine never going on) at every boundary:
// inside each phase before its commit, after each commit, and after the
// last one before the record's. A retry of the same request resumes after
// the last committed phase: every row exists once, the foreign API charged
// each phase key once, and the outcome is stored.
func TestPhaseResumesAfterAKillAtEveryBoundary(t *testing.T) {
	phases := []string{"order", "pay", "receipt"}
	var points []string
	for _, p := range phases {
		points = append(points, "in "+p, "after "+p)
	}
	for _, kill := range points {
		t.Run(strings.ReplaceAll(kill, " ", "-"), func(t *testing.T) {
			pool, schema := migrated(t)
			ctx := context.Background()
			q := pgtest.Ident(schema)
			if _, err := pool.Exec(ctx, "CREATE TABLE "+q+".steps (key text, step text)"); err != nil {
				t.Fatal(err)
			}
			const lease = time.Second
			s, err := pgstore.New(pool, pgstore.WithSchema(schema), pgstore.WithLockTimeout(200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			j := s.Joined()
			api := &foreignAPI{}
			killed := errors.New("killed")
			// run is one execution of the handler; it returns killed when it
			// dies at the kill point, after terminating its own backend.
			run := func(txn idempotency.Txn, die string) error {
				hctx := txn.Context(ctx)
				tx, _ := pgstore.Tx(hctx)
				for _, name := range phases {
					_, err := pgstore.Phase(hctx, name, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
						if name == "pay" {
							key, ok := pgstore.ForeignKey(ctx)
							if !ok {
								return nil, errors.New("no foreign key in the phase")
							}
							api.charge(key)
						}
						if _, err := tx.Exec(ctx, "INSERT INTO "+q+".steps VALUES ('k', $1)", name); err != nil {
							return nil, err
						}
						if die == "in "+name {
							terminate(t, pool, tx)
							return nil, killed
						}
						return []byte(name + "-result"), nil
					})
					if err != nil {
						return err
					}
					if die == "after "+name {
						terminate(t, pool, tx)
						return killed
					}
				}
				return nil
			}
			cl, txn, err := j.ClaimTx(ctx, rk("k"), fp, lease)
			if err != nil || cl.State != idempotency.Owned {
				t.Fatalf("ClaimTx() = %v, %v, want Owned", cl.State, err)
			}
			// The dead owner's Txn is never ended by its process; the test
			// ends it, so the pool gets its connection back (broken).
			t.Cleanup(func() { _ = txn.Rollback(ctx) })
			if err := run(txn, kill); !errors.Is(err, killed) {
				t.Fatalf("first run = %v, want it killed", err)
			}
			// The owner is dead. Once its lease has ended (moved on here),
			// a retry takes the row over.
			var resumed idempotency.Txn
			for range 100 {
				advance(t, pool, schema, lease)
				cl, resumed, err = j.ClaimTx(ctx, rk("k"), fp, lease)
				if err != nil {
					t.Fatal(err)
				}
				if cl.State == idempotency.Owned {
					break
				}
				time.Sleep(10 * time.Millisecond) // the terminated backend's rollback
			}
			if cl.State != idempotency.Owned {
				t.Fatalf("retry's ClaimTx() = %v, want Owned", cl.State)
			}
			if err := run(resumed, ""); err != nil {
				t.Fatalf("resumed run = %v", err)
			}
			if err := resumed.Commit(ctx, ok(), time.Hour); err != nil {
				t.Fatalf("Commit() = %v", err)
			}
			for _, name := range phases {
				var n int
				if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+q+".steps WHERE step = $1", name).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 1 {
					t.Errorf("rows of phase %q = %d, want 1", name, n)
				}
			}
			if len(api.charges) != 1 {
				t.Errorf("foreign charges = %v, want one key charged once", api.charges)
			}
			if cl, _, err := j.ClaimTx(ctx, rk("k"), fp, lease); err != nil || cl.State != idempotency.Completed {
				t.Errorf("ClaimTx() after the commit = %v, %v, want Completed", cl.State, err)
			}
		})
	}
}

// terminate ends the backend of tx's connection, as the death of its
// process would: PostgreSQL rolls back what it had not committed.
func terminate(t *testing.T, pool *pgxpool.Pool, tx pgx.Tx) {
	t.Helper()
	ctx := context.Background()
	var pid uint32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
}

// TestForeignKeyIsPerCallAndPhase: the derived key is the same for every
// run of one phase of one call, and differs between phases, keys, scopes.
func TestForeignKeyIsPerCallAndPhase(t *testing.T) {
	pool, schema := migrated(t)
	s, err := pgstore.New(pool, pgstore.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	j := s.Joined()
	ctx := context.Background()
	keyOf := func(k idempotency.RecordKey, phase string) string {
		cl, txn, err := j.ClaimTx(ctx, k, fp, time.Minute)
		if err != nil || cl.State != idempotency.Owned {
			t.Fatalf("ClaimTx(%v) = %v, %v", k, cl.State, err)
		}
		defer func() { _ = txn.Rollback(ctx) }()
		var key string
		_, err = pgstore.Phase(txn.Context(ctx), phase, func(ctx context.Context, _ pgx.Tx) ([]byte, error) {
			key, _ = pgstore.ForeignKey(ctx)
			return nil, errors.New("do not commit")
		})
		if err == nil {
			t.Fatal("Phase() = nil, want fn's error")
		}
		return key
	}
	a := keyOf(rk("k"), "pay")
	other := idempotency.RecordKey{Scope: "another tenant", FullMethod: rk("k").FullMethod, Key: "k"}
	for what, k := range map[string]string{
		"the same phase again": keyOf(rk("k"), "pay"),
		"another phase":        keyOf(rk("k"), "refund"),
		"another key":          keyOf(rk("k2"), "pay"),
		"another scope":        keyOf(other, "pay"),
	} {
		if same := k == a; same != (what == "the same phase again") {
			t.Errorf("ForeignKey for %s = %q, first %q: equal = %v", what, k, a, same)
		}
	}
	if len(a) != 43 {
		t.Errorf("ForeignKey = %q: %d characters, want 43", a, len(a))
	}
	if _, ok := pgstore.ForeignKey(ctx); ok {
		t.Error("ForeignKey() outside a phase: ok = true")
	}
	if _, err := pgstore.Phase(ctx, "x", nil); !errors.Is(err, pgstore.ErrNotJoined) {
		t.Errorf("Phase() outside a joined transaction = %v, want ErrNotJoined", err)
	}
}

// TestJoinedQuotaRefusesAScopeAtItsQuota: joined rows are counted once
// committed; a scope at its quota is refused with a FullError while another
// scope claims on; once its records pass their minimum retention, a claim
// evicts the oldest and goes through.
func TestJoinedQuotaRefusesAScopeAtItsQuota(t *testing.T) {
	pool, schema := migrated(t)
	s, err := pgstore.New(pool, pgstore.WithSchema(schema), pgstore.WithScopeQuota(3, 0), pgstore.WithScopePartitions(1),
		pgstore.WithMinRetention(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	j := s.Joined()
	ctx := context.Background()
	in := func(scope string, i int) idempotency.RecordKey {
		return idempotency.RecordKey{Scope: scope, FullMethod: "/shop.v1.Shop/Order", Key: fmt.Sprint("q-", i)}
	}
	commit := func(k idempotency.RecordKey) error {
		cl, txn, err := j.ClaimTx(ctx, k, fp, time.Minute)
		if err != nil {
			return err
		}
		if cl.State != idempotency.Owned {
			return fmt.Errorf("ClaimTx(%v) = %v, want Owned", k.Key, cl.State)
		}
		return txn.Commit(ctx, ok(), time.Hour)
	}
	for i := range 3 {
		if err := commit(in("a", i)); err != nil {
			t.Fatal(err)
		}
	}
	err = commit(in("a", 3))
	var full *idempotency.FullError
	if !errors.As(err, &full) || !full.Scope || full.RetryAfter <= 0 {
		t.Fatalf("claim past the quota = %v, want a scope FullError with a RetryAfter", err)
	}
	if err := commit(in("b", 0)); err != nil {
		t.Fatalf("another scope's claim = %v, want it to go through", err)
	}
	advance(t, pool, schema, time.Minute) // scope a's records pass their minimum retention
	if err := commit(in("a", 3)); err != nil {
		t.Fatalf("claim once records may be evicted = %v, want it to go through", err)
	}
	var entries int64
	if err := pool.QueryRow(ctx, "SELECT sum(entries) FROM "+pgtest.Ident(schema)+".resilience_idempotency_quota").Scan(&entries); err != nil {
		t.Fatal(err)
	}
	if entries != 4 {
		t.Errorf("entries counted = %d, want 4 (three of a, one evicted, one added; one of b)", entries)
	}
}

// TestReaperDeletesEndedRowsInBatchesAndStops: the reaper of Open deletes
// rows past their end, batch after batch, takes them off the quota, and
// Close stops it (goleak checks no goroutine is left).
func TestReaperDeletesEndedRowsInBatchesAndStops(t *testing.T) {
	pool, schema := migrated(t)
	ctx := context.Background()
	s, err := pgstore.Open(ctx, pool, pgstore.WithSchema(schema), pgstore.WithReaper(20*time.Millisecond, 2))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 7 {
		c, err := s.Claim(ctx, rk(fmt.Sprint("r-", i)), fp, time.Minute)
		if err != nil || c.State != idempotency.Owned {
			t.Fatalf("Claim() = %v, %v", c.State, err)
		}
		if i < 5 {
			if err := s.Complete(ctx, rk(fmt.Sprint("r-", i)), c.Token, ok(), time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	advance(t, pool, schema, 2*time.Second) // the five records end; the two leases do not
	q := pgtest.Ident(schema)
	for deadline := time.Now().Add(10 * time.Second); ; {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+q+".resilience_idempotency").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rows = %d after 10s, want the 2 live ones", n)
		}
		time.Sleep(10 * time.Millisecond) // the reaper's interval is 20 ms
	}
	var entries int64
	if err := pool.QueryRow(ctx, "SELECT sum(entries) FROM "+q+".resilience_idempotency_quota").Scan(&entries); err != nil {
		t.Fatal(err)
	}
	if entries != 2 {
		t.Errorf("entries counted = %d, want 2", entries)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // twice: a no-op
		t.Fatal(err)
	}
	// Close returns once the goroutine has: none is left to reap.
	if buf := make([]byte, 1<<20); strings.Contains(string(buf[:runtime.Stack(buf, true)]), "pgstore.(*reaper).run") {
		t.Fatal("a reaper goroutine is running after Close")
	}
}

// TestReapDeletesOneBatchAtATime: one Reap deletes at most the batch of
// WithReaper, the oldest ended rows first, and leaves live rows alone.
func TestReapDeletesOneBatchAtATime(t *testing.T) {
	pool, schema := migrated(t)
	ctx := context.Background()
	s, err := pgstore.New(pool, pgstore.WithSchema(schema), pgstore.WithReaper(time.Hour, 2)) // New starts no reaper
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		c, err := s.Claim(ctx, rk(fmt.Sprint("b-", i)), fp, time.Minute)
		if err != nil || c.State != idempotency.Owned {
			t.Fatalf("Claim() = %v, %v", c.State, err)
		}
		if i < 5 {
			if err := s.Complete(ctx, rk(fmt.Sprint("b-", i)), c.Token, ok(), time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	advance(t, pool, schema, 2*time.Second) // five records end; the lease does not
	var got []int
	for range 4 {
		n, err := s.Reap(ctx)
		if err != nil {
			t.Fatalf("Reap() error = %v", err)
		}
		got = append(got, n)
	}
	if fmt.Sprint(got) != "[2 2 1 0]" {
		t.Errorf("Reap() four times deleted %v, want [2 2 1 0] (batches of 2, five ended rows)", got)
	}
}

// TestOpenChecksTheSchema: Open refuses a schema without the store's
// tables, naming what is missing and the fix; Migrate is idempotent.
func TestOpenChecksTheSchema(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.DSN(t))
	schema := pgtest.Schema(t, pool)
	ctx := context.Background()
	_, err := pgstore.Open(ctx, pool, pgstore.WithSchema(schema))
	if !errors.Is(err, pgstore.ErrNotMigrated) || !strings.Contains(err.Error(), "resilience_idempotency") ||
		!strings.Contains(err.Error(), "pgstore.Migrate") {
		t.Fatalf("Open() before Migrate = %v, want ErrNotMigrated naming the table and the fix", err)
	}
	for range 2 {
		if err := pgstore.Migrate(ctx, pool, schema); err != nil {
			t.Fatalf("Migrate() = %v", err)
		}
	}
	s, err := pgstore.Open(ctx, pool, pgstore.WithSchema(schema))
	if err != nil {
		t.Fatalf("Open() after Migrate = %v", err)
	}
	_ = s.Close()
	if _, err := pool.Exec(ctx, "UPDATE "+pgtest.Ident(schema)+".resilience_idempotency_version SET version = 99"); err != nil {
		t.Fatal(err)
	}
	if err := pgstore.Check(ctx, pool, schema); !errors.Is(err, pgstore.ErrNotMigrated) || !strings.Contains(err.Error(), "version 99") {
		t.Errorf("Check() of another version = %v, want ErrNotMigrated naming it", err)
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.DSN(t))
	tests := []struct {
		opt  pgstore.Option
		want string
	}{
		{pgstore.WithSchema(""), "WithSchema"},
		{pgstore.WithMaxRecordBytes(0), "WithMaxRecordBytes(0)"},
		{pgstore.WithScopeQuota(-1, 0), "WithScopeQuota(-1, 0)"},
		{pgstore.WithScopePartitions(0), "WithScopePartitions(0)"},
		{pgstore.WithScopeQuota(3, 0), "fewer entries than the 8 partitions"},
		{pgstore.WithLockTimeout(0), "WithLockTimeout(0s)"},
		{pgstore.WithReaper(time.Second, 0), "WithReaper(1s, 0)"},
		{pgstore.WithLogger(nil), "WithLogger(nil)"},
		{pgstore.WithTxOptions(pgx.TxOptions{BeginQuery: "BEGIN"}), "BeginQuery"},
		{pgstore.WithJoinedTxLimit(-1, 0), "WithJoinedTxLimit(-1, 0)"},
		{pgstore.WithJoinedTxLimit(3, 2), "WithJoinedTxLimit(3, 2)"},
		{pgstore.WithJoinedTxLimit(0, 1000), "WithJoinedTxLimit(0, 1000)"},
	}
	for _, tt := range tests {
		if _, err := pgstore.New(pool, tt.opt); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%s) = %v, want an error naming it", tt.want, err)
		}
	}
	if _, err := pgstore.New(nil); err == nil {
		t.Error("New(nil) = nil error, want one")
	}
	var nilStore *pgstore.Store
	if j := nilStore.Joined(); j != nil {
		t.Errorf("(*Store)(nil).Joined() = %v, want nil", j)
	}
}

// TestJoinedTxLimitIsAShareOfThePool: by default a scope holds at most half
// the pool's connections in joined transactions, and all scopes together
// all but a quarter (WithJoinedTxLimit's doc: MaxConns 2 → 1 and 1, 4 → 2
// and 3, 10 → 5 and 8); a claim past either is refused at once with a
// FullError, after its lookup, so a completed key still replays; and every
// way a transaction ends (Commit, Rollback) gives its slot back.
func TestJoinedTxLimitIsAShareOfThePool(t *testing.T) {
	tests := []struct {
		maxConns        int32
		perScope, total int
	}{
		{2, 1, 1},
		{4, 2, 3},
		{10, 5, 8},
	}
	pool, schema := migrated(t)
	ctx := context.Background()
	for _, tt := range tests {
		t.Run(fmt.Sprint("MaxConns=", tt.maxConns), func(t *testing.T) {
			cfg := pool.Config()
			cfg.MaxConns = tt.maxConns
			small := pgtest.PoolConfig(t, cfg)
			s, err := pgstore.New(small, pgstore.WithSchema(schema))
			if err != nil {
				t.Fatal(err)
			}
			j := s.Joined()
			key := func(scope string, i int) idempotency.RecordKey {
				return idempotency.RecordKey{Scope: scope, FullMethod: "/shop.v1.Shop/Order", Key: fmt.Sprint(tt.maxConns, "-", i)}
			}
			done := key("a", -1)
			if _, txn, err := j.ClaimTx(ctx, done, fp, time.Minute); err != nil {
				t.Fatal(err)
			} else if err := txn.Commit(ctx, ok(), time.Hour); err != nil {
				t.Fatal(err)
			}
			var open []idempotency.Txn
			claim := func(k idempotency.RecordKey) error {
				cl, txn, err := j.ClaimTx(ctx, k, fp, time.Minute)
				if err == nil && cl.State == idempotency.Owned {
					open = append(open, txn)
				}
				return err
			}
			held := func(scope string, from int) int {
				n := 0
				for i := from; i < from+int(tt.maxConns)+1; i++ {
					err := claim(key(scope, i))
					if err == nil {
						n++
						continue
					}
					var full *idempotency.FullError
					if !errors.As(err, &full) || full.RetryAfter <= 0 {
						t.Fatalf("claim past the bound = %v, want a FullError with a RetryAfter", err)
					}
					break
				}
				return n
			}
			for round := range 2 { // the second after every transaction ended: nothing held
				open = open[:0]
				a := held("a", 100*round)
				if a != tt.perScope {
					t.Errorf("round %d: transactions of one scope open at once = %d, want %d", round, a, tt.perScope)
				}
				if b := held("b", 100*round); a+b != tt.total {
					t.Errorf("round %d: transactions open at once in all = %d, want %d", round, a+b, tt.total)
				}
				cl, _, err := j.ClaimTx(ctx, done, fp, time.Minute)
				if err != nil || cl.State != idempotency.Completed {
					t.Errorf("round %d: replay at the bounds = %v, %v; want Completed", round, cl.State, err)
				}
				for i, txn := range open {
					if i%2 == 0 {
						err = txn.Commit(ctx, ok(), time.Hour)
					} else {
						err = txn.Rollback(ctx)
					}
					if err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
}
