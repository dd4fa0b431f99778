package interceptor

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestIdempotencyCommittedHandlerSeesNoCallerDeadlineWhenDetached pins
// finding 8 of issue 14: a handler that commits (charges a card), then
// notices the caller's deadline and returns DEADLINE_EXCEEDED, had its
// outcome released, so the caller's retry charged again. Detached
// (WithIdempotencyDetachedHandler), it finishes and its outcome is stored:
// one charge. The default keeps the documented trade-off: two.
func TestIdempotencyCommittedHandlerSeesNoCallerDeadlineWhenDetached(t *testing.T) {
	tests := []struct {
		name        string
		opts        []ServerOption
		wantCharges int64
	}{
		{"detached", []ServerOption{WithIdempotencyDetachedHandler(10 * time.Second)}, 1},
		{"default: on the caller's context", nil, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store, err := idempotency.NewMemoryStore()
				if err != nil {
					t.Fatal(err)
				}
				var charges atomic.Int64
				e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
					charges.Add(1)                     // committed
					time.Sleep(100 * time.Millisecond) // writing the receipt
					if err := ctx.Err(); err != nil {
						return nil, status.FromContextError(err).Err()
					}
					return &echov1.EchoResponse{Message: "charged"}, nil
				}}
				cc := idemStart(t, e, append([]ServerOption{WithIdempotencyStore(store)}, tt.opts...)...)
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				first := idemDo(ctx, cc, "charge-1", "10 EUR")
				cancel()
				wantCode(t, "first attempt", first.err, codes.DeadlineExceeded, "")
				time.Sleep(time.Second) // the first handler has returned
				if r := idemDo(idemCtx(t), cc, "charge-1", "10 EUR"); r.err != nil {
					t.Fatalf("retry: %v", r.err)
				}
				if got := charges.Load(); got != tt.wantCharges {
					t.Errorf("charged %d times, want %d", got, tt.wantCharges)
				}
			})
		})
	}
}

// TestIdempotencyDetachedHandlerBoundedByTheServersMaximum: a detached
// handler that never finishes is cancelled at the server's maximum; its
// DEADLINE_EXCEEDED is not stored.
func TestIdempotencyDetachedHandlerBoundedByTheServersMaximum(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		var ended atomic.Int64
		e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
			start := time.Now()
			<-ctx.Done()
			ended.Store(int64(time.Since(start)))
			return nil, status.FromContextError(ctx.Err()).Err()
		}}
		cc := idemStart(t, e, WithIdempotencyStore(store), WithIdempotencyDetachedHandler(2*time.Second))
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		wantCode(t, "stuck handler", idemDo(ctx, cc, "k", "m").err, codes.DeadlineExceeded, "")
		if got := time.Duration(ended.Load()); got != 2*time.Second {
			t.Errorf("handler ran %v, want the server's maximum, 2s", got)
		}
		if _, err := NewServer(WithIdempotencyDetachedHandler(-time.Second)); err == nil {
			t.Error("WithIdempotencyDetachedHandler(-1s) accepted, want an error")
		}
	})
}
