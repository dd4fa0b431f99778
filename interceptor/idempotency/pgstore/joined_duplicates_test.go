package pgstore_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
	"github.com/grpc-resilience/resilience/interceptor/server"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestJoinedDuplicateCostsOneRoundTripAndHoldsNoConnection (finding 8): a
// duplicate of a call in progress blocked on the owner's row lock, holding
// a pool connection, up to the lock timeout. It learns of the owner from
// one lookup (the key's advisory lock is held), in one round trip, and
// gives its connection back at once; no backend waits on a lock. A
// replay of a completed call is one round trip too.
func TestJoinedDuplicateCostsOneRoundTripAndHoldsNoConnection(t *testing.T) {
	admin, schema := migrated(t)
	dsn := pgtest.DSN(t)
	owner, _ := joinedStore(t, dsn, schema, nil)
	var rt *pgtest.RoundTrips
	const lockTimeout = 30 * time.Second // a wait on the owner's row lock would last it
	dup, dupPool := joinedStore(t, dsn, schema, func(c *pgxpool.Config) {
		c.MaxConns = 1
		c.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		rt = pgtest.CountRoundTrips(c)
	}, pgstore.WithLockTimeout(lockTimeout))
	ctx := context.Background()
	for i := range 3 { // warm-up: the connection made, the statements prepared
		cl, txn, err := dup.ClaimTx(ctx, rk("warm-"+strconv.Itoa(i)), fp, time.Minute)
		if err != nil || cl.State != idempotency.Owned {
			t.Fatal(cl.State, err)
		}
		if err := txn.Commit(ctx, ok(), time.Hour); err != nil {
			t.Fatal(err)
		}
		if _, _, err := dup.ClaimTx(ctx, rk("warm-"+strconv.Itoa(i)), fp, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	cl, txn, err := owner.ClaimTx(ctx, rk("k"), fp, time.Minute)
	if err != nil || cl.State != idempotency.Owned {
		t.Fatalf("owner's ClaimTx() = %v, %v", cl.State, err)
	}
	before := rt.N()
	start := time.Now()
	cl, _, err = dup.ClaimTx(ctx, rk("k"), fp, time.Minute)
	took := time.Since(start)
	if err != nil || cl.State != idempotency.InProgress {
		t.Fatalf("duplicate's ClaimTx() = %v, %v, want InProgress", cl.State, err)
	}
	if n := rt.N() - before; n != 1 {
		t.Errorf("a duplicate of a call in progress = %d round trips, want 1", n)
	}
	if took > lockTimeout/3 {
		t.Errorf("a duplicate of a call in progress took %v, want at once, not a wait for the owner (lock timeout %v)", took, lockTimeout)
	}
	if n := dupPool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("connections the duplicate's pool holds after its answer = %d, want 0", n)
	}
	var waits int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").Scan(&waits); err != nil || waits != 0 {
		t.Errorf("backends waiting on a lock = %d, %v; want none", waits, err)
	}
	if err := txn.Commit(ctx, ok(), time.Hour); err != nil {
		t.Fatal(err)
	}
	before = rt.N()
	if cl, _, err := dup.ClaimTx(ctx, rk("k"), fp, time.Minute); err != nil || cl.State != idempotency.Completed {
		t.Fatalf("duplicate after the commit = %v, %v, want Completed", cl.State, err)
	}
	if n := rt.N() - before; n != 1 {
		t.Errorf("a replay = %d round trips, want 1", n)
	}
}

// TestJoinedLockOnTheTableIsNotInProgress (finding 8): any lock wait on
// the table (here an operator's LOCK TABLE) read as "a call with this key
// is in progress", ABORTED. A claim that waits past the lock timeout for a
// lock that is not a call's fails, and the interceptor answers
// UNAVAILABLE with its retry hint, within about the lock timeout.
func TestJoinedLockOnTheTableIsNotInProgress(t *testing.T) {
	admin, schema := migrated(t)
	const lockTimeout = 200 * time.Millisecond
	j, _ := joinedStore(t, pgtest.DSN(t), schema, nil, pgstore.WithLockTimeout(lockTimeout))
	ctx := context.Background()
	lock, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, "LOCK TABLE "+pgtest.Ident(schema)+".resilience_idempotency IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	e := &echoFunc{fn: func(context.Context, *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		return &echov1.EchoResponse{}, nil
	}}
	c := serve(t, e, server.Idempotency{Store: j})
	start := time.Now()
	_, err = call(t, c, "locked", "m")
	if took := time.Since(start); took > 10*lockTimeout {
		t.Errorf("a claim against a locked table took %v, want about the lock timeout (%v)", took, lockTimeout)
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("a claim against a locked table = %v, want UNAVAILABLE (not ABORTED in progress)", err)
	}
	if e.calls.Load() != 0 {
		t.Errorf("the handler ran")
	}
}

// TestJoinedClaimPastTheBoundWaitsForASlotHoldingNoConnection: a claim
// past WithJoinedTxLimit waits for a slot, holding no pool connection,
// and runs when one is given back (a burst of fast calls queues rather than
// being refused: 293 of 320 calls RESOURCE_EXHAUSTED on pgxpool's default
// pool before); past the lock timeout it is refused with a retry hint.
func TestJoinedClaimPastTheBoundWaitsForASlotHoldingNoConnection(t *testing.T) {
	_, schema := migrated(t)
	const lockTimeout = 500 * time.Millisecond
	j, pool := joinedStore(t, pgtest.DSN(t), schema, func(c *pgxpool.Config) { c.MaxConns = 4 },
		pgstore.WithLockTimeout(lockTimeout)) // pgxpool's least default: 2 joined transactions per scope
	entered := make(chan struct{}, 3)
	gates := make(chan chan struct{}, 3)
	e := &echoFunc{fn: func(context.Context, *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		gate := make(chan struct{})
		gates <- gate
		entered <- struct{}{}
		<-gate
		return &echov1.EchoResponse{}, nil
	}}
	c := serve(t, e, server.Idempotency{Store: j})
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := range 2 {
		wg.Go(func() { _, err := call(t, c, "slow"+strconv.Itoa(i), "m"); errs <- err })
	}
	<-entered
	<-entered
	wg.Go(func() { _, err := call(t, c, "third", "m"); errs <- err })
	// The third waits for a slot; its connection is not held meanwhile.
	for deadline := time.Now().Add(5 * time.Second); pool.Stat().AcquiredConns() != 2 || len(entered) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("pool holds %d connections, %d handlers entered; want the 2 slow calls' only", pool.Stat().AcquiredConns(), 2+len(entered))
		}
		time.Sleep(5 * time.Millisecond) // observing the pool
	}
	close(<-gates) // a slot is given back: the third runs
	<-entered
	close(<-gates)
	close(<-gates)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("call = %v, want every call answered", err)
		}
	}
	// Past the lock timeout, with the slots held, a claim is refused.
	for i := range 2 {
		wg.Go(func() { _, _ = call(t, c, "hold"+strconv.Itoa(i), "m") })
	}
	<-entered
	<-entered
	start := time.Now()
	_, err := call(t, c, "refused", "m")
	if status.Code(err) != codes.ResourceExhausted || time.Since(start) < lockTimeout/2 {
		t.Errorf("claim past the bound with the slots held = %v after %v, want RESOURCE_EXHAUSTED after about %v",
			err, time.Since(start), lockTimeout)
	}
	close(<-gates)
	close(<-gates)
	wg.Wait()
}

// TestInTxServesEveryCallWithOneCodePath (finding 9): a handler written
// once with InTx writes in the call's joined transaction when the call is
// keyed (the write commits with the record; an error undoes it), and in a
// transaction of its own otherwise (committed on success, rolled back on
// error): a call without a key, and a call a store that failed open ran
// without one.
func TestInTxServesEveryCallWithOneCodePath(t *testing.T) {
	b := newBank(t)
	dsn := pgtest.DSN(t)
	j, pool := joinedStore(t, dsn, b.schema, nil)
	down, _ := joinedStore(t, pgtest.ClosedDSN(t), b.schema, nil)
	handler := &echoFunc{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		err := pgstore.InTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
			if err := b.charge(ctx, tx, req.Message, "charge"); err != nil {
				return err
			}
			if req.Message == "fail-keyless" {
				return errors.New("fails after its write")
			}
			return nil
		})
		if err != nil {
			return nil, status.Error(codes.FailedPrecondition, err.Error())
		}
		_, joined := pgstore.Tx(ctx)
		return &echov1.EchoResponse{Message: strconv.FormatBool(joined)}, nil
	}}
	keyed := serve(t, handler, server.Idempotency{Store: j})
	failOpen := serve(t, handler, server.Idempotency{Store: down, FailOpen: true})
	tests := []struct {
		name    string
		do      func() (*echov1.EchoResponse, error)
		joined  string
		charges int
	}{
		{"Keyed", func() (*echov1.EchoResponse, error) { return call(t, keyed, "keyed", "keyed") }, "true", 1},
		{"KeyedReplay", func() (*echov1.EchoResponse, error) { return call(t, keyed, "keyed", "keyed") }, "true", 1},
		{"Keyless", func() (*echov1.EchoResponse, error) {
			return keyed.Echo(context.Background(), &echov1.EchoRequest{Message: "keyless"})
		}, "false", 1},
		{"FailOpen", func() (*echov1.EchoResponse, error) { return call(t, failOpen, "open", "fail-open") }, "false", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := tt.do()
			if err != nil || resp.GetMessage() != tt.joined {
				t.Fatalf("call = %v, %v; want joined=%s", resp, err, tt.joined)
			}
		})
	}
	for key, want := range map[string]int{"keyed": 1, "keyless": 1, "fail-open": 1} {
		if n := b.rows(t, key, "charge"); n != want {
			t.Errorf("charges of %s = %d, want %d", key, n, want)
		}
	}
	if _, err := keyed.Echo(context.Background(), &echov1.EchoRequest{Message: "fail-keyless"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("keyless call whose fn fails = %v", err)
	}
	if n := b.rows(t, "fail-keyless", "charge"); n != 0 {
		t.Errorf("charges of a keyless call whose fn failed = %d, want 0 (InTx rolled back)", n)
	}
}
