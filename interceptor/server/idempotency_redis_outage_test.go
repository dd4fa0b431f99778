package server

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// idemLedger wraps a store and keeps the books of an outage test: the
// claims the store granted and the ones that failed, and the keys whose
// record the store took, by epoch (a Redis process, for a Redis without
// persistence whose records die with it).
type idemLedger struct {
	idempotency.Store
	owned, failed atomic.Int64
	*idemBook
}

// idemBook is the state the ledgers of several servers (replicas) share:
// which keys completed, and the handler's executions per key.
type idemBook struct {
	epoch atomic.Int64
	mu    sync.Mutex
	done  map[string]int64 // key -> epoch in which its record was stored; guarded by mu
	execs map[string]int   // key -> handler executions; guarded by mu
	// dups counts executions of a key whose record was stored in the
	// current epoch: what exactly-once forbids. Guarded by mu.
	dups int
}

func newIdemBook() *idemBook {
	return &idemBook{done: map[string]int64{}, execs: map[string]int{}}
}

// forget starts a new epoch: the records stored so far are gone (a Redis
// without persistence was killed).
func (b *idemBook) forget() { b.epoch.Add(1) }

// executed counts an execution of the handler for key.
func (b *idemBook) executed(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.execs[key]++
	if e, ok := b.done[key]; ok && e == b.epoch.Load() {
		b.dups++
	}
}

func (b *idemBook) count(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.execs[key]
}

func (b *idemBook) duplicates() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dups
}

func (l *idemLedger) Claim(ctx context.Context, k idempotency.RecordKey, fp []byte, lease time.Duration) (idempotency.Claim, error) {
	c, err := l.Store.Claim(ctx, k, fp, lease)
	switch {
	case err != nil:
		l.failed.Add(1)
	case c.State == idempotency.Owned:
		l.owned.Add(1)
	}
	return c, err
}

func (l *idemLedger) Complete(ctx context.Context, k idempotency.RecordKey, token string, rec *idempotency.Record, ttl time.Duration) error {
	epoch := l.epoch.Load() // before: a Complete that straddles a kill belongs to the old process
	err := l.Store.Complete(ctx, k, token, rec, ttl)
	if err == nil {
		l.mu.Lock()
		l.done[k.Key] = epoch
		l.mu.Unlock()
	}
	return err
}

// idemCountingEcho is an Echo handler that counts its executions per
// idempotency key in book.
func idemCountingEcho(book *idemBook) *idemEcho {
	return &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if k := md.Get("idempotency-key"); len(k) == 1 {
			book.executed(k[0])
		}
		return &echov1.EchoResponse{Message: req.Message}, nil
	}}
}

// idemRedisClient is a client for outage tests: no go-redis retries and a
// short dial timeout, so that an outage reaches the interceptor at once.
func idemRedisClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// wantRetryHint fails t unless err carries the fail-closed retry hint: a
// RetryInfo detail and a grpc-retry-pushback-ms trailer.
func wantRetryHint(err error, trailer metadata.MD) error {
	var hint time.Duration
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			hint = ri.GetRetryDelay().AsDuration()
		}
	}
	if hint != defaultPushback {
		return fmt.Errorf("RetryInfo hint = %v, want %v", hint, defaultPushback)
	}
	if got := trailer.Get("grpc-retry-pushback-ms"); len(got) != 1 || got[0] != "100" {
		return fmt.Errorf("grpc-retry-pushback-ms = %q, want [100]", got)
	}
	return nil
}

// TestIdempotencyRedisKilledDuringBurst kills the Redis of two replicas
// (SIGKILL) in the middle of a burst of keyed calls, each key sent to both
// replicas, and starts it again on the same port once every caller has
// seen the outage (fail closed) or a few calls have run without the store
// (fail open). The books must balance:
//
//   - fail closed: every failed call is UNAVAILABLE with the retry hint
//     (RetryInfo and grpc-retry-pushback-ms), one per failed Claim; the
//     handler ran once per granted claim and never for a key whose record
//     was stored (in the current Redis process, without persistence);
//   - fail open: no call fails; the handler ran once per granted claim plus
//     once per failed Claim, and each of those is one "fail open" log line.
//
// After the restart, calls with the keys that completed before the kill
// show what persistence keeps: with appendonly yes and appendfsync always
// they replay (the handler does not run); without persistence the records
// are gone, and each such key runs the handler once more, then replays.
func TestIdempotencyRedisKilledDuringBurst(t *testing.T) {
	tests := []struct {
		name     string
		aof      bool
		failOpen bool
	}{
		{"no persistence, fail closed", false, false},
		{"appendfsync always, fail closed", true, false},
		{"no persistence, fail open", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			testRedisKilledDuringBurst(t, tt.aof, tt.failOpen)
		})
	}
}

func testRedisKilledDuringBurst(t *testing.T, aof, failOpen bool) {
	const (
		pairs      = 4   // of workers: one on each replica, with the same keys
		before     = 20  // keys completed before the burst
		burst      = 120 // keys of the burst
		killAfter  = 30  // burst calls answered before the kill
		openProofs = 8   // fail open: calls run without the store before the restart
	)
	var args []string
	if aof {
		args = []string{"--appendonly", "yes", "--appendfsync", "always", "--dir", t.TempDir()}
	}
	srv := redistest.StartWith(t, args...)
	book, log, prefix := newIdemBook(), new(idemLog), redistest.Prefix(t)
	var ledgers [2]*idemLedger
	var ccs [2]*grpc.ClientConn
	for i := range ccs {
		s, err := redisstore.New(idemRedisClient(t, srv.Addr), redisstore.WithKeyPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		ledgers[i] = &idemLedger{Store: s, idemBook: book}
		ccs[i] = idemStart(t, idemCountingEcho(book), Idempotency{
			Store:    ledgers[i],
			FailOpen: failOpen,
			Lease:    time.Second,
		}, WithLogger(log.logger()))
	}
	ctx := idemCtx(t)
	call := func(cc *grpc.ClientConn, key string) idemCall {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return idemDo(cctx, cc, key, key)
	}

	// Before: keys that complete on a healthy Redis.
	for i := range before {
		if r := call(ccs[i%2], fmt.Sprint("before-", i)); r.err != nil {
			t.Fatalf("call before the burst: %v", r.err)
		}
	}

	// The burst. Fail closed, a worker that gets UNAVAILABLE waits for the
	// restart before it retries, so the restart comes once every worker
	// has seen the outage (or ended); fail open, it comes once openProofs
	// calls ran without the store.
	var (
		answered, unavailable atomic.Int64
		restarted             = make(chan struct{})          // closed after the restart
		atKill                = make(chan struct{})          // closed when killAfter calls are answered
		blocked               = make(chan struct{}, 2*pairs) // one per worker: when it first waits for the restart, or ends
		wg                    sync.WaitGroup
		errMu                 sync.Mutex
		errs                  []string
	)
	var atKillOnce sync.Once
	for w := range 2 * pairs {
		wg.Go(func() {
			signalled := false
			signal := func() {
				if !signalled {
					signalled = true
					blocked <- struct{}{}
				}
			}
			defer signal()
			for i := w % pairs; i < burst; i += pairs {
				key := fmt.Sprint("burst-", i)
				for attempt := 0; ; attempt++ {
					r := call(ccs[w/pairs], key)
					if r.err == nil {
						if answered.Add(1) == killAfter {
							atKillOnce.Do(func() { close(atKill) })
						}
						break
					}
					if err := wantRetryHint(r.err, r.trailer); status.Code(r.err) != codes.Unavailable || err != nil || attempt > 100 {
						errMu.Lock()
						errs = append(errs, fmt.Sprintf("call %s, attempt %d: %v (hint: %v)", key, attempt, r.err, err))
						errMu.Unlock()
						return
					}
					unavailable.Add(1)
					select {
					case <-restarted: // the client's wait: the retry hint
						time.Sleep(defaultPushback)
					default:
						signal()
						<-restarted
					}
				}
			}
		})
	}
	<-atKill
	srv.Stop() // SIGKILL
	if !aof {
		book.forget()
	}
	if failOpen {
		for end := time.Now().Add(10 * time.Second); ledgers[0].failed.Load()+ledgers[1].failed.Load() < openProofs && answered.Load() < 2*burst; time.Sleep(time.Millisecond) { // polling the observed count
			if time.Now().After(end) {
				t.Fatalf("with Redis down: %d failed store calls and %d answers after 10s, want %d failures or every call answered",
					ledgers[0].failed.Load()+ledgers[1].failed.Load(), answered.Load(), openProofs)
			}
		}
	} else {
		for range 2 * pairs { // every worker has seen the outage (or ended)
			<-blocked
		}
	}
	srv.StartAgain(t)
	restartedAt := time.Now()
	close(restarted)
	// Recovery: go-redis fails fast, without dialing, once a client's dials
	// failed PoolSize times, until a probe it dials once a second succeeds.
	for i, l := range ledgers {
		probe := idempotency.RecordKey{Key: fmt.Sprint("probe-", i)}
		for {
			c, err := l.Store.Claim(ctx, probe, []byte("fp"), time.Second)
			if err == nil {
				_ = l.Store.Release(ctx, probe, c.Token)
				break
			}
			if time.Since(restartedAt) > 5*time.Second {
				t.Fatalf("store %d still fails %v after the restart: %v", i, time.Since(restartedAt), err)
			}
			time.Sleep(10 * time.Millisecond) // polling interval
		}
	}
	recovered := time.Since(restartedAt)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d calls failed otherwise than UNAVAILABLE with the retry hint; first: %s", len(errs), errs[0])
	}

	owned := ledgers[0].owned.Load() + ledgers[1].owned.Load()
	failed := ledgers[0].failed.Load() + ledgers[1].failed.Load()
	execs := 0
	for i := range burst {
		execs += book.count(fmt.Sprint("burst-", i))
	}
	execs += before
	openLines := strings.Count(log.String(), "running the handler without idempotency (fail open)")
	t.Logf("burst: %d calls answered, %d UNAVAILABLE, claims granted %d, claims failed %d, executions %d, fail-open log lines %d, "+
		"duplicates after completion %d; both stores worked again %v after the restart",
		answered.Load(), unavailable.Load(), owned, failed, execs, openLines, book.duplicates(), recovered.Round(time.Millisecond))
	if failed == 0 {
		t.Fatal("no Claim failed: the kill did not land in the burst")
	}
	if failOpen {
		if int64(execs) != owned+failed || int64(openLines) != failed {
			t.Errorf("fail open: executions %d, want granted claims + failed claims = %d; fail-open log lines %d, want %d",
				execs, owned+failed, openLines, failed)
		}
	} else {
		if int64(execs) != owned || unavailable.Load() != failed || openLines != 0 {
			t.Errorf("fail closed: executions %d, want granted claims %d; UNAVAILABLE %d, want failed claims %d; fail-open lines %d, want 0",
				execs, owned, unavailable.Load(), failed, openLines)
		}
		if d := book.duplicates(); d != 0 {
			t.Errorf("fail closed: %d executions of keys whose record was stored, want 0", d)
		}
	}

	// After the restart: the keys completed before the burst.
	wantRuns := 1 // appendfsync always: the records survived, calls replay
	if !aof {
		wantRuns = 2 // no persistence: the records died with the process, each key runs once more
	}
	for round := range 2 {
		for i := range before {
			key := fmt.Sprint("before-", i)
			if r := call(ccs[i%2], key); r.err != nil {
				t.Fatalf("call %s after the restart: %v", key, r.err)
			}
			if got := book.count(key); got != wantRuns {
				t.Fatalf("round %d after the restart: %s ran %d times, want %d", round, key, got, wantRuns)
			}
		}
	}
}

// TestIdempotencyRedisFailoverLosesUnreplicatedWrites shows what a Redis
// failover can and cannot guarantee. Replication is asynchronous: a claim
// or a record the primary acknowledged and the replica never received is
// lost when the replica is promoted (REPLICAOF NO ONE), and a duplicate
// sent to the promoted replica runs the handler again: concurrently with
// the first execution when the claim was lost, after it when the record
// was. The test cuts the replica's link before the write (it replicates
// from a closed port: a partition), kills the primary (SIGKILL), promotes
// the replica and points a second server's store at it. When the write
// has reached the replica (WAIT 1 confirmed it) the record survives the
// failover and the duplicate replays it. With redisstore.WithMinReplicas(1)
// the claim that no replica acknowledged is released and the first call
// fails closed before its handler runs: one execution in all.
func TestIdempotencyRedisFailoverLosesUnreplicatedWrites(t *testing.T) {
	tests := []struct {
		name       string
		inProgress bool // the first execution still runs at the failover
		replicated bool // WAIT 1 confirmed the write before the failover
		minReplica bool // the first server's store has WithMinReplicas(1, 200ms)
		wantRuns   int64
	}{
		{"claim not replicated: a second execution runs concurrently", true, false, false, 2},
		{"record not replicated: the completed call runs again", false, false, false, 2},
		{"record replicated (WAIT 1): the duplicate replays it", false, true, false, 1},
		{"claim not replicated, WithMinReplicas(1): the first call fails closed", false, false, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			primary := redistest.StartWith(t, "--dir", t.TempDir())
			replica := redistest.StartReplica(t, primary, "--dir", t.TempDir())
			ctx := idemCtx(t)
			admin := redistest.Client(t, primary.Addr)
			if !tt.replicated { // the partition: the replica loses its link before the write
				host, port, _ := strings.Cut(redistest.ClosedAddr(t), ":")
				if err := redistest.Client(t, replica.Addr).ReplicaOf(ctx, host, port).Err(); err != nil {
					t.Fatal(err)
				}
			}
			var running, runs atomic.Int64
			entered, release := make(chan struct{}), make(chan struct{})
			e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
				runs.Add(1)
				if running.Add(1) == 1 && tt.inProgress {
					close(entered)
					<-release
				}
				running.Add(-1)
				return &echov1.EchoResponse{Message: req.Message}, nil
			}}
			log := new(idemLog)
			server := func(addr string, opts ...redisstore.Option) *grpc.ClientConn {
				s, err := redisstore.New(idemRedisClient(t, addr), append(opts, redisstore.WithKeyPrefix("failover:"))...)
				if err != nil {
					t.Fatal(err)
				}
				return idemStart(t, e, Idempotency{Store: s}, WithLogger(log.logger()))
			}
			var ccA *grpc.ClientConn
			if tt.minReplica {
				ccA = server(primary.Addr, redisstore.WithMinReplicas(1, 200*time.Millisecond))
			} else {
				ccA = server(primary.Addr)
			}
			first := make(chan idemCall, 1)
			go func() { first <- idemDo(ctx, ccA, "k", "m") }()
			switch {
			case tt.inProgress:
				<-entered // the claim is on the primary, and only there
			case tt.minReplica:
				r := <-first
				wantCode(t, "first call, its claim on no replica", r.err, codes.Unavailable, "not acknowledged by enough replicas")
				if err := wantRetryHint(r.err, r.trailer); err != nil {
					t.Error(err)
				}
			default:
				if r := <-first; r.err != nil {
					t.Fatal(r.err)
				}
			}
			if tt.replicated {
				n, err := admin.Wait(ctx, 1, 5*time.Second).Result()
				if err != nil || n != 1 {
					t.Fatalf("WAIT 1 = %d, %v; want 1 replica", n, err)
				}
			}
			primary.Stop() // SIGKILL
			if err := redistest.Client(t, replica.Addr).ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
				t.Fatal(err)
			}
			redistest.WaitInfo(t, replica.Addr, "replication", "role:master")
			ccB := server(replica.Addr)
			if r := idemDo(ctx, ccB, "k", "m"); r.err != nil {
				t.Fatalf("duplicate on the promoted replica: %v", r.err)
			}
			concurrent := running.Load() // 1 while the first execution still runs
			if tt.inProgress {
				close(release)
				if r := <-first; r.err != nil {
					t.Fatalf("first call: %v", r.err)
				}
				if concurrent != 1 {
					t.Errorf("the second execution ran while %d others ran, want 1 (the first, concurrently)", concurrent)
				}
				if !strings.Contains(log.String(), "outcome not stored: store failed") {
					t.Errorf("log = %q, want the first call's outcome not stored (its primary is gone)", log.String())
				}
			}
			if got := runs.Load(); got != tt.wantRuns {
				t.Errorf("handler ran %d times, want %d", got, tt.wantRuns)
			}
			t.Logf("handler executions for one key across the failover: %d", runs.Load())
		})
	}
}
