package redisquota

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	"github.com/grpc-resilience/resilience/interceptor/wire"
)

func clusterClient(t *testing.T, c *redistest.Cluster) *redis.ClusterClient {
	return c.Client(t, &redis.ClusterOptions{ContextTimeoutEnabled: true, DialTimeout: 100 * time.Millisecond})
}

// TestClusterKeysSpreadOverPrimaries: each key of a limit is a hash tag,
// so a limit's keys spread over the primaries, and leases work on each.
// The lease timeout is a minute: the test is about where keys land, and
// under CPU pressure (GOMAXPROCS=1 beside another package) a first round
// trip to a node took over the default 100ms, which answers from the
// fallback, as it should.
func TestClusterKeysSpreadOverPrimaries(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	prefix := redistest.Prefix(t)
	s := newStore(t, clusterClient(t, cluster), prefix, WithLeaseTimeout(time.Minute))
	l := newLimiter(t, s, "spread", Limit{Rate: 100, Burst: 5})
	ctx := context.Background()
	for i := range 60 {
		d, err := l.Allow(ctx, "tenant-"+strconv.Itoa(i), wire.Critical)
		if err != nil || !d.OK || d.Fallback {
			t.Fatalf("tenant %d's first call: %+v, %v; want admitted by a lease", i, d, err)
		}
	}
	for i := range cluster.Nodes {
		keys, err := cluster.Admin(i).Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("node %d holds %d keys", i, len(keys))
		if len(keys) == 0 {
			t.Errorf("node %d holds none of 60 keys", i)
		}
	}
}

// TestClusterSlotMigrating: a key's slot moves to another primary while
// replicas lease it: no call waits past the lease timeout, the admitted
// count stays within the burst and the rate (the script follows the ASK
// and MOVED redirections, atomic on whichever node holds the key), and the
// key lives on its new node after.
func TestClusterSlotMigrating(t *testing.T) {
	const rate, burst = 300, 10
	cluster := redistest.StartCluster(t, 3)
	prefix := redistest.Prefix(t)
	var lims []*Limiter
	for range 2 {
		lims = append(lims, newLimiter(t, newStore(t, clusterClient(t, cluster), prefix, WithLeaseTimeout(200*time.Millisecond)),
			"migrate", Limit{Rate: rate, Burst: burst}))
	}
	ctx := context.Background()
	rkey := lims[0].redisKey("tenant")
	slot, err := cluster.Admin(0).ClusterKeySlot(ctx, rkey).Result()
	if err != nil {
		t.Fatal(err)
	}
	from, err := cluster.Owner(ctx, int(slot))
	if err != nil {
		t.Fatal(err)
	}
	to := (from + 1) % len(cluster.Nodes)
	var admitted, fallback atomic.Int64
	var slowest atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for _, l := range lims {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				d, err := l.Allow(ctx, "tenant", wire.Critical)
				if err != nil {
					t.Error(err)
					return
				}
				if took := int64(time.Since(t0)); took > slowest.Load() {
					slowest.Store(took)
				}
				if d.OK {
					admitted.Add(1)
					if d.Fallback {
						fallback.Add(1)
					}
				}
			}
		})
	}
	waitAdmitted := func(n int64) { // polls the count the senders move
		deadline := time.Now().Add(10 * time.Second)
		for admitted.Load() < n && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	waitAdmitted(20) // leases under way before the migration
	err = cluster.MoveSlot(ctx, int(slot), to)
	if err == nil {
		waitAdmitted(admitted.Load() + 50) // and after it
	}
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	if owner, err := cluster.Owner(ctx, int(slot)); err != nil || owner != to {
		t.Fatalf("slot %d owned by node %d (%v), want %d", slot, owner, err, to)
	}
	if n, _ := cluster.Admin(to).Exists(ctx, rkey).Result(); n != 1 {
		t.Errorf("the key is not on its new node")
	}
	// No call waits for Redis past the lease timeout (200ms) and the
	// scheduling of a busy machine (up to 1s here): none waits for
	// go-redis's own timeouts or for the migration to end.
	if took := time.Duration(slowest.Load()); took > 200*time.Millisecond+time.Second {
		t.Errorf("a call took %v: past the lease timeout (200ms)", took)
	}
	// Decided by leases, the count is within the burst and the rate; a
	// fallback's local share (one replica seen: the whole rate each) may
	// add up to the rate for as long as it lasts.
	n := admitted.Load() - fallback.Load()
	if max := int64(burst + rate*elapsed.Seconds() + 1); n > max {
		t.Errorf("%d admitted by leases in %v: over the burst and the rate (%d)", n, elapsed, max)
	}
	t.Logf("%d admitted in %v (%d by the fallback), slowest call %v", admitted.Load(), elapsed, fallback.Load(), time.Duration(slowest.Load()))
}
