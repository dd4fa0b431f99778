package interceptor

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
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
