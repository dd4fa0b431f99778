package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
)

// TestIdempotencyRedisClusterMigrationAndRestart drives keyed calls, each
// key sent to two replicas, through the server interceptor with Redis
// stores on a real cluster of 3 primaries (appendonly yes, appendfsync
// always), and while they run moves the slots holding the first records
// from one primary to another (CLUSTER SETSLOT MIGRATING/IMPORTING and
// MIGRATE: the scripts follow ASK and MOVED redirections), then kills
// (SIGKILL) and restarts another primary. A call refused meanwhile gets
// UNAVAILABLE with the retry hint and is retried after it. Exactly once
// must hold for completed records: no execution of a key whose record was
// stored, and calls with every key after the faults replay. With
// -stress=D, the faults repeat (a migration, then a restart, each round
// between other nodes) for D while the calls go on.
func TestIdempotencyRedisClusterMigrationAndRestart(t *testing.T) {
	keys := 160 // keyed calls per worker pair
	if *stressFor > 0 {
		keys = 1 << 30 // until the faults stop
	}
	const (
		pairs       = 4   // of workers: one on each replica, with the same keys
		migrateAt   = 40  // calls answered before the slot migration
		restartAt   = 100 // calls answered before the primary restart
		maxAttempts = 100 // per call; each waits the retry hint after UNAVAILABLE
		movedSlots  = 4   // at most
	)
	cluster := redistest.StartCluster(t, 3, "--appendonly", "yes", "--appendfsync", "always")
	book, log, prefix := newIdemBook(), new(idemLog), redistest.Prefix(t)
	var ccs [2]*grpc.ClientConn
	for i := range ccs {
		client := cluster.Client(t, &redis.ClusterOptions{MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second,
			ReadTimeout: 2 * time.Second, MaxRedirects: 8})
		s, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		ccs[i] = idemStart(t, idemCountingEcho(book), Idempotency{
			Store: &idemLedger{Store: s, idemBook: book},
			Lease: 2 * time.Second,
		}, WithLogger(log.logger()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second+*stressFor)
	defer cancel()
	call := func(cc *grpc.ClientConn, key string) idemCall {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return idemDo(cctx, cc, key, key)
	}

	var (
		answered, unavailable atomic.Int64
		milestones            = map[int64]chan struct{}{migrateAt: make(chan struct{}), restartAt: make(chan struct{})}
		wg                    sync.WaitGroup
		errMu                 sync.Mutex
		errs                  []string
		stop                  = make(chan struct{}) // -stress: closed when the faults end
		last                  atomic.Int64          // the highest key index a worker started
	)
	for w := range 2 * pairs {
		wg.Go(func() {
			for i := w % pairs; i < keys; i += pairs {
				select {
				case <-stop:
					return
				default:
				}
				for l := last.Load(); int64(i) > l && !last.CompareAndSwap(l, int64(i)); l = last.Load() {
				}
				key := fmt.Sprint("k-", i)
				for attempt := 1; ; attempt++ {
					r := call(ccs[w/pairs], key)
					if r.err == nil {
						if ch, ok := milestones[answered.Add(1)]; ok {
							close(ch)
						}
						break
					}
					if err := wantRetryHint(r.err, r.trailer); status.Code(r.err) != codes.Unavailable || err != nil || attempt == maxAttempts {
						errMu.Lock()
						errs = append(errs, fmt.Sprintf("call %s, attempt %d: %v (hint: %v)", key, attempt, r.err, err))
						errMu.Unlock()
						return
					}
					unavailable.Add(1)
					select { // the client's wait: the retry hint
					case <-time.After(defaultPushback):
					case <-ctx.Done():
						return
					}
				}
			}
		})
	}

	<-milestones[migrateAt]
	moved := moveRecordSlots(t, cluster, prefix, 0, 1, movedSlots)
	<-milestones[restartAt]
	cluster.Nodes[2].Stop() // SIGKILL
	cluster.Nodes[2].StartAgain(t)
	cluster.WaitOK(t)
	rounds := 1
	for start := time.Now(); time.Since(start) < *stressFor; rounds++ {
		from := rounds % 3
		moved += moveRecordSlots(t, cluster, prefix, from, (from+1)%3, movedSlots)
		cluster.Nodes[(from+2)%3].Stop()
		cluster.Nodes[(from+2)%3].StartAgain(t)
		cluster.WaitOK(t)
	}
	if *stressFor > 0 {
		close(stop)
	}
	wg.Wait()
	keys = min(keys, int(last.Load())+1)
	if len(errs) > 0 {
		t.Fatalf("%d calls failed otherwise than UNAVAILABLE with the retry hint, or too often; first: %s", len(errs), errs[0])
	}
	execs := 0
	for i := range keys {
		execs += book.count(fmt.Sprint("k-", i))
	}
	t.Logf("cluster: %d rounds of faults, %d calls answered, %d UNAVAILABLE retried, %d slots moved, %d executions for %d keys, duplicates after completion %d",
		rounds, answered.Load(), unavailable.Load(), moved, execs, keys, book.duplicates())
	if d := book.duplicates(); d != 0 {
		t.Errorf("%d executions of keys whose record was stored, want 0", d)
	}
	if *stressFor == 0 && answered.Load() != int64(2*keys) {
		t.Errorf("calls answered = %d, want %d", answered.Load(), 2*keys)
	}
	// Every record is where the cluster routes it, after the migration and
	// the restart: calls with every key replay.
	for i := range keys {
		key := fmt.Sprint("k-", i)
		runs := book.count(key)
		if runs == 0 { // -stress: a key no worker reached before the stop
			continue
		}
		if r := call(ccs[i%2], key); r.err != nil {
			t.Fatalf("call %s after the faults: %v", key, r.err)
		}
		if got := book.count(key); got != runs {
			t.Errorf("call %s after the faults ran the handler (runs %d, want %d): its record is lost", key, got, runs)
		}
	}
}

// moveRecordSlots moves up to n slots that hold records under prefix on
// node from to node to, while calls run, and returns how many it moved.
func moveRecordSlots(t *testing.T, cluster *redistest.Cluster, prefix string, from, to, n int) int {
	t.Helper()
	ctx := context.Background()
	src := cluster.Admin(from)
	recs, err := src.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slots := map[int64]bool{}
	for _, k := range recs {
		if len(slots) == n {
			break
		}
		slot, err := src.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots[slot] = true
	}
	if len(slots) == 0 {
		t.Fatalf("node %d holds no record to move", from)
	}
	for slot := range slots {
		if err := cluster.MoveSlot(ctx, int(slot), to); err != nil {
			t.Fatalf("MoveSlot(%d) error = %v", slot, err)
		}
		if n, err := cluster.Admin(to).ClusterCountKeysInSlot(ctx, int(slot)).Result(); err != nil || n == 0 {
			t.Fatalf("after MoveSlot(%d): node %d holds %d keys of it, %v; want the migrated records", slot, to, n, err)
		}
	}
	return len(slots)
}
