package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestIdempotencyJoinedTxConnAfterTheHandlerReturnedDoesNotPanic: a
// goroutine the handler started reads Tx(ctx).Conn() after the handler
// returned (its transaction committed, its pool connection released):
// Conn is nil then, never a dereference of the released pool connection
// (which panicked the goroutine, and so the process, and raced with the
// pool's release).
func TestIdempotencyJoinedTxConnAfterTheHandlerReturnedDoesNotPanic(t *testing.T) {
	p := newPgJoined(t)
	returned, got := make(chan struct{}), make(chan string, 1)
	e := p.chargeEcho(func(_ context.Context, tx pgx.Tx) error {
		go func() {
			defer func() {
				if r := recover(); r != nil {
					got <- fmt.Sprint("panic: ", r)
				}
			}()
			<-returned
			c := tx.Conn()
			got <- fmt.Sprint("conn nil: ", c == nil)
		}()
		return nil
	})
	cc := idemStart(t, e, Idempotency{Store: p.store(t, nil)})
	r := idemDo(idemCtx(t), cc, "k", "m")
	close(returned)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if g := <-got; g != "conn nil: true" {
		t.Errorf("Tx(ctx).Conn() after the handler returned: %s; want nil", g)
	}
}

// TestIdempotencyJoinedHandlerEndingItsTransactionBySQLNeverRunsTwice: a
// handler that ends the joined transaction with SQL of its own (tx.Exec
// "COMMIT" or "ROLLBACK": ErrHandlerCommit guards only the Commit and
// Rollback methods) commits its writes outside the record; whatever it
// returns then, a retry of the key must not run it again.
func TestIdempotencyJoinedHandlerEndingItsTransactionBySQLNeverRunsTwice(t *testing.T) {
	tests := []struct {
		name string
		then func(ctx context.Context, tx pgx.Tx) error
	}{
		{"CommitThenUnavailable", func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "COMMIT"); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "downstream down")
		}},
		{"CommitThenStoredError", func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "COMMIT"); err != nil {
				return err
			}
			return status.Error(codes.FailedPrecondition, "insufficient funds")
		}},
	}
	p := newPgJoined(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := p.chargeEcho(tt.then)
			cc := idemStart(t, e, Idempotency{Store: p.store(t, nil), Lease: time.Second})
			ctx := idemCtx(t)
			key := "sql-" + tt.name
			first := idemDo(ctx, cc, key, "m")
			name, _ := strconv.Unquote(p.schema)
			pgAdvance(t, p.admin, name, 2*time.Second) // past the claim's lease
			retry := idemDo(ctx, cc, key, "m")
			t.Logf("first: %v; retry: %v", first.err, retry.err)
			wantCalls(t, e, 1)
			if n := p.rows(t, key); n != 1 {
				t.Errorf("charges = %d, want 1: the handler ran %d times", n, e.calls.Load())
			}
		})
	}
}

// TestIdempotencyJoinedSlowKeysDoNotStarveOtherCallsOfConnections: each
// keyed call in joined mode holds a pool connection while its handler
// runs. One caller's slow keyed calls (here two, on a pool of two) must
// not take every connection: the one past its scope's share is refused at
// once (RESOURCE_EXHAUSTED with a RetryInfo), another caller's call is
// answered or refused at once, and a replay of a completed key (one
// lookup) is answered, none left waiting for a connection until its
// deadline.
func TestIdempotencyJoinedSlowKeysDoNotStarveOtherCallsOfConnections(t *testing.T) {
	p := newPgJoined(t)
	gate, entered := make(chan struct{}), make(chan struct{}, 2)
	e := p.chargeEcho(func(ctx context.Context, _ pgx.Tx) error {
		if md, _ := metadata.FromIncomingContext(ctx); md.Get("x-slow") != nil {
			entered <- struct{}{}
			<-gate
		}
		return nil
	})
	tenant := func(ctx context.Context) (string, error) {
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("x-tenant")) > 0 {
			return md.Get("x-tenant")[0], nil
		}
		return "a", nil
	}
	store := p.store(t, func(c *pgxpool.Config) { c.MaxConns = 2 })
	cc := idemStart(t, e, Idempotency{Store: store, Scope: tenant})
	ctx := idemCtx(t)
	if r := idemDo(ctx, cc, "done", "m"); r.err != nil {
		t.Fatal(r.err)
	}
	var wg sync.WaitGroup
	refused := make(chan error, 2)
	for i := range 2 {
		wg.Go(func() {
			if r := idemDo(ctx, cc, "slow"+strconv.Itoa(i), "m", "x-slow", "1"); r.err != nil {
				refused <- r.err
			}
		})
	}
	defer wg.Wait()
	defer close(gate)
	for range 2 { // one slow call enters; the other is refused, at once
		select {
		case <-entered:
		case err := <-refused:
			wantCode(t, "a slow call past its scope's share of the pool", err, codes.ResourceExhausted, "")
			if d := retryDelay(err); d <= 0 {
				t.Errorf("refusal %v carries no RetryInfo; want one, which clients honour as a pushback", err)
			}
		}
	}
	for _, c := range []struct{ key, tenant string }{{"other", "b"}, {"done", "a"}} {
		short, cancel := context.WithTimeout(ctx, time.Second)
		r := idemDo(short, cc, c.key, "m", "x-tenant", c.tenant)
		cancel()
		switch code := status.Code(r.err); {
		case code == codes.DeadlineExceeded:
			t.Errorf("call with key %q while slow keys hold the pool: %v; want an answer or a prompt refusal", c.key, r.err)
		case c.key == "done" && r.err != nil:
			t.Errorf("replay of a completed key while slow keys hold the pool: %v; want the reply", r.err)
		}
	}
}

// retryDelay returns the RetryInfo delay of err's status, or 0.
func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// TestIdempotencyJoinedClaimIsBoundedWhenTheDatabaseDoesNotAnswer: a
// database that does not answer (here a migration's ACCESS EXCLUSIVE lock
// on the table; a network partition alike) must not hold a keyed call
// without a deadline for ever, with its goroutine and pool connection: the
// claim is bounded by the store's lock wait plus a margin, and the call
// gets UNAVAILABLE with the retry hint.
func TestIdempotencyJoinedClaimIsBoundedWhenTheDatabaseDoesNotAnswer(t *testing.T) {
	p := newPgJoined(t)
	e := p.chargeEcho(nil)
	cc := idemStart(t, e, Idempotency{Store: p.store(t, nil, pgstore.WithLockTimeout(100*time.Millisecond))})
	bg := context.Background()
	lock, err := p.admin.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(bg) }()
	if _, err := lock.Exec(bg, "LOCK TABLE "+p.schema+".resilience_idempotency IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(idemCtx(t), 20*time.Second) // stands for no deadline
	defer cancel()
	start := time.Now()
	r := idemDo(ctx, cc, "k", "m")
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the claim waited %v for a database that does not answer; want it bounded by the lock wait and a margin", took)
	}
	wantCode(t, "claim against a locked table", r.err, codes.Unavailable, "")
	wantCalls(t, e, 0)
}

// TestIdempotencyJoinedNestedPhaseIsRefused: a Phase inside another
// Phase's fn would commit the outer phase's writes so far with the inner
// recovery point; the outer phase failing then, its retry ran it again and
// wrote twice. A nested Phase is refused with ErrNestedPhase, and the
// outer phase's write never commits twice.
func TestIdempotencyJoinedNestedPhaseIsRefused(t *testing.T) {
	p := newPgJoined(t)
	var runs atomic.Int32
	var innerErr error
	e := &idemEcho{fn: func(ctx context.Context, _ *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		run := runs.Add(1)
		_, err := pgstore.Phase(ctx, "outer", func(ctx context.Context, _ pgx.Tx) ([]byte, error) {
			if _, err := p.charge(ctx, 10); err != nil {
				return nil, err
			}
			if _, err := pgstore.Phase(ctx, "inner", func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err != nil {
				if run == 1 {
					innerErr = err
				}
				return nil, err
			}
			if run == 1 {
				return nil, errors.New("the outer phase fails after the inner one")
			}
			return nil, nil
		})
		if err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		return &echov1.EchoResponse{Message: "ok"}, nil
	}}
	cc := idemStart(t, e, Idempotency{Store: p.store(t, nil)})
	ctx := idemCtx(t)
	idemDo(ctx, cc, "k", "m")
	idemDo(ctx, cc, "k", "m")
	if n := p.rows(t, "k"); n > 1 {
		t.Errorf("charges = %d after a failed outer phase and its retry; want at most 1", n)
	}
	if !errors.Is(innerErr, pgstore.ErrNestedPhase) {
		t.Errorf("nested Phase = %v, want ErrNestedPhase", innerErr)
	}
}

// TestIdempotencyJoinedStragglerGoroutineDoesNotRaceTheCommit: a goroutine
// the handler started goes on using Tx after the handler returned. Its
// statements must end with pgx.ErrTxClosed, never run on the connection at
// the same time as the interceptor's commit (a data race inside pgx, and
// a statement that may land in the next call's transaction once the
// connection is back in the pool).
func TestIdempotencyJoinedStragglerGoroutineDoesNotRaceTheCommit(t *testing.T) {
	p := newPgJoined(t)
	stopped := make(chan error, 1)
	e := p.chargeEcho(func(_ context.Context, tx pgx.Tx) error {
		go func() {
			for {
				if _, err := tx.Exec(context.Background(), "SELECT 1"); err != nil {
					stopped <- err
					return
				}
			}
		}()
		return nil
	})
	cc := idemStart(t, e, Idempotency{Store: p.store(t, nil)})
	for i := range 20 {
		if r := idemDo(idemCtx(t), cc, "k"+strconv.Itoa(i), "m"); r.err != nil {
			t.Errorf("call %d: %v", i, r.err)
		}
		if err := <-stopped; !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("the straggler's statement after the handler returned: %v, want pgx.ErrTxClosed", err)
		}
	}
}

// TestIdempotencyJoinedLeakedRowsDoNotHoldTheEndForever: the end of a
// joined transaction waits for the handler's statements under way (see
// TestIdempotencyJoinedStragglerGoroutineDoesNotRaceTheCommit), but a
// statement that never ends (rows never closed, a row never scanned) must
// not hold it: past the lock timeout the store closes the connection,
// which rolls the transaction back (no charge), logs it, and the call gets
// UNAVAILABLE; its retry runs the call once (the abandoned transaction
// holds no slot of WithJoinedTxLimit).
func TestIdempotencyJoinedLeakedRowsDoNotHoldTheEndForever(t *testing.T) {
	tests := []struct {
		name string
		leak func(ctx context.Context, tx pgx.Tx) error
	}{
		{"RowsNotClosed", func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Query(ctx, "SELECT generate_series(1, 10)")
			return err
		}},
		{"RowNotScanned", func(ctx context.Context, tx pgx.Tx) error {
			tx.QueryRow(ctx, "SELECT 1")
			return nil
		}},
	}
	p := newPgJoined(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := p.chargeEcho(func(ctx context.Context, tx pgx.Tx) error {
				if md, _ := metadata.FromIncomingContext(ctx); md.Get("x-leak") != nil {
					return tt.leak(ctx, tx)
				}
				return nil
			})
			var log idemLog
			const lockTimeout = 200 * time.Millisecond
			// A pool of two: one joined transaction at once (WithJoinedTxLimit's
			// default), so the retry also shows the abandoned one gave its slot back.
			store := p.store(t, func(c *pgxpool.Config) { c.MaxConns = 2 }, pgstore.WithLockTimeout(lockTimeout),
				pgstore.WithLogger(log.logger()))
			cc := idemStart(t, e, Idempotency{Store: store})
			ctx := idemCtx(t)
			key := "leak-" + tt.name
			start := time.Now()
			first := idemDo(ctx, cc, key, "m", "x-leak", "1")
			if took := time.Since(start); took > lockTimeout+5*time.Second {
				t.Errorf("the call took %v with a statement left open; want about the lock timeout (%v)", took, lockTimeout)
			}
			wantCode(t, "call whose handler left a statement open", first.err, codes.Unavailable, "")
			if !strings.Contains(log.String(), "connection was closed") {
				t.Errorf("log = %q, want the abandoned connection logged", log.String())
			}
			if n := p.rows(t, key); n != 0 {
				t.Errorf("charges after an abandoned transaction = %d, want 0 (rolled back)", n)
			}
			var retry idemCall
			for range 50 { // the session's end reaches PostgreSQL soon after; until then the key is in progress
				if retry = idemDo(ctx, cc, key, "m"); status.Code(retry.err) != codes.Aborted {
					break
				}
			}
			if retry.err != nil {
				t.Fatalf("retry: %v", retry.err)
			}
			wantCalls(t, e, 2)
			if n := p.rows(t, key); n != 1 {
				t.Errorf("charges = %d, want 1", n)
			}
		})
	}
}

// TestIdempotencyJoinedStragglerGoroutineDoesNotRaceAPhaseCommit: a
// goroutine of the handler that sends statements while the handler commits
// a Phase must not run them on the connection at the same time as the
// phase's commit and next BEGIN: they wait for it, then go on in the next
// transaction, and end with pgx.ErrTxClosed once the handler returned.
func TestIdempotencyJoinedStragglerGoroutineDoesNotRaceAPhaseCommit(t *testing.T) {
	p := newPgJoined(t)
	stopped := make(chan error, 1)
	e := p.chargeEcho(func(ctx context.Context, tx pgx.Tx) error {
		go func() { // after the handler's own statements: it orders those
			for {
				if _, err := tx.Exec(context.Background(), "SELECT 1"); err != nil {
					stopped <- err
					return
				}
			}
		}()
		for _, name := range []string{"a", "b"} {
			if _, err := pgstore.Phase(ctx, name, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err != nil {
				return err
			}
		}
		return nil
	})
	cc := idemStart(t, e, Idempotency{Store: p.store(t, nil)})
	for i := range 10 {
		key := "phase" + strconv.Itoa(i)
		if r := idemDo(idemCtx(t), cc, key, "m"); r.err != nil {
			t.Errorf("call %d: %v", i, r.err)
		}
		if err := <-stopped; !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("the straggler's statement after the handler returned: %v, want pgx.ErrTxClosed", err)
		}
		if n := p.rows(t, key); n != 1 {
			t.Errorf("charges for %s = %d, want 1", key, n)
		}
	}
}
