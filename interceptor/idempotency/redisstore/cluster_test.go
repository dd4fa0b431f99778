package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/storetest"
)

// TestClusterConformance runs the store's conformance suite through a
// *redis.ClusterClient on a real cluster of 3 primaries. Each node is
// behind a proxy that can stop forwarding, and the client dials every node
// through its node's proxy (the seeds and the nodes CLUSTER SLOTS names):
// the store's calls must end with their contexts on a cluster client too,
// whose own retries (a command that timed out is sent again, up to
// MaxRedirects times, each waiting its read timeout) the store does not
// control.
func TestClusterConformance(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	proxies := make(map[string]*redistest.Proxy, len(cluster.Nodes))
	for _, n := range cluster.Nodes {
		proxies[n.Addr] = redistest.StartProxy(t, n.Addr)
	}
	var d net.Dialer
	client := cluster.Client(t, &redis.ClusterOptions{
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			p, ok := proxies[addr] // read-only once the client exists
			if !ok {
				return nil, fmt.Errorf("dialling %s: not a node of the test's cluster (%v), so not behind a proxy", addr, cluster.Addrs())
			}
			return d.DialContext(ctx, network, p.Addr)
		},
	})
	harness := conformanceHarness(client)
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		h := harness(t)
		h.Stall = func(testing.TB) func() {
			for _, p := range proxies {
				p.Stall()
			}
			return func() {
				for _, p := range proxies {
					p.Resume()
				}
			}
		}
		return h
	})
}

// TestClusterRecordsSpreadOverPrimaries checks that the records of one
// scope spread over the cluster (its 16 partitions, each a slot of its
// own, by default on a cluster client), and that each record is one key:
// n records make n keys, besides their partitions' accounting keys.
func TestClusterRecordsSpreadOverPrimaries(t *testing.T) {
	const n = 90
	cluster := redistest.StartCluster(t, 3)
	client := cluster.Client(t, nil)
	prefix := redistest.Prefix(t)
	s, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range n {
		k := idempotency.RecordKey{Scope: "s", FullMethod: "/p.S/M", Key: fmt.Sprint("k", i)}
		c, err := s.Claim(ctx, k, []byte("fp"), time.Minute)
		if err != nil || c.State != idempotency.Owned {
			t.Fatalf("Claim(%q) = %v, %v; want Owned", k.Key, c.State, err)
		}
		rec := &idempotency.Record{Fingerprint: []byte("fp"), ReplyType: "x.Y", Reply: []byte("r")}
		if err := s.Complete(ctx, k, c.Token, rec, time.Hour); err != nil {
			t.Fatalf("Complete(%q) error = %v", k.Key, err)
		}
	}
	total := 0
	for i := range cluster.Nodes {
		keys, err := cluster.Admin(i).Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		keys = recordKeys(keys)
		t.Logf("node %d holds %d records", i, len(keys))
		if len(keys) == 0 {
			t.Errorf("node %d holds no record of %d", i, n)
		}
		total += len(keys)
	}
	if total != n {
		t.Errorf("keys over all nodes = %d, want %d (one key per record)", total, n)
	}
	t.Run("WithMinReplicas", func(t *testing.T) { minReplicasOnCluster(t, client) })
}

// TestClusterOpenChecksEveryPrimary: Open on a cluster client reads the
// maxmemory-policy of every primary, so that one evicting node is found
// whichever node answers first, and names it.
func TestClusterOpenChecksEveryPrimary(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	ctx := context.Background()
	open := func(refuse bool) (*redisstore.Store, string, error) {
		var log bytes.Buffer
		opts := []redisstore.Option{redisstore.WithLogger(slog.New(slog.NewTextHandler(&log, nil)))}
		if !refuse {
			opts = append(opts, redisstore.WithAllowEvictingPolicy())
		}
		s, err := redisstore.Open(ctx, cluster.Client(t, nil), opts...)
		return s, log.String(), err
	}
	if s, log, err := open(true); err != nil || s == nil || log != "" {
		t.Fatalf("Open() on a noeviction cluster = %v, %v, log %q; want a store, no warning", s, err, log)
	}
	evicting := cluster.Nodes[2].Addr
	if err := cluster.Admin(2).ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	s, _, err := open(true)
	if !errors.Is(err, redisstore.ErrEvictingPolicy) || s != nil || !strings.Contains(err.Error(), evicting) {
		t.Fatalf("Open() with node %s on allkeys-lru = %v, %v; want ErrEvictingPolicy naming the node", evicting, s, err)
	}
	s, log, err := open(false)
	if err != nil || s == nil {
		t.Fatalf("Open(WithAllowEvictingPolicy()) = %v, %v; want a store and a warning", s, err)
	}
	if want := "node=" + evicting; !strings.Contains(log, want) || !strings.Contains(log, "maxmemory-policy=allkeys-lru") ||
		strings.Count(log, "level=WARN") != 1 {
		t.Errorf("log = %q, want one warning with %s and maxmemory-policy=allkeys-lru", log, want)
	}
}
