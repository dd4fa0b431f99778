package server

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// pgJoined is a migrated schema with a business table, charges, for the
// joined-mode tests: a charge handler writes one row per execution, in the
// call's transaction, and the rows per key count the executions that
// committed.
type pgJoined struct {
	dsn    string
	admin  *pgxpool.Pool
	schema string // quoted
}

func newPgJoined(t *testing.T) *pgJoined {
	t.Helper()
	dsn := pgtest.DSN(t)
	admin := pgtest.Pool(t, dsn)
	name := pgtest.Schema(t, admin)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, admin, name); err != nil {
		t.Fatal(err)
	}
	p := &pgJoined{dsn: dsn, admin: admin, schema: pgtest.Ident(name)}
	if _, err := admin.Exec(ctx, "CREATE TABLE "+p.schema+".charges (id bigserial PRIMARY KEY, key text NOT NULL, "+
		"amount integer NOT NULL CHECK (amount > 0))"); err != nil {
		t.Fatal(err)
	}
	return p
}

// store returns a store in joined mode on a pool of its own (a replica's),
// warmed up; cfg, when set, edits the pool's configuration first.
func (p *pgJoined) store(t *testing.T, cfg func(*pgxpool.Config), opts ...pgstore.Option) *pgstore.JoinedStore {
	t.Helper()
	s, _ := p.storeAndPool(t, cfg, opts...)
	return s
}

// storeAndPool is store, with the store's pool.
func (p *pgJoined) storeAndPool(t *testing.T, cfg func(*pgxpool.Config), opts ...pgstore.Option) (*pgstore.JoinedStore, *pgxpool.Pool) {
	t.Helper()
	c, err := pgxpool.ParseConfig(p.dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg != nil {
		cfg(c)
	}
	pool := pgtest.PoolConfig(t, c)
	name, _ := strconv.Unquote(p.schema)
	s, err := pgstore.New(pool, append([]pgstore.Option{pgstore.WithSchema(name), pgstore.WithLockTimeout(pgLockTimeout)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	pgWarm(t, s)
	return s.Joined(), pool
}

// rows returns the charges committed for key.
func (p *pgJoined) rows(t *testing.T, key string) int {
	t.Helper()
	var n int
	if err := p.admin.QueryRow(context.Background(), "SELECT count(*) FROM "+p.schema+".charges WHERE key = $1", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// charge is the charge handler's write: one row for the call's key, in the
// call's transaction; it returns the row's id.
func (p *pgJoined) charge(ctx context.Context, amount int) (int64, error) {
	tx, ok := pgstore.Tx(ctx)
	if !ok {
		return 0, status.Error(codes.Internal, "no joined transaction in the handler's context")
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var id int64
	err := tx.QueryRow(ctx, "INSERT INTO "+p.schema+".charges (key, amount) VALUES ($1, $2) RETURNING id",
		md.Get("idempotency-key")[0], amount).Scan(&id)
	return id, err
}

// chargeEcho is an idemEcho whose handler charges, then runs then (when
// set) with the transaction, and answers the row's id.
func (p *pgJoined) chargeEcho(then func(ctx context.Context, tx pgx.Tx) error) *idemEcho {
	return &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		id, err := p.charge(ctx, 10)
		if err != nil {
			return nil, err
		}
		if then != nil {
			tx, _ := pgstore.Tx(ctx)
			if err := then(ctx, tx); err != nil {
				return nil, err
			}
		}
		return &echov1.EchoResponse{Message: "charge " + strconv.FormatInt(id, 10)}, nil
	}}
}

// TestIdempotencyJoinedWritesCommitWithTheRecord: the handler's write and
// the record commit in one transaction, before the reply; the duplicate is
// replayed byte for byte and writes nothing; a caller that gives up before
// the commit does not cancel the transaction (issue 21's detached rule
// applied to it); the handler cannot commit the transaction itself.
func TestIdempotencyJoinedWritesCommitWithTheRecord(t *testing.T) {
	p := newPgJoined(t)
	var handlerCommit error
	e := p.chargeEcho(func(ctx context.Context, tx pgx.Tx) error {
		if md, _ := metadata.FromIncomingContext(ctx); md.Get("x-slow") != nil {
			time.Sleep(200 * time.Millisecond) // the caller's deadline passes; the transaction goes on
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
		}
		handlerCommit = tx.Commit(ctx)
		return nil
	})
	cc := idemStart(t, e, Idempotency{Store: p.store(t, nil)})
	ctx := idemCtx(t)
	first := idemDo(ctx, cc, "k1", "m")
	dup := idemDo(ctx, cc, "k1", "m")
	wantCalls(t, e, 1)
	if first.err != nil || !bytes.Equal(first.raw, dup.raw) {
		t.Fatalf("first = %x, %v; duplicate = %x, %v; want one reply, replayed", first.raw, first.err, dup.raw, dup.err)
	}
	if n := p.rows(t, "k1"); n != 1 {
		t.Errorf("charges for k1 = %d, want 1", n)
	}
	if !errors.Is(handlerCommit, pgstore.ErrHandlerCommit) {
		t.Errorf("the handler's tx.Commit() = %v, want ErrHandlerCommit", handlerCommit)
	}

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	gone := idemDo(short, cc, "k2", "m", "x-slow", "1")
	cancel()
	wantCode(t, "caller gone before the commit", gone.err, codes.DeadlineExceeded, "")
	var retry idemCall
	for range 50 { // the detached handler commits 200 ms in; until then the retry waits for it
		if retry = idemDo(ctx, cc, "k2", "m", "x-slow", "1"); retry.err == nil {
			break
		}
		wantCode(t, "retry", retry.err, codes.Aborted, "in progress")
	}
	if retry.err != nil {
		t.Fatalf("retry = %v, want the committed outcome", retry.err)
	}
	wantCalls(t, e, 2)
	if n := p.rows(t, "k2"); n != 1 {
		t.Errorf("charges for k2 = %d, want 1: the caller's end cancelled nothing", n)
	}
}

// TestIdempotencyJoinedUnstoredOutcomeRollsBackTheWrites: after an
// unstored code or a panic, the handler's write is rolled back with the
// claim, and the retry runs the call again: one charge in all.
func TestIdempotencyJoinedUnstoredOutcomeRollsBackTheWrites(t *testing.T) {
	tests := []struct {
		name string
		fail func() error
		want codes.Code
	}{
		{"UNAVAILABLE", func() error { return status.Error(codes.Unavailable, "downstream down") }, codes.Unavailable},
		{"ABORTED", func() error { return status.Error(codes.Aborted, "conflict") }, codes.Aborted},
		{"Panic", func() error { panic("boom") }, codes.Internal},
	}
	p := newPgJoined(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var runs atomic.Int32
			e := p.chargeEcho(func(context.Context, pgx.Tx) error {
				if runs.Add(1) == 1 {
					return tt.fail()
				}
				return nil
			})
			cc := idemStart(t, e, Idempotency{Store: p.store(t, nil)})
			ctx := idemCtx(t)
			key := "unstored-" + tt.name
			wantCode(t, "first attempt", idemDo(ctx, cc, key, "m").err, tt.want, "")
			if n := p.rows(t, key); n != 0 {
				t.Fatalf("charges after a rolled-back attempt = %d, want 0", n)
			}
			if r := idemDo(ctx, cc, key, "m"); r.err != nil {
				t.Fatalf("retry = %v, want success", r.err)
			}
			wantCalls(t, e, 2)
			if n := p.rows(t, key); n != 1 {
				t.Errorf("charges = %d, want 1", n)
			}
		})
	}
}

// TestIdempotencyJoinedStoredErrorUndoesTheWritesAndIsReplayed: an error
// whose code is stored undoes the handler's writes (back to the savepoint
// before the handler), even when one of its statements failed and aborted
// the transaction, and is replayed to the duplicate without running it.
func TestIdempotencyJoinedStoredErrorUndoesTheWritesAndIsReplayed(t *testing.T) {
	tests := []struct {
		name string
		then func(ctx context.Context, tx pgx.Tx) error
		want codes.Code
	}{
		{"FailedPrecondition", func(context.Context, pgx.Tx) error {
			return status.Error(codes.FailedPrecondition, "insufficient funds")
		}, codes.FailedPrecondition},
		{"AfterAFailedStatement", func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT 1/0")
			return status.Errorf(codes.InvalidArgument, "bad amount: %v", err)
		}, codes.InvalidArgument},
	}
	p := newPgJoined(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := p.chargeEcho(tt.then)
			cc := idemStart(t, e, Idempotency{Store: p.store(t, nil)})
			ctx := idemCtx(t)
			key := "stored-" + tt.name
			first := idemDo(ctx, cc, key, "m")
			wantCode(t, "first", first.err, tt.want, "")
			dup := idemDo(ctx, cc, key, "m")
			wantCode(t, "duplicate", dup.err, tt.want, "")
			if status.Convert(dup.err).Message() != status.Convert(first.err).Message() {
				t.Errorf("replayed %v, want %v", dup.err, first.err)
			}
			wantCalls(t, e, 1)
			if n := p.rows(t, key); n != 0 {
				t.Errorf("charges = %d, want 0: an error outcome undoes the handler's writes", n)
			}
		})
	}
}

// TestIdempotencyJoinedDuplicateDoesNotWaitOnTheOwnersRowLock: a
// duplicate on another server learns at its lookup that the owner's
// transaction holds the key (its advisory lock), without a wait on the
// owner's row lock and without holding a pool connection: it polls, as for
// a lease held elsewhere, and replays what the owner committed; with
// waiting off it gets ABORTED with a pushback at once. The handler runs
// once; no backend of the cluster ever waits on a lock.
func TestIdempotencyJoinedDuplicateDoesNotWaitOnTheOwnersRowLock(t *testing.T) {
	for _, noWait := range []bool{false, true} {
		t.Run("NoWait="+strconv.FormatBool(noWait), func(t *testing.T) {
			p := newPgJoined(t)
			gate, entered := make(chan struct{}), make(chan struct{})
			e := p.chargeEcho(func(context.Context, pgx.Tx) error {
				close(entered)
				<-gate
				return nil
			})
			// The duplicate's server has one connection: held while it
			// waited, it would have none for its polls.
			ccA := idemStart(t, e, Idempotency{Store: p.store(t, nil)})
			dupStore, dupPool := p.storeAndPool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
			ccB := idemStart(t, e, Idempotency{Store: dupStore, NoWait: noWait, Pushback: 250 * time.Millisecond})
			ctx := idemCtx(t)
			firstDone := make(chan idemCall)
			go func() { firstDone <- idemDo(ctx, ccA, "k", "m") }()
			<-entered
			var first, dup idemCall
			if noWait {
				start := time.Now()
				dup = idemDo(ctx, ccB, "k", "m")
				wantCode(t, "duplicate with waiting off", dup.err, codes.Aborted, "in progress")
				if took := time.Since(start); took > pgLockTimeout/2 {
					t.Errorf("duplicate answered in %v, want at once (the store's lock timeout is %v)", took, pgLockTimeout)
				}
				if got := dup.trailer.Get("grpc-retry-pushback-ms"); len(got) != 1 || got[0] != "250" {
					t.Errorf("grpc-retry-pushback-ms = %q, want [250]", got)
				}
				close(gate)
				first = <-firstDone
				dup = idemDo(ctx, ccB, "k", "m")
			} else {
				dupDone := make(chan idemCall)
				go func() { dupDone <- idemDo(ctx, ccB, "k", "m") }()
				p.waitForPolls(t, dupPool)
				close(gate)
				first, dup = <-firstDone, <-dupDone
			}
			if first.err != nil || dup.err != nil || !bytes.Equal(first.raw, dup.raw) {
				t.Fatalf("first = %x, %v; duplicate = %x, %v; want the first's reply replayed", first.raw, first.err, dup.raw, dup.err)
			}
			if dup.header.Get(wire.IdempotencyReplayedHeader) == nil {
				t.Errorf("duplicate's header lacks %s", wire.IdempotencyReplayedHeader)
			}
			wantCalls(t, e, 1)
			if n := p.rows(t, "k"); n != 1 {
				t.Errorf("charges = %d, want 1", n)
			}
		})
	}
}

// waitForPolls waits until the duplicate's store has polled the key twice
// with its one connection idle in between (its pool's acquisitions count
// the polls), and checks that no backend of the cluster waits on a lock.
func (p *pgJoined) waitForPolls(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	start := pool.Stat().AcquireCount()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		st := pool.Stat()
		if st.AcquireCount() >= start+2 && st.AcquiredConns() == 0 {
			var n int
			if err := p.admin.QueryRow(context.Background(),
				"SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				t.Errorf("%d backends wait on a lock while a duplicate polls; want none", n)
			}
			return
		}
		time.Sleep(5 * time.Millisecond) // observing the pool's counters
	}
	t.Fatal("the duplicate did not poll twice within 10s")
}

// TestIdempotencyJoinedDeadOwnerFreesTheKeyAtOnce: when the owner's
// connection dies (its process was killed), PostgreSQL rolls its
// transaction back, write and claim: a duplicate runs the call at once,
// not a lease later, and one charge stays.
func TestIdempotencyJoinedDeadOwnerFreesTheKeyAtOnce(t *testing.T) {
	p := newPgJoined(t)
	pid, hold := make(chan uint32, 1), make(chan struct{})
	var once sync.Once
	e := p.chargeEcho(func(_ context.Context, tx pgx.Tx) error {
		first := false
		once.Do(func() { first = true })
		if first {
			var p uint32
			if err := tx.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&p); err != nil {
				return err
			}
			pid <- p
			<-hold // the process is dead: it never goes on (until the test ends)
		}
		return nil
	})
	ccA := idemStart(t, e, Idempotency{Store: p.store(t, nil)})
	ccB := idemStart(t, e, Idempotency{Store: p.store(t, nil)})
	ctx := idemCtx(t)
	aDone := make(chan idemCall, 1)
	go func() { aDone <- idemDo(ctx, ccA, "k", "m") }()
	if _, err := p.admin.Exec(ctx, "SELECT pg_terminate_backend($1)", <-pid); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var dup idemCall
	for range 100 { // the terminated backend's rollback takes a moment
		if dup = idemDo(ctx, ccB, "k", "m"); status.Code(dup.err) != codes.Aborted {
			break
		}
	}
	if dup.err != nil {
		t.Fatalf("duplicate after the owner died = %v, want it to run the call", dup.err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("duplicate ran %v after the owner died, want at once (the lease is %v)", waited, defaultLease)
	}
	close(hold)
	a := <-aDone
	wantCode(t, "the dead owner's call", a.err, codes.Unavailable, "did not commit")
	if n := p.rows(t, "k"); n != 1 {
		t.Errorf("charges = %d, want 1: the dead owner's write was rolled back", n)
	}
	if r := idemDo(ctx, ccA, "k", "m"); r.err != nil || !bytes.Equal(r.raw, dup.raw) {
		t.Errorf("the dead owner's caller's retry = %x, %v, want the duplicate's outcome replayed", r.raw, r.err)
	}
}

// TestIdempotencyJoinedCommitOutcomeUnknownNeverRunsTwice: when the
// connection breaks at COMMIT, the server cannot know whether it
// committed: the caller gets UNAVAILABLE, never the reply, and its retry
// finds the committed record and replays it (the reply was lost), or finds
// the key free and the write rolled back with it (the request never
// arrived), and runs the call. One charge either way.
func TestIdempotencyJoinedCommitOutcomeUnknownNeverRunsTwice(t *testing.T) {
	tests := []struct {
		fault     pgtest.Fault
		wantCalls int64
	}{
		{pgtest.LoseReply, 1},   // committed: the retry replays
		{pgtest.DropRequest, 2}, // rolled back: the retry runs again
	}
	p := newPgJoined(t)
	for _, tt := range tests {
		name := map[pgtest.Fault]string{pgtest.LoseReply: "LoseReply", pgtest.DropRequest: "DropRequest"}[tt.fault]
		t.Run(name, func(t *testing.T) {
			var once sync.Once
			var faults *pgtest.Faults
			e := p.chargeEcho(func(context.Context, pgx.Tx) error {
				once.Do(func() { faults.Next(tt.fault) }) // the next request of the pool's one connection is the commit
				return nil
			})
			cc := idemStart(t, e, Idempotency{Store: p.store(t, func(c *pgxpool.Config) {
				c.MaxConns = 1
				faults = pgtest.InjectFaults(c)
			})})
			ctx := idemCtx(t)
			key := "unknown-" + name
			once.Do(func() {}) // the warm-up call prepares the joined statements on the connection, unharmed
			if r := idemDo(ctx, cc, key+"-warm-up", "m"); r.err != nil {
				t.Fatal(r.err)
			}
			once = sync.Once{}
			wantCode(t, "call whose COMMIT broke", idemDo(ctx, cc, key, "m").err, codes.Unavailable, "did not commit")
			var retry idemCall
			for range 100 { // a dropped connection's rollback takes a moment to reach the server
				if retry = idemDo(ctx, cc, key, "m"); status.Code(retry.err) != codes.Aborted {
					break
				}
			}
			if retry.err != nil {
				t.Fatalf("retry = %v, want success", retry.err)
			}
			wantCalls(t, e, 1+tt.wantCalls)
			if n := p.rows(t, key); n != 1 {
				t.Errorf("charges = %d, want 1", n)
			}
		})
	}
}

// TestIdempotencyJoinedRoundTrips pins the cost of joined mode in round
// trips to PostgreSQL: a first execution adds at most one to the handler's
// own transaction (BEGIN, its write, COMMIT: three), and a replay costs
// one.
func TestIdempotencyJoinedRoundTrips(t *testing.T) {
	p := newPgJoined(t)
	var rt *pgtest.RoundTrips
	store := p.store(t, func(c *pgxpool.Config) {
		c.MaxConns = 1 // one connection, whose statements are prepared after the warm-up
		rt = pgtest.CountRoundTrips(c)
	})
	e := p.chargeEcho(nil)
	cc := idemStart(t, e, Idempotency{Store: store})
	ctx := idemCtx(t)

	// The handler's own transaction, on a pool of its own.
	cfg, err := pgxpool.ParseConfig(p.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	own := pgtest.CountRoundTrips(cfg)
	pool := pgtest.PoolConfig(t, cfg)
	ownTx := func(key string) int64 {
		before := own.N()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+p.schema+".charges (key, amount) VALUES ($1, 10)", key)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return own.N() - before
	}
	call := func(key string) int64 {
		before := rt.N()
		if r := idemDo(ctx, cc, key, "m"); r.err != nil {
			t.Fatal(r.err)
		}
		return rt.N() - before
	}
	for i := range 3 { // warm-up: connections made, statements prepared
		ownTx("warm-own-" + strconv.Itoa(i))
		call("warm-" + strconv.Itoa(i))
		call("warm-" + strconv.Itoa(i))
	}
	base, first, replay := ownTx("own"), call("k"), call("k")
	t.Logf("round trips: the handler's own transaction %d, joined first execution %d, replay %d", base, first, replay)
	if first > base+1 {
		t.Errorf("joined first execution = %d round trips, want at most the handler's own %d + 1", first, base)
	}
	if replay != 1 {
		t.Errorf("replay = %d round trips, want 1", replay)
	}
}
