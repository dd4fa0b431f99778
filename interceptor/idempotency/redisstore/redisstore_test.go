package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testMaxRecord = 4096

func TestConformance(t *testing.T) {
	proxy := redistest.StartProxy(t, redistest.Addr(t))
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		// A client with go-redis's defaults (a 5 s read timeout, the
		// context's deadline ignored for socket I/O) behind a proxy that
		// can stop forwarding: the store's calls must still end with their
		// contexts.
		h := conformanceHarness(redistest.Client(t, proxy.Addr))(t)
		h.Stall = func(testing.TB) func() {
			proxy.Stall()
			return proxy.Resume
		}
		return h
	})
}

// conformanceHarness returns the storetest harness of a store over client
// (a plain or a cluster client): a store per test under a prefix of its
// own, with Advance moving that prefix's keys.
func conformanceHarness(client redis.UniversalClient) func(t *testing.T) storetest.Harness {
	return func(t *testing.T) storetest.Harness {
		prefix := redistest.Prefix(t)
		s, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix), redisstore.WithMaxRecordBytes(testMaxRecord))
		if err != nil {
			t.Fatalf("New() error = %v", err)
		}
		q, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix), redisstore.WithScopeQuota(4, 0),
			redisstore.WithScopePartitions(1))
		if err != nil {
			t.Fatalf("New() error = %v", err)
		}
		return storetest.Harness{
			QuotaStore:   q,
			QuotaEntries: 4,
			Store:        s,
			Advance: func(t testing.TB, d time.Duration) {
				if err := redistest.Advance(context.Background(), client, prefix, d); err != nil {
					t.Fatalf("Advance(%v) error = %v", d, err)
				}
			},
			MaxRecordBytes: testMaxRecord,
		}
	}
}

func TestRoundTripsFirstExecutionTwoReplayOne(t *testing.T) {
	client := redistest.Client(t, redistest.Addr(t))
	hook := redistest.CountRoundTrips(client)
	s, err := redisstore.New(client, redisstore.WithKeyPrefix(redistest.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fp := []byte("fingerprint")
	run := func(k string) (int64, int64) {
		key := idempotency.RecordKey{Scope: "s", FullMethod: "/p.S/M", Key: k}
		before := hook.N()
		c, err := s.Claim(ctx, key, fp, time.Minute)
		if err != nil || c.State != idempotency.Owned {
			t.Fatalf("Claim() = %v, %v, want Owned", c.State, err)
		}
		if err := s.Complete(ctx, key, c.Token, &idempotency.Record{Fingerprint: fp, ReplyType: "x.Y", Reply: []byte("r")}, time.Hour); err != nil {
			t.Fatalf("Complete() error = %v", err)
		}
		first := hook.N() - before
		before = hook.N()
		if c, err := s.Claim(ctx, key, fp, time.Minute); err != nil || c.State != idempotency.Completed {
			t.Fatalf("replay Claim() = %v, %v, want Completed", c.State, err)
		}
		return first, hook.N() - before
	}
	run("warm-up") // loads the scripts into the server's cache
	first, replay := run("k")
	if first != 2 || replay != 1 {
		t.Errorf("round trips: first execution %d, replay %d; want 2 and 1", first, replay)
	}
	t.Logf("round trips: first execution %d, replay %d", first, replay)
}

func TestOutageReturnsError(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redistest.ClosedAddr(t), MaxRetries: -1, DialTimeout: time.Second})
	defer client.Close()
	s, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = s.Claim(ctx, idempotency.RecordKey{Key: "k"}, []byte("fp"), time.Second)
	if err == nil {
		t.Fatal("Claim() against a closed port error = nil, want an error")
	}
	if errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Claim() error = %v, want a connection error", err)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := redisstore.New(nil); err == nil {
		t.Error("New(nil) error = nil, want an error")
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := redisstore.New(c, redisstore.WithMaxRecordBytes(0)); err == nil {
		t.Error("New(WithMaxRecordBytes(0)) error = nil, want an error")
	}
}

// replicas returns two Stores on one Redis under one prefix, as two replicas
// of a server would have, and the fault hook on the first's client.
func replicas(t *testing.T) (first, second *redisstore.Store, faults *redistest.Faults) {
	t.Helper()
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	c1, c2 := redistest.Client(t, addr), redistest.Client(t, addr)
	faults = redistest.InjectFaults(c1)
	first, err := redisstore.New(c1, redisstore.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	second, err = redisstore.New(c2, redisstore.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	// Load the scripts, so that the reply lost is the claim's own.
	warm := idempotency.RecordKey{Key: "warm-up"}
	c, err := first.Claim(context.Background(), warm, []byte("fp"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(context.Background(), warm, c.Token); err != nil {
		t.Fatal(err)
	}
	return first, second, faults
}

// claimLost makes a Claim of k by s whose reply is lost: Redis runs the
// script, the caller's 50 ms deadline passes first. The faults after the
// first apply to the commands that follow the claim.
func claimLost(t *testing.T, s *redisstore.Store, faults *redistest.Faults, k idempotency.RecordKey, then ...redistest.Fault) {
	t.Helper()
	faults.Next(append([]redistest.Fault{redistest.LoseReply}, then...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if c, err := s.Claim(ctx, k, []byte("fp"), time.Minute); err == nil {
		t.Fatalf("Claim() with its reply lost = %v, nil; want an error", c.State)
	}
	if got, want := faults.Injected(), int64(1+len(then)); got != want {
		t.Fatalf("faults injected = %d, want %d", got, want)
	}
}

// TestClaimWithLostReplyIsReleased pins item 10 of issue 9: a Claim whose
// script took the key but whose reply was lost releases the key before it
// returns its error, so another replica can claim it at once instead of
// after the lease.
func TestClaimWithLostReplyIsReleased(t *testing.T) {
	first, second, faults := replicas(t)
	k := idempotency.RecordKey{Scope: "s", FullMethod: "/p.S/M", Key: "lost"}
	claimLost(t, first, faults, k)
	c, err := second.Claim(context.Background(), k, []byte("fp"), time.Minute)
	if err != nil || c.State != idempotency.Owned {
		t.Fatalf("other replica's Claim() = %v (retry after %v), %v; want Owned", c.State, c.RetryAfter, err)
	}
}

// TestClaimRetryReclaimsWithOwnTokenWhenReleaseLost pins item 10 of issue 9
// when the release is lost too (it never reaches Redis): the same Store's next Claim of the key, for
// the same request, claims with the lost claim's token, which the script
// recognises, so it owns the key at once. Another replica still finds it in
// progress: the token makes one owner, not two.
func TestClaimRetryReclaimsWithOwnTokenWhenReleaseLost(t *testing.T) {
	first, second, faults := replicas(t)
	k := idempotency.RecordKey{Scope: "s", FullMethod: "/p.S/M", Key: "lost"}
	claimLost(t, first, faults, k, redistest.Drop) // the release never reaches Redis
	ctx := context.Background()
	if c, err := second.Claim(ctx, k, []byte("fp"), time.Minute); err != nil || c.State != idempotency.InProgress {
		t.Fatalf("other replica's Claim() = %v, %v; want InProgress", c.State, err)
	}
	if c, err := first.Claim(ctx, k, []byte("other request"), time.Minute); err != nil || c.State != idempotency.Mismatch {
		t.Fatalf("same Store, other request: Claim() = %v, %v; want Mismatch", c.State, err)
	}
	c, err := first.Claim(ctx, k, []byte("fp"), time.Minute)
	if err != nil || c.State != idempotency.Owned {
		t.Fatalf("same Store's retry: Claim() = %v (retry after %v), %v; want Owned", c.State, c.RetryAfter, err)
	}
	if again, err := first.Claim(ctx, k, []byte("fp"), time.Minute); err != nil || again.State != idempotency.InProgress {
		t.Fatalf("same Store, once more: Claim() = %v, %v; want InProgress (the token is used once)", again.State, err)
	}
	rec := &idempotency.Record{Fingerprint: []byte("fp"), ReplyType: "x.Y", Reply: []byte("r")}
	if err := first.Complete(ctx, k, c.Token, rec, time.Hour); err != nil {
		t.Fatalf("Complete() with the reclaimed token error = %v", err)
	}
	if c, err := second.Claim(ctx, k, []byte("fp"), time.Minute); err != nil || c.State != idempotency.Completed {
		t.Fatalf("other replica's Claim() after Complete = %v, %v; want Completed", c.State, err)
	}
}
