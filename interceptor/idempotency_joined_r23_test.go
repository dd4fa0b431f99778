package interceptor

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
	cc := idemStart(t, e, WithIdempotencyStore(p.store(t, nil)))
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
			cc := idemStart(t, e, WithIdempotencyStore(p.store(t, nil)), WithIdempotencyLease(time.Second))
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
