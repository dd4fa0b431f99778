package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
)

// TestAbandonedRoundTripsAreBoundedByThePool pins what a Redis that stops
// answering costs a server whose calls keep coming: every call returns at
// its context's end (the Store contract), and the round trips it leaves
// behind, each on a goroutine of the store's, are at most the client's
// pool (the others gave up waiting for a connection with their context),
// even with go-redis never timing out a read (ReadTimeout -1); once Redis
// answers again, every one of them ends: nothing held.
func TestAbandonedRoundTripsAreBoundedByThePool(t *testing.T) {
	const poolSize, calls = 4, 64
	proxy := redistest.StartProxy(t, redistest.Addr(t))
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, PoolSize: poolSize, ReadTimeout: -1, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, redisstore.WithKeyPrefix(redistest.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := client.Ping(ctx).Err(); err != nil { // the pool's first connection, and the proxy's copiers
		t.Fatal(err)
	}
	settled := func(within time.Duration, ok func(n int) bool) int {
		n := runtime.NumGoroutine()
		for deadline := time.Now().Add(within); !ok(n) && time.Now().Before(deadline); n = runtime.NumGoroutine() {
			time.Sleep(10 * time.Millisecond) // goroutines of other packages' code end on their own
		}
		return n
	}
	base := runtime.NumGoroutine()

	proxy.Stall()
	defer proxy.Resume()
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			key := idempotency.RecordKey{Scope: "s", FullMethod: "/p.S/M", Key: fmt.Sprint("k", i)}
			start := time.Now()
			_, err := s.Claim(cctx, key, []byte("fp"), time.Minute)
			// 50 ms, then the detached release of a Claim whose outcome
			// is unknown, bounded by its 500 ms.
			if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took > 2*time.Second {
				t.Errorf("Claim() with Redis stalled = %v after %v; want an error wrapping context.DeadlineExceeded within 2s", err, took)
			}
		})
	}
	wg.Wait()
	// Left: at most poolSize round trips on their connections (a goroutine
	// each), and the proxy's two copiers per connection.
	bound := base + 3*poolSize
	if n := settled(2*time.Second, func(n int) bool { return n <= bound }); n > bound {
		t.Errorf("%d goroutines %v after %d Claims abandoned with Redis stalled, %d before: want at most %d (pool size %d)",
			n, 2*time.Second, calls, base, bound, poolSize)
	}
	proxy.Resume()
	// Redis answers the abandoned round trips: their goroutines end, and so
	// do the releases of the claims they took.
	if n := settled(5*time.Second, func(n int) bool { return n <= base+2*poolSize }); n > base+2*poolSize {
		t.Errorf("%d goroutines 5s after Redis answered again, %d before the stall: want the abandoned round trips ended", n, base)
	}
}
