package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
)

// TestOpenRefusesAnEvictingPolicyByDefault pins item 1 of issue 21: Open
// with default options logged a warning for a server on volatile-ttl, and
// a live claim was then evicted under memory pressure (see
// TestEvictingRedisDropsLiveClaims): the same key ran twice. Now Open
// refuses such a server, naming the policy and the fix, and only
// WithAllowEvictingPolicy accepts it (with the warning).
func TestOpenRefusesAnEvictingPolicyByDefault(t *testing.T) {
	srv := redistest.StartWith(t, "--maxmemory", "8mb", "--maxmemory-policy", "volatile-ttl")
	client := redistest.Client(t, srv.Addr)
	s, err := redisstore.Open(context.Background(), client, redisstore.WithLogger(slog.New(slog.DiscardHandler)))
	if !errors.Is(err, redisstore.ErrEvictingPolicy) || s != nil {
		t.Fatalf("Open() on volatile-ttl = %v, %v; want ErrEvictingPolicy", s, err)
	}
	for _, want := range []string{"volatile-ttl", "CONFIG SET maxmemory-policy noeviction", "WithAllowEvictingPolicy"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open() error = %q, want it to name %q", err, want)
		}
	}
}

// TestOpenChecksTheEvictionPolicy: Open refuses a Redis whose
// maxmemory-policy may evict keys (WithAllowEvictingPolicy accepts it, with
// a warning); a server whose CONFIG command is disabled is tolerated, with
// a warning.
func TestOpenChecksTheEvictionPolicy(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		allow    bool
		wantErr  bool
		wantWarn string
	}{
		{"noeviction", nil, false, false, ""},
		{"volatile-ttl, allowed", []string{"--maxmemory", "8mb", "--maxmemory-policy", "volatile-ttl"}, true, false, "maxmemory-policy=volatile-ttl"},
		{"volatile-ttl", []string{"--maxmemory", "8mb", "--maxmemory-policy", "volatile-ttl"}, false, true, ""},
		{"allkeys-lru", []string{"--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru"}, false, true, ""},
		{"CONFIG disabled", []string{"--rename-command", "CONFIG", `""`}, false, false, "cannot read maxmemory-policy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.StartWith(t, tt.args...)
			client := redistest.Client(t, srv.Addr)
			var log bytes.Buffer
			opts := []redisstore.Option{redisstore.WithLogger(slog.New(slog.NewTextHandler(&log, nil)))}
			if tt.allow {
				opts = append(opts, redisstore.WithAllowEvictingPolicy())
			}
			s, err := redisstore.Open(context.Background(), client, opts...)
			if tt.wantErr {
				if !errors.Is(err, redisstore.ErrEvictingPolicy) || s != nil {
					t.Fatalf("Open() = %v, %v, want ErrEvictingPolicy", s, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open() error = %v", err)
			}
			if tt.wantWarn == "" && log.Len() > 0 || !strings.Contains(log.String(), tt.wantWarn) {
				t.Errorf("log = %q, want %q", log.String(), tt.wantWarn)
			}
		})
	}
	t.Run("CONFIG not permitted", func(t *testing.T) { // an ACL user without +config: NOPERM
		srv := redistest.Start(t)
		ctx := context.Background()
		if err := redistest.Client(t, srv.Addr).Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "-config").Err(); err != nil {
			t.Fatalf("ACL SETUSER: %v", err)
		}
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "app", Password: "pw"})
		t.Cleanup(func() { _ = c.Close() })
		var log bytes.Buffer
		if _, err := redisstore.Open(ctx, c, redisstore.WithLogger(slog.New(slog.NewTextHandler(&log, nil)))); err != nil {
			t.Fatalf("Open() as a user without CONFIG error = %v, want a warning only", err)
		}
		if !strings.Contains(log.String(), "cannot read maxmemory-policy") {
			t.Errorf("log = %q, want %q", log.String(), "cannot read maxmemory-policy")
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: redistest.ClosedAddr(t), MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		if _, err := redisstore.Open(context.Background(), c); err == nil {
			t.Error("Open() of an unreachable server succeeded, want an error")
		}
	})
}

// TestEvictingRedisDropsLiveClaims shows, with a real redis-server started
// with maxmemory 8 MB and volatile-ttl, what finding 3 of issue 14 is: under
// memory pressure Redis evicts a live claim (it has the shortest TTL), and a
// duplicate claims the key while its owner still runs. Open refuses such a
// server unless WithAllowEvictingPolicy accepts it.
func TestEvictingRedisDropsLiveClaims(t *testing.T) {
	srv := redistest.StartWith(t, "--maxmemory", "8mb", "--maxmemory-policy", "volatile-ttl")
	client := redistest.Client(t, srv.Addr)
	ctx := context.Background()
	s, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	k := idempotency.RecordKey{Scope: "a", FullMethod: "/shop.Orders/Create", Key: "order-1"}
	if c, err := s.Claim(ctx, k, []byte("fp"), time.Minute); err != nil || c.State != idempotency.Owned {
		t.Fatalf("Claim() = %v, %v", c.State, err)
	}
	// Other data with longer TTLs fills the memory.
	value := strings.Repeat("x", 64<<10)
	for i := range 256 {
		if err := client.Set(ctx, "filler:"+strconv.Itoa(i), value, time.Hour).Err(); err != nil {
			break // OOM once nothing more can be evicted
		}
	}
	dup, err := s.Claim(ctx, k, []byte("fp"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if dup.State != idempotency.Owned {
		t.Fatalf("duplicate's Claim = %v: the live claim survived, want it evicted (what Open warns about)", dup.State)
	}
	t.Logf("under volatile-ttl with maxmemory 8mb, a duplicate's Claim found the live claim evicted: %v", dup.State)
	if _, err := redisstore.Open(ctx, client); !errors.Is(err, redisstore.ErrEvictingPolicy) {
		t.Errorf("Open() error = %v, want ErrEvictingPolicy", err)
	}
}

// TestRedisRestartKeepsWhatPersistenceKept pins the persistence rows of the
// package documentation (finding 3 of issue 14) against a real redis-server
// killed and restarted: without persistence a completed record is gone and
// a duplicate would run its call again; with appendonly and appendfsync
// always it is replayed.
func TestRedisRestartKeepsWhatPersistenceKept(t *testing.T) {
	tests := []struct {
		name string
		args func(t *testing.T) []string
		want idempotency.State
	}{
		{"no persistence", func(*testing.T) []string { return nil }, idempotency.Owned},
		{"appendonly, fsync always", func(t *testing.T) []string {
			return []string{"--dir", t.TempDir(), "--appendonly", "yes", "--appendfsync", "always"}
		}, idempotency.Completed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.StartWith(t, tt.args(t)...)
			client := redistest.Client(t, srv.Addr)
			ctx := context.Background()
			s, err := redisstore.New(client)
			if err != nil {
				t.Fatal(err)
			}
			k := idempotency.RecordKey{Scope: "a", FullMethod: "/shop.Orders/Create", Key: "order-1"}
			c, err := s.Claim(ctx, k, []byte("fp"), time.Minute)
			if err != nil || c.State != idempotency.Owned {
				t.Fatalf("Claim() = %v, %v", c.State, err)
			}
			if err := s.Complete(ctx, k, c.Token, &idempotency.Record{Fingerprint: []byte("fp"), ReplyType: "x.Y"}, time.Hour); err != nil {
				t.Fatal(err)
			}
			srv.Restart(t)
			var dup idempotency.Claim
			for range 50 { // the client reconnects
				if dup, err = s.Claim(ctx, k, []byte("fp"), time.Minute); err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil || dup.State != tt.want {
				t.Errorf("Claim() after a restart = %v, %v, want %v", dup.State, err, tt.want)
			}
		})
	}
}
