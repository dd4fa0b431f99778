package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
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
