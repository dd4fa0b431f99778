package redisquota

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/internal/ratelimit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// client returns a client of addr that fails fast when Redis is down: no
// retries, short dials, contexts applied to socket I/O.
func client(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond,
		ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newStore returns a Store on c with the test's own key prefix, closed
// when the test ends.
func newStore(t testing.TB, c redis.UniversalClient, prefix string, opts ...Option) *Store {
	t.Helper()
	s, err := New(c, append([]Option{WithKeyPrefix(prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func newLimiter(t testing.TB, s *Store, name string, l Limit) *Limiter {
	t.Helper()
	lim, err := s.Limiter(name, l)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// TestLeaseScript pins the script's arithmetic with a rate slow enough (one
// token a second) that the real time the test takes does not move it: a
// fresh key grants the burst at once, a lease that does not fit is refused
// with the time until it would, the horizon lets a lease reach into the
// future, and each replica that leased within the window counts.
func TestLeaseScript(t *testing.T) {
	c := client(t, redistest.Addr(t))
	s := newStore(t, c, redistest.Prefix(t))
	l := newLimiter(t, s, "script", Limit{Rate: 1, Burst: 10})
	ctx := context.Background()
	lease := func(want, min int, horizon time.Duration) ratelimit.Grant {
		t.Helper()
		g, err := l.lease(ctx, &ratelimit.Lease{Key: "tenant", Interval: time.Second, Tau: 10 * time.Second,
			Horizon: horizon, Want: want, Min: min, ReplicaWindow: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	g := lease(5, 1, 0)
	if g.Tokens != 5 || g.FirstSlot != -9*time.Second || g.Left != 5 || g.Replicas != 1 {
		t.Fatalf("fresh key, 5 of a burst of 10: %+v; want 5 tokens, the first 9s in the past (the burst), 5 left, 1 replica", g)
	}
	g = lease(100, 50, 0)
	if g.Tokens != 0 || g.RetryAfter <= 44*time.Second || g.RetryAfter > 45*time.Second {
		t.Fatalf("50 tokens with 5 in the bucket: %+v; want refused, retry after 45s (less the time since)", g)
	}
	g = lease(20, 1, 10*time.Second)
	if g.Tokens != 15 || g.Left != 0 || g.FirstSlot > -3*time.Second || g.FirstSlot < -5*time.Second {
		t.Fatalf("20 tokens with 5 in the bucket and a horizon of 10s: %+v; want 15 (5 now, 10 reserved ahead), the first at about -4s", g)
	}
	other := newStore(t, c, s.opts.prefix)
	ol := newLimiter(t, other, "script", Limit{Rate: 1, Burst: 10})
	g, err := ol.lease(ctx, &ratelimit.Lease{Key: "tenant", Interval: time.Second, Tau: 10 * time.Second,
		Want: 1, Min: 1, ReplicaWindow: time.Minute})
	if err != nil || g.Replicas != 2 || g.Tokens != 0 {
		t.Fatalf("a second replica: %+v, %v; want 2 replicas, nothing granted (the schedule is 10s ahead)", g, err)
	}
	g, _ = ol.lease(ctx, &ratelimit.Lease{Key: "tenant", Interval: time.Second, Tau: 10 * time.Second,
		Want: 1, Min: 1, ReplicaWindow: time.Microsecond})
	if g.Replicas != 1 {
		t.Fatalf("with a window of 1µs the first replica is stale: %d replicas, want 1", g.Replicas)
	}
}

// TestReplicasShareTheRate: three replicas (stores) on one Redis flood one
// key; the calls they admit by leases are no more than the burst and the
// rate over the time (a token is never spent before its slot on Redis's
// schedule), all of them at least half of it (a busy machine may starve a
// sender), at fewer round trips than admitted calls by far. A lease that a
// busy machine delays past the lease timeout puts a replica in fallback
// for a probe interval, whose local share comes on top: those calls are
// counted apart.
func TestReplicasShareTheRate(t *testing.T) {
	const rate, burst = 400, 20
	addr := redistest.Addr(t)
	prefix := redistest.Prefix(t)
	var lims []*Limiter
	var trips []*redistest.RoundTrips
	for range 3 {
		c := client(t, addr)
		trips = append(trips, redistest.CountRoundTrips(c))
		lims = append(lims, newLimiter(t, newStore(t, c, prefix), "share", Limit{Rate: rate, Burst: burst}))
	}
	var admitted, fallback atomic.Int64
	start := time.Now()
	deadline := start.Add(time.Second)
	var wg sync.WaitGroup
	for _, l := range lims {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				d, err := l.Allow(context.Background(), "tenant", wire.Critical)
				if err != nil {
					t.Error(err)
					return
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
	wg.Wait()
	elapsed := time.Since(start)
	n, fb := admitted.Load(), fallback.Load()
	if max := int64(burst + rate*elapsed.Seconds() + 1); n-fb > max {
		t.Errorf("%d admitted by leases in %v: more than the burst and the rate allow (%d)", n-fb, elapsed, max)
	}
	if min := int64(rate * elapsed.Seconds() / 2); n < min {
		t.Errorf("%d admitted in %v: less than half the rate (%d)", n, elapsed, min)
	}
	var rt int64
	for _, r := range trips {
		rt += r.N()
	}
	if rt*5 > n {
		t.Errorf("%d round trips for %d admitted calls: more than one per 5", rt, n)
	}
	t.Logf("%d admitted in %v (rate %d/s, burst %d; %d by the fallback), %d round trips", n, elapsed, rate, burst, fb, rt)
}

// TestFirstCallWaitsForItsLease: a key's first call on a replica waits
// for one round trip and is admitted. The lease timeout is a minute, so
// that a round trip a busy machine delays past the default 100ms (which
// answers from the fallback, as it should) cannot fail the test.
func TestFirstCallWaitsForItsLease(t *testing.T) {
	c := client(t, redistest.Addr(t))
	l := newLimiter(t, newStore(t, c, redistest.Prefix(t), WithLeaseTimeout(time.Minute)), "first", Limit{Rate: 10, Burst: 2})
	for i, want := range []bool{true, true, false} {
		d, err := l.Allow(context.Background(), "k", wire.Critical)
		if err != nil || d.OK != want || d.Fallback {
			t.Fatalf("call %d: %+v, %v; want admitted %v, not in fallback", i, d, err, want)
		}
		if !want && (d.Wait <= 0 || d.Wait > 100*time.Millisecond) {
			t.Fatalf("refused with wait %v, want at most one interval (100ms)", d.Wait)
		}
	}
}

// TestAllowEndsWithItsContext: a call waiting for a lease returns when its
// context ends.
func TestAllowEndsWithItsContext(t *testing.T) {
	addr := redistest.ClosedAddr(t)
	c := client(t, addr)
	l := newLimiter(t, newStore(t, c, "rl:", WithLeaseTimeout(time.Hour)), "ctx", Limit{Rate: 10, Burst: 2})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Allow(ctx, "k", wire.Critical); !errors.Is(err, context.Canceled) {
		t.Fatalf("Allow on a cancelled context while the lease is pending: %v, want context.Canceled", err)
	}
}

// TestOutageFallbackAndReturn: Redis killed while a limiter leases: calls
// never wait past the lease timeout, the limiter enters fallback once
// (a log line and a metric), decides by its local share, and leases again
// once Redis is back, within 2 s of its restart.
func TestOutageFallbackAndReturn(t *testing.T) {
	srv := redistest.Start(t)
	c := client(t, srv.Addr)
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	reader := metric.NewManualReader()
	mp := metric.NewMeterProvider(metric.WithReader(reader))
	s := newStore(t, c, redistest.Prefix(t), WithLogger(logger), WithMeterProvider(mp), WithLeaseTimeout(50*time.Millisecond))
	l := newLimiter(t, s, "outage", Limit{Rate: 1000, Burst: 10, ProbeInterval: 100 * time.Millisecond})
	ctx := context.Background()
	// Warm up until a call is decided by a lease: on a busy machine a lease
	// may take longer than the timeout, and the limiter then starts in
	// fallback; its next probe leases.
	for warm := time.Now(); ; {
		d, err := l.Allow(ctx, "k", wire.Critical)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Fallback && !l.InFallback() {
			break
		}
		if time.Since(warm) > 5*time.Second {
			t.Fatal("no call decided by a lease in 5s with Redis up")
		}
		time.Sleep(time.Millisecond) // polling interval: the limiter probes on calls
	}
	srv.Stop()
	// The limiter notices when it needs a lease: once the tokens it holds
	// (reserved up to a lease period ahead) are spent or forfeited.
	fallback := 0
	stopped := time.Now()
	for i := 0; fallback < 50; i++ {
		if time.Since(stopped) > 2*time.Second {
			t.Fatalf("Redis down for 2s: %d decisions by the fallback, in fallback %v", fallback, l.InFallback())
		}
		start := time.Now()
		d, err := l.Allow(ctx, "k", wire.Critical)
		if err != nil {
			t.Fatal(err)
		}
		// Past the lease timeout, only a busy machine's scheduling (up to
		// 1s here): no call waits for go-redis's dials or timeouts.
		if took := time.Since(start); took > 50*time.Millisecond+time.Second {
			t.Fatalf("call %d took %v with Redis down: past the lease timeout (50ms)", i, took)
		}
		if d.Fallback {
			fallback++
		}
	}
	if !l.InFallback() {
		t.Fatal("Redis down: decisions by the fallback, but not in fallback")
	}
	srv.StartAgain(t)
	back := time.Now()
	for l.InFallback() {
		if time.Since(back) > 2*time.Second {
			t.Fatalf("still in fallback 2s after Redis came back")
		}
		if _, err := l.Allow(ctx, "k", wire.Critical); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // polling interval: the limiter probes on calls
	}
	t.Logf("leasing again %v after Redis's restart", time.Since(back))
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	// One line per transition, each entry followed by its exit: the warm-up
	// may have seen a slow lease too.
	in, left := strings.Count(out, "Redis is unreachable"), strings.Count(out, "Redis answers again")
	if in < 1 || in != left {
		t.Errorf("%d log lines on entering fallback, %d on leaving it, want one of each per outage:\n%s", in, left, out)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	if got := sumInt(rm, metricFallbacks); got != int64(in) {
		t.Errorf("%s = %d, want %d (the log's)", metricFallbacks, got, in)
	}
	if got := sumInt(rm, metricInFallback); got != 0 {
		t.Errorf("%s = %d after the return, want 0", metricInFallback, got)
	}
	if got := sumInt(rm, metricLeases); got == 0 {
		t.Errorf("%s = 0, want the round trips counted", metricLeases)
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// sumInt adds up the int64 points of the metric named.
func sumInt(rm metricdata.ResourceMetrics, name string) int64 {
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					n += p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					n += p.Value
				}
			}
		}
	}
	return n
}

func TestNewErrors(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for _, tt := range []struct {
		opts []Option
		want string
	}{
		{[]Option{WithKeyPrefix("a{b")}, "must not contain '{' or '}'"},
		{[]Option{WithLeaseTimeout(0)}, "WithLeaseTimeout(0s): must be positive"},
		{[]Option{WithLogger(nil)}, "WithLogger(nil)"},
		{[]Option{WithMeterProvider(nil)}, "WithMeterProvider(nil)"},
	} {
		if _, err := New(c, tt.opts...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New = %v, want an error containing %q", err, tt.want)
		}
	}
	if _, err := New(nil); err == nil {
		t.Error("New(nil) accepted")
	}
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Limiter("a", Limit{Rate: 1, Burst: 0}); err == nil || !strings.Contains(err.Error(), "Burst 0") {
		t.Errorf("Limiter with burst 0: %v", err)
	}
	if _, err := s.Limiter("a{", Limit{Rate: 1, Burst: 1}); err == nil {
		t.Error("a name with a brace accepted")
	}
	if _, err := s.Limiter("a", Limit{Rate: 1, Burst: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Limiter("a", Limit{Rate: 1, Burst: 1}); err == nil {
		t.Error("two Limiters of one name accepted")
	}
}

// TestOverflowKeysShareOneRedisBucket: past MaxKeys, the keys a caller
// names share one bucket, and its leases draw on one Redis hash, apart
// from every key's: a caller naming a new key each call gets at most the
// burst of it, and leaves no hash of its keys in Redis. Before, each
// overflow lease went to the hash of the key being decided, a fresh, full
// bucket each time: every such call was admitted.
func TestOverflowKeysShareOneRedisBucket(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	c := client(t, addr)
	// A lease timeout no busy machine reaches: every call is decided by a
	// lease, none by the fallback.
	l := newLimiter(t, newStore(t, c, prefix, WithLeaseTimeout(time.Minute)), "over",
		Limit{Rate: 1, Per: time.Hour, Burst: 3, MaxKeys: 1})
	ctx := context.Background()
	if d, err := l.Allow(ctx, "remembered", wire.Critical); err != nil || !d.OK {
		t.Fatalf("the first key's first call: %+v, %v", d, err)
	}
	admitted := 0
	for i := range 20 {
		d, err := l.Allow(ctx, "new-"+strconv.Itoa(i), wire.Critical)
		if err != nil {
			t.Fatal(err)
		}
		if d.Fallback {
			t.Fatalf("call %d decided by the fallback with Redis up: %+v", i, d)
		}
		if d.OK {
			admitted++
		}
	}
	if admitted > 3 {
		t.Errorf("%d of 20 calls on keys beyond MaxKeys admitted at 1 an hour, bursts of 3: want at most the burst", admitted)
	}
	keys, err := c.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	want := []string{l.redisKey("remembered"), prefix + "{over:overflow}"}
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Errorf("Redis holds %q, want the remembered key's hash and the overflow's: %q", keys, want)
	}
}
