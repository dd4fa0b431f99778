package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
)

// TestMinReplicasWaitsForTheReplica: with WithMinReplicas(1), a first
// execution costs two more round trips (WAIT after the claim and after the
// record), a replay none, and the replica holds the record when Complete
// returns.
func TestMinReplicasWaitsForTheReplica(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	client := redistest.Client(t, primary.Addr)
	hook := redistest.CountRoundTrips(client)
	prefix := redistest.Prefix(t)
	s, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix), redisstore.WithMinReplicas(1, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fp := []byte("fp")
	run := func(k string) (first, replay int64) {
		key := idempotency.RecordKey{Scope: "s", FullMethod: "/p.S/M", Key: k}
		before := hook.N()
		c, err := s.Claim(ctx, key, fp, time.Minute)
		if err != nil || c.State != idempotency.Owned {
			t.Fatalf("Claim() = %v, %v; want Owned", c.State, err)
		}
		if err := s.Complete(ctx, key, c.Token, &idempotency.Record{Fingerprint: fp, ReplyType: "x.Y", Reply: []byte("r")}, time.Hour); err != nil {
			t.Fatalf("Complete() error = %v", err)
		}
		first, before = hook.N()-before, hook.N()
		if c, err := s.Claim(ctx, key, fp, time.Minute); err != nil || c.State != idempotency.Completed {
			t.Fatalf("replay Claim() = %v, %v; want Completed", c.State, err)
		}
		return first, hook.N() - before
	}
	run("warm-up")
	if first, replay := run("k"); first != 4 || replay != 1 {
		t.Errorf("round trips with WithMinReplicas(1): first execution %d, replay %d; want 4 and 1", first, replay)
	}
	keys, err := redistest.Client(t, replica.Addr).Keys(ctx, prefix+"*").Result()
	if keys = recordKeys(keys); err != nil || len(keys) != 2 {
		t.Errorf("replica holds %d records (%v), want 2", len(keys), err)
	}
}

// TestMinReplicasRefusesUnreplicatedWrites: with the replica cut off, a
// Claim that took the key releases it and fails with ErrNotReplicated, and
// a Complete fails with ErrNotReplicated though the primary stored the
// record.
func TestMinReplicasRefusesUnreplicatedWrites(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	host, port, _ := net.SplitHostPort(redistest.ClosedAddr(t))
	ctx := context.Background()
	if err := redistest.Client(t, replica.Addr).ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	prefix := redistest.Prefix(t)
	client := redistest.Client(t, primary.Addr)
	waiting, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix), redisstore.WithMinReplicas(1, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	key := idempotency.RecordKey{Scope: "s", FullMethod: "/p.S/M", Key: "k"}
	fp := []byte("fp")
	if c, err := waiting.Claim(ctx, key, fp, time.Minute); !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Claim() with no replica = %v, %v; want ErrNotReplicated", c.State, err)
	}
	c, err := plain.Claim(ctx, key, fp, time.Minute)
	if err != nil || c.State != idempotency.Owned {
		t.Fatalf("Claim() after the refused one = %v, %v; want Owned (the refused claim was released)", c.State, err)
	}
	rec := &idempotency.Record{Fingerprint: fp, ReplyType: "x.Y", Reply: []byte("r")}
	if err := waiting.Complete(ctx, key, c.Token, rec, time.Hour); !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Complete() with no replica error = %v, want ErrNotReplicated", err)
	}
	if c, err := plain.Claim(ctx, key, fp, time.Minute); err != nil || c.State != idempotency.Completed {
		t.Fatalf("Claim() after the unreplicated Complete = %v, %v; want Completed (the primary has it)", c.State, err)
	}
}

func TestNewRejectsBadMinReplicas(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer client.Close()
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	tests := []struct {
		client  redis.UniversalClient
		n       int
		timeout time.Duration
		wantErr bool
	}{
		{client, 1, time.Second, false},
		{client, 0, time.Second, true},
		{client, 1, 0, true},
		{client, -1, time.Second, true},
		{ring, 1, time.Second, true},
	}
	for _, tt := range tests {
		_, err := redisstore.New(tt.client, redisstore.WithMinReplicas(tt.n, tt.timeout))
		if (err != nil) != tt.wantErr {
			t.Errorf("New(%T, WithMinReplicas(%d, %v)) error = %v, want error %v", tt.client, tt.n, tt.timeout, err, tt.wantErr)
		}
	}
}

// minReplicasOnCluster checks WithMinReplicas on a cluster without
// replicas: the WAIT runs on each key's primary (no redirection error), no
// replica acknowledges, and each refused claim is released.
func minReplicasOnCluster(t *testing.T, client *redis.ClusterClient) {
	prefix := redistest.Prefix(t)
	waiting, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix), redisstore.WithMinReplicas(1, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 12 {
		key := idempotency.RecordKey{Key: fmt.Sprint("min-replicas-", i)}
		if c, err := waiting.Claim(ctx, key, []byte("fp"), time.Minute); !errors.Is(err, redisstore.ErrNotReplicated) {
			t.Fatalf("Claim(%q) on a cluster without replicas = %v, %v; want ErrNotReplicated", key.Key, c.State, err)
		}
		if c, err := plain.Claim(ctx, key, []byte("fp"), time.Minute); err != nil || c.State != idempotency.Owned {
			t.Fatalf("Claim(%q) after the refused one = %v, %v; want Owned", key.Key, c.State, err)
		}
	}
}

// TestMinReplicasAbandonedClaimWhoseWaitFailsFreesItsKey: with
// WithMinReplicas, a Claim whose caller left before Redis answered (its
// context ended: the Claim returned, see the Store contract) and whose
// script then took the key, its WAIT failing (no replica acknowledged),
// releases the key when the reply comes, as it does when the WAIT
// succeeds. Before, the script's reply was dropped with the WAIT's error,
// so nothing released the key: the Claim's own release at its context's
// end had reached Redis first (on another connection) and found the key
// free, and the key was held for the whole lease, every other request for
// it refused. Here the Claim's connection goes through a proxy that
// stalls, the release's straight to Redis, so the release comes first.
func TestMinReplicasAbandonedClaimWhoseWaitFailsFreesItsKey(t *testing.T) {
	addr := redistest.Addr(t)
	client, proxy, goDirect := warmProxiedClient(t, addr)
	prefix := redistest.Prefix(t)
	// No replica: every WAIT fails.
	s, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix), redisstore.WithMinReplicas(1, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	warmUp := idempotency.RecordKey{Scope: "s", FullMethod: "/p.S/M", Key: "warm-up"}
	if _, err := s.Claim(ctx, warmUp, []byte("fp"), time.Minute); !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Claim() without a replica = %v, want ErrNotReplicated", err)
	}
	goDirect() // connections from now on go straight to Redis
	key := idempotency.RecordKey{Scope: "s", FullMethod: "/p.S/M", Key: "k"}

	abandonStalledClaim(t, s, proxy, key, []byte("fp-a"))
	proxy.Resume() // the Claim's script runs now, takes the key, and its WAIT fails

	// A store without WAIT, for the other request's claims.
	other, err := redisstore.New(redistest.Client(t, addr), redisstore.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		c, err := other.Claim(ctx, key, []byte("fp-b"), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if c.State == idempotency.Owned {
			return
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("Claim() of another request %v after Redis answered again = %v, want Owned: "+
				"the abandoned Claim's key is held for its lease (a minute)", took, c.State)
		}
		time.Sleep(20 * time.Millisecond) // the abandoned Claim's reply and release come on their own
	}
}

// TestAbandonedClaimsLateReplyKeepsARetrysKey: a Claim abandoned at its
// context's end while Redis was partitioned away; its own release, sent
// straight to Redis, found the key free and remembered its token for a
// retry of the same request on this replica. The retry takes the token and
// owns the key; then the partition heals, the abandoned script runs and
// answers that it took the key (the same token: it is the retry's own),
// and its late reply must not release it: released, another request
// owned the key while the retry's handler ran, a second execution.
func TestAbandonedClaimsLateReplyKeepsARetrysKey(t *testing.T) {
	addr := redistest.Addr(t)
	client, proxy, goDirect := warmProxiedClient(t, addr)
	prefix := redistest.Prefix(t)
	s, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	warmUp := idempotency.RecordKey{Scope: "s", FullMethod: "/p.S/M", Key: "warm-up"}
	if c, err := s.Claim(ctx, warmUp, []byte("fp"), time.Minute); err != nil || c.State != idempotency.Owned {
		t.Fatalf("warm-up Claim() = %v, %v; want Owned", c.State, err)
	}
	goDirect() // connections from now on go straight to Redis
	key := idempotency.RecordKey{Scope: "s", FullMethod: "/p.S/M", Key: "k"}

	abandonStalledClaim(t, s, proxy, key, []byte("fp-a"))
	retry, err := s.Claim(ctx, key, []byte("fp-a"), time.Minute) // straight to Redis, with the remembered token
	if err != nil || retry.State != idempotency.Owned {
		t.Fatalf("the retry's Claim() = %v, %v; want Owned", retry.State, err)
	}
	proxy.Resume() // the abandoned script runs now, with the retry's token, and its reply comes back

	other, err := redisstore.New(redistest.Client(t, addr), redisstore.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	// The late reply comes within milliseconds of the resume; a second
	// of another request's claims, each refused while the retry holds
	// the key, covers it.
	for start := time.Now(); time.Since(start) < time.Second; time.Sleep(20 * time.Millisecond) {
		c, err := other.Claim(ctx, key, []byte("fp-b"), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if c.State != idempotency.Mismatch {
			t.Fatalf("another request's Claim() %v after the resume = %v, want Mismatch: the abandoned Claim's late reply released the key the retry owns",
				time.Since(start), c.State)
		}
	}
	if err := s.Complete(ctx, key, retry.Token, &idempotency.Record{}, time.Minute); err != nil {
		t.Fatalf("the retry's Complete() = %v", err)
	}
}

// abandonStalledClaim stalls proxy and claims key on s with a context
// that ends 200 ms later, while Redis has not answered: the Claim must
// return with the context's error, its script still on its way.
func abandonStalledClaim(t *testing.T, s *redisstore.Store, proxy *redistest.Proxy, key idempotency.RecordKey, fp []byte) {
	t.Helper()
	proxy.Stall()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := s.Claim(ctx, key, fp, time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Claim() with Redis stalled = %v, want an error wrapping context.DeadlineExceeded", err)
	}
}

// warmProxiedClient returns a client of the Redis at addr whose
// connections go through proxy until goDirect is called, and straight to
// Redis after. Its pool keeps one idle connection: after a warm-up call,
// the pool's one connection is through the proxy, where the test can
// stall it while the connections it dials later (a release's) are not.
func warmProxiedClient(t *testing.T, addr string) (client *redis.Client, proxy *redistest.Proxy, goDirect func()) {
	proxy = redistest.StartProxy(t, addr)
	var viaProxy atomic.Bool
	viaProxy.Store(true)
	var d net.Dialer
	client = redis.NewClient(&redis.Options{
		Addr: addr, MaxRetries: -1,
		MaxIdleConns: 1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if viaProxy.Load() {
				addr = proxy.Addr
			}
			return d.DialContext(ctx, network, addr)
		},
	})
	t.Cleanup(func() { _ = client.Close() })
	return client, proxy, func() { viaProxy.Store(false) }
}
