package interceptor

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
)

func TestIdempotencyRedisRoundTripsFirstTwoReplayOne(t *testing.T) {
	client := redistest.Client(t, redistest.Addr(t))
	hook := redistest.CountRoundTrips(client)
	store, err := redisstore.New(client, redisstore.WithKeyPrefix(redistest.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	e := &idemEcho{}
	cc := idemStart(t, e, WithIdempotencyStore(store))
	ctx := idemCtx(t)
	idemDo(ctx, cc, "warm-up", "m") // the first use of each script loads it
	count := func(key string) int64 {
		before := hook.N()
		if r := idemDo(ctx, cc, key, "m"); r.err != nil {
			t.Fatal(r.err)
		}
		return hook.N() - before
	}
	first, replay := count("k"), count("k")
	if first != 2 || replay != 1 {
		t.Errorf("Redis round trips: first execution %d, replay %d; want 2 and 1", first, replay)
	}
	wantCalls(t, e, 2)
	t.Logf("Redis round trips: first execution %d, replay %d", first, replay)
}

func TestIdempotencyRedisStoppedMidway(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		srv := redistest.Start(t)
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: time.Second})
		t.Cleanup(func() { _ = client.Close() })
		store, err := redisstore.New(client)
		if err != nil {
			t.Fatal(err)
		}
		e := &idemEcho{}
		cc := idemStart(t, e, WithIdempotencyStore(store), WithIdempotencyFailOpen(failOpen), WithServerLogger(new(idemLog).logger()))
		ctx := idemCtx(t)
		if r := idemDo(ctx, cc, "k1", "m"); r.err != nil {
			t.Fatalf("failOpen=%v: call with Redis up: %v", failOpen, r.err)
		}
		srv.Stop()
		r := idemDo(ctx, cc, "k2", "m")
		if failOpen {
			if r.err != nil {
				t.Errorf("failOpen=true: call with Redis stopped: %v, want the handler's reply", r.err)
			}
			wantCalls(t, e, 2)
			continue
		}
		wantCode(t, "failOpen=false: call with Redis stopped", r.err, codes.Unavailable, "store unavailable")
		wantCalls(t, e, 1)
	}
}
