package server

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestIdempotencyOwnerCutOffFromRedisIsCancelledBeforeTheDuplicateRuns
// pins finding 2 of issue 33 with a real redis-server: replica A reaches
// Redis through a TCP proxy that stops forwarding (a partition: its
// commands go out, no reply comes back), replica B reaches it directly,
// and the lease is 1.5 s. A's client is go-redis with its defaults, which
// ignore the context's deadline for socket I/O (ContextTimeoutEnabled off,
// a read timeout of seconds). The handler's cutoff at nine tenths of the
// lease was checked only after Renew returned, so A's renewal hung for
// the client's read timeout while its handler's context stayed live, and B
// claimed the expired key at +1.5 s and ran it: two executions at once
// (the handler's context Err was nil when B's started). Now the cutoff is
// the server's own timer, whatever the store does: A's handler context
// ends at +1.35 s, before B can claim.
func TestIdempotencyOwnerCutOffFromRedisIsCancelledBeforeTheDuplicateRuns(t *testing.T) {
	addr := redistest.Addr(t)
	proxy := redistest.StartProxy(t, addr)
	prefix := redistest.Prefix(t)
	store := func(addr string) *redisstore.Store {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1}) // go-redis's defaults otherwise
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.New(c, redisstore.WithKeyPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	const lease = 1500 * time.Millisecond
	var (
		mu      sync.Mutex
		first   context.Context // A's handler's
		atB     error           // first.Err() when B's handler started
		running int             // handlers running now
		most    int             // the most that ran at once
	)
	started := make(chan struct{}, 1)
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		mu.Lock()
		running++
		most = max(most, running)
		if first != nil {
			atB = first.Err()
			running--
			mu.Unlock()
			return &echov1.EchoResponse{Message: "second"}, nil
		}
		first = ctx
		mu.Unlock()
		started <- struct{}{}
		defer func() {
			mu.Lock()
			running--
			mu.Unlock()
		}()
		select {
		case <-ctx.Done(): // a handler that stops when told
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-time.After(4 * lease):
			return &echov1.EchoResponse{Message: "first"}, nil
		}
	}}
	idem := Idempotency{Lease: lease, PollInitial: 10 * time.Millisecond, PollMax: 20 * time.Millisecond}
	idemA, idemB := idem, idem
	idemA.Store, idemB.Store = store(proxy.Addr), store(addr)
	ccA := idemStart(t, e, idemA)
	ccB := idemStart(t, e, idemB)

	var wg sync.WaitGroup
	defer wg.Wait()
	defer proxy.Resume() // before the cleanups close the clients: A's store calls then end
	var a idemCall
	wg.Go(func() { a = idemDo(context.Background(), ccA, "k", "m") })
	<-started
	proxy.Stall()
	b := idemDo(idemCtx(t), ccB, "k", "m") // polls until A's lease has ended in Redis, then runs
	if b.err != nil {
		t.Fatalf("duplicate on replica B: %v", b.err)
	}
	mu.Lock()
	gotAtB, gotMost := atB, most
	mu.Unlock()
	if gotAtB == nil || gotMost != 1 {
		t.Errorf("when B's handler started, A's handler context Err = %v and %d handlers ran at once; "+
			"want A's cancelled (its lease was not renewed) and 1", gotAtB, gotMost)
	}
	proxy.Resume()
	wg.Wait()
	wantCode(t, "A's call, its handler cancelled", a.err, codes.Canceled, "")
}
