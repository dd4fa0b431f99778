package server

import (
	"context"
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
	cc := idemStart(t, e, Idempotency{Store: store})
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
		cc := idemStart(t, e, Idempotency{Store: store, FailOpen: failOpen}, WithLogger(new(idemLog).logger()))
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

// TestIdempotencyRedisClaimWithLostReplyDoesNotBlockRetries pins item 10 of
// issue 9 end to end: a keyed call whose Claim took the key in Redis but
// whose reply came after the caller's 50 ms deadline must not block the
// caller's retries for the lease (5 s here, 30 s by default). The caller
// retries as the client did, 50 ms per attempt, and the key must be
// free well within a second: at once when the release reaches Redis (the
// retry may go to another replica), within the release's own timeout
// (500 ms) when it does not (the retry reaches the same replica, whose
// Store reclaims with its token).
func TestIdempotencyRedisClaimWithLostReplyDoesNotBlockRetries(t *testing.T) {
	const lease, attempt, bound = 5 * time.Second, 50 * time.Millisecond, time.Second
	addr := redistest.Addr(t)
	tests := []struct {
		name    string
		then    []redistest.Fault // after the claim's lost reply
		retryOn string            // "same" or "other" replica
	}{
		{"release reaches Redis, retry on another replica", nil, "other"},
		{"release lost too, retry on the same replica", []redistest.Fault{redistest.Drop}, "same"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := redistest.Prefix(t)
			store := func(c *redis.Client) *redisstore.Store {
				s, err := redisstore.New(c, redisstore.WithKeyPrefix(prefix))
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			clientA := redistest.Client(t, addr)
			faults := redistest.InjectFaults(clientA)
			e := &idemEcho{}
			logger := WithLogger(new(idemLog).logger())
			ccA := idemStart(t, e, Idempotency{Store: store(clientA), Lease: lease}, logger)
			ccB := idemStart(t, e, Idempotency{Store: store(redistest.Client(t, addr)), Lease: lease}, logger)
			ctx := idemCtx(t)
			if r := idemDo(ctx, ccA, "warm-up", "m"); r.err != nil { // loads the scripts
				t.Fatal(r.err)
			}
			faults.Next(append([]redistest.Fault{redistest.LoseReply}, tt.then...)...)
			first, cancel := context.WithTimeout(ctx, attempt)
			wantCode(t, "call whose claim reply is lost", idemDo(first, ccA, "k", "m").err, codes.DeadlineExceeded, "")
			cancel()
			cc := ccA
			if tt.retryOn == "other" {
				cc = ccB
			}
			start := time.Now()
			retries := 0
			for {
				retries++
				actx, cancel := context.WithTimeout(ctx, attempt)
				r := idemDo(actx, cc, "k", "m")
				cancel()
				if r.err == nil {
					break
				}
				wantCode(t, "retry", r.err, codes.DeadlineExceeded, "")
				if time.Since(start) > lease+time.Second {
					t.Fatalf("retries failed for %v, past the %v lease", time.Since(start), lease)
				}
			}
			blocked := time.Since(start)
			t.Logf("retries blocked for %v (%d attempts of %v; lease %v)", blocked, retries, attempt, lease)
			if blocked > bound {
				t.Errorf("retries blocked for %v (%d attempts), want under %v", blocked, retries, bound)
			}
			if got, want := faults.Injected(), int64(1+len(tt.then)); got != want {
				t.Errorf("faults injected = %d, want %d (the claim's lost reply, then %v)", got, want, tt.then)
			}
			wantCalls(t, e, 2) // the warm-up and the retry that ran
		})
	}
}
