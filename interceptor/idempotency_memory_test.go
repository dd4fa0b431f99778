package interceptor

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// heapInUse returns the bytes of live heap objects after two collections
// (the second empties the sync.Pools' victim caches).
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestIdempotencyWaitersDropTheirRequestCopy pins finding 9 of issue 14:
// each duplicate waiting for the first call kept its marshalled request (a
// copy made to fingerprint it), so 800 waiters with 256 KiB requests held
// 201 MB on top of the requests themselves. A waiter now drops the copy
// before it waits: it holds its decoded request (grpc's, which it needs if
// it leads a later flight) and little else.
func TestIdempotencyWaitersDropTheirRequestCopy(t *testing.T) {
	const (
		waiters = 200
		payload = 256 << 10
	)
	synctest.Test(t, func(t *testing.T) {
		store, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		gate := make(chan struct{})
		e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
			if req.Message == "big" {
				<-gate
			}
			return &echov1.EchoResponse{Message: req.Message}, nil
		}}
		cc := idemStart(t, e, WithIdempotencyStore(store))
		ctx := idemCtx(t)
		if r := idemDo(ctx, cc, "", "warm up"); r.err != nil {
			t.Fatal(r.err)
		}
		base := heapInUse()
		var wg sync.WaitGroup
		for range waiters + 1 {
			wg.Go(func() {
				req := &echov1.EchoRequest{Message: "big", Payload: make([]byte, payload)}
				_ = idemPayload(ctx, cc, "one-key", req)
			})
		}
		synctest.Wait() // the first runs, the others wait for it
		held := heapInUse() - base
		close(gate)
		wg.Wait()
		wantCalls(t, e, 2) // the warm-up and the first
		perWaiter := float64(held) / (waiters + 1)
		t.Logf("%d waiters with %d KiB requests: %.0f KiB of heap each (%d MiB in all)", waiters, payload>>10, perWaiter/1024, held>>20)
		// Each waiting call holds its decoded request on the server (the
		// client's is garbage once sent); a marshalled copy would double it.
		if limit := 1.5 * payload; perWaiter > limit {
			t.Errorf("heap per waiting call = %.0f KiB, want at most %.0f KiB (its request once, not twice)", perWaiter/1024, limit/1024)
		}
	})
}

// idemPayload calls Echo with req and the key.
func idemPayload(ctx context.Context, cc *grpc.ClientConn, key string, req *echov1.EchoRequest) error {
	ctx = metadata.AppendToOutgoingContext(ctx, "idempotency-key", key)
	return cc.Invoke(ctx, idemEchoMethod, req, new(echov1.EchoResponse))
}
