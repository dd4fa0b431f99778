package server

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/internal/pushback"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// capacityEcho is a server with a fixed capacity: each Echo holds one of
// cap(tokens) tokens for service, waiting for one as long as its context
// lives. The work itself cannot be cancelled, as real work rarely can.
type capacityEcho struct {
	echov1.UnimplementedEchoServiceServer
	tokens  chan struct{}
	service time.Duration
	slower  atomic.Int64   // added to service, nanoseconds (a slowdown)
	active  sync.WaitGroup // handlers running; waited for before the bubble ends
}

func newCapacityEcho(n int, service time.Duration) *capacityEcho {
	return &capacityEcho{tokens: make(chan struct{}, n), service: service}
}

func (c *capacityEcho) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	c.active.Add(1)
	defer c.active.Done()
	select {
	case c.tokens <- struct{}{}:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	time.Sleep(c.service + time.Duration(c.slower.Load()))
	<-c.tokens
	return &echov1.EchoResponse{Message: req.GetMessage()}, nil
}

// load is an open-loop load: calls start every gap for dur, each with its
// own deadline, whatever became of the calls before.
type load struct {
	gap, dur, deadline time.Duration
	// measureFrom: only calls started at or after it count.
	measureFrom time.Duration
	// ctx returns the context of call i (criticality, etc.); nil: plain.
	ctx func(ctx context.Context, i int) context.Context
	// class groups the calls for the report (e.g. by criticality); nil: one.
	class func(i int) int
}

// loadResult is what the counted calls of a load saw.
type loadResult struct {
	calls, good [2]int          // by class
	lat         []time.Duration // of the good calls
	codes       map[codes.Code]int
}

// p returns the q-quantile of the good calls' latencies.
func (r *loadResult) p(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	s := slices.Clone(r.lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// run drives the load against cc inside a synctest bubble and waits for
// every call to end.
func (ld load) run(cc *grpc.ClientConn) *loadResult {
	client := echov1.NewEchoServiceClient(cc)
	res := &loadResult{codes: map[codes.Code]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := 0; time.Duration(i)*ld.gap < ld.dur; i++ {
		start := time.Now()
		counted := start.Sub(t0) >= ld.measureFrom
		class := 0
		if ld.class != nil {
			class = ld.class(i)
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), ld.deadline)
			defer cancel()
			if ld.ctx != nil {
				ctx = ld.ctx(ctx, i)
			}
			_, err := client.Echo(ctx, &echov1.EchoRequest{Message: "m"})
			took := time.Since(start)
			if !counted {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			res.calls[class]++
			res.codes[status.Code(err)]++
			if err == nil && took <= ld.deadline {
				res.good[class]++
				res.lat = append(res.lat, took)
			}
		})
		time.Sleep(ld.gap)
	}
	wg.Wait()
	return res
}

// Scenario: 20 tokens of 100ms, a capacity of 200 calls/s; deadlines of 1s.
const (
	ovTokens   = 20
	ovService  = 100 * time.Millisecond
	ovDeadline = time.Second
)

// ovGap is the gap between arrivals at x times the capacity.
func ovGap(x float64) time.Duration {
	return time.Duration(float64(ovService) / (ovTokens * x))
}

// capacityIn is the most calls the server can finish in d.
func capacityIn(d time.Duration) float64 { return float64(ovTokens) * float64(d) / float64(ovService) }

// runOverload offers ld, in a synctest bubble, to a capacityEcho behind a
// server built from opts(ce) (opts nil: no server interceptor), waits until
// every handler has returned, and gives the result with the server's limit
// statuses (nil without a server).
func runOverload(t *testing.T, ld load, opts func(ce *capacityEcho) []Option) (*loadResult, []LimitStatus) {
	t.Helper()
	var res *loadResult
	var st []LimitStatus
	synctest.Test(t, func(t *testing.T) {
		ce := newCapacityEcho(ovTokens, ovService)
		var srv *Server
		if opts != nil {
			var err error
			if srv, err = New(opts(ce)...); err != nil {
				t.Fatal(err)
			}
		}
		cc := serveEcho(t, ce, srv)
		res = ld.run(cc)
		synctest.Wait() // every call the server got has its handler started: Add before Wait
		ce.active.Wait()
		if srv != nil {
			st = srv.LimitStatuses()
		}
	})
	return res, st
}

// withLimit is runOverload's opts for a concurrency limit of cfg.
func withLimit(cfg serviceconfig.ConcurrencyLimit) func(*capacityEcho) []Option {
	return func(*capacityEcho) []Option { return []Option{WithLimits(limitsOf(cfg))} }
}

// TestOverloadGoodput runs the open-loop scenario of the overload issue on
// fake time: 3s of arrivals at three times the capacity, counting the calls
// started after the first second. Without protection the goodput (calls
// that succeed within their deadline) collapses; with the adaptive limit it
// stays at 90% of the capacity or more, and the p99 latency of the calls
// that succeed stays within twice the unloaded p99.
func TestOverloadGoodput(t *testing.T) {
	const dur, from = 3 * time.Second, time.Second
	window := capacityIn(dur - from)
	unloaded, _ := runOverload(t, load{gap: ovGap(0.5), dur: time.Second, deadline: ovDeadline}, nil)
	bare, _ := runOverload(t, load{gap: ovGap(3), dur: dur, deadline: ovDeadline, measureFrom: from}, nil)
	limited, st := runOverload(t, load{gap: ovGap(3), dur: dur, deadline: ovDeadline, measureFrom: from}, withLimit(serviceconfig.ConcurrencyLimit{}))
	base := unloaded.p(0.99)
	t.Logf("unloaded: p99 %v; capacity in the window %.0f", base, window)
	t.Logf("no protection: goodput %d (%.1f%% of capacity), codes %v", bare.good[0], 100*float64(bare.good[0])/window, bare.codes)
	t.Logf("adaptive limit: goodput %d (%.1f%%), admitted p99 %v (%.2f× unloaded), codes %v, limit %+v",
		limited.good[0], 100*float64(limited.good[0])/window, limited.p(0.99), float64(limited.p(0.99))/float64(base), limited.codes, st)
	if base != ovService {
		t.Errorf("unloaded p99 = %v, want the service time %v", base, ovService)
	}
	if got := float64(bare.good[0]) / window; got > 0.1 {
		t.Errorf("without protection, goodput = %.2f of capacity, want a collapse (≤ 0.1)", got)
	}
	if got := float64(limited.good[0]) / window; got < 0.9 {
		t.Errorf("with the adaptive limit, goodput = %.2f of capacity, want ≥ 0.9", got)
	}
	if p := limited.p(0.99); p > 2*base {
		t.Errorf("with the adaptive limit, admitted p99 = %v, want ≤ 2 × %v", p, base)
	}
}

// TestOverloadRetriesDoNotAmplify runs the 3× scenario with our client
// retrying RESOURCE_EXHAUSTED (MaxAttempts 3, the default retry budget):
// the server sees at most 1.1 attempts per call, every retry waited the
// server's pushback exactly, and went out as SHEDDABLE_PLUS.
func TestOverloadRetriesDoNotAmplify(t *testing.T) {
	cfg, err := serviceconfig.Parse([]byte(`{"methodConfig": [{"name": [{}],
		"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
			"backoffMultiplier": 2, "retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu                         sync.Mutex
		arrivals, retries, badCrit int
		events                     []interceptor.RetryEvent
		res                        *loadResult
	)
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, interceptor.WithServiceConfig(cfg), interceptor.WithOnRetry(func(_ context.Context, e interceptor.RetryEvent) {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		}))
		srv, err := New(WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{})))
		if err != nil {
			t.Fatal(err)
		}
		spy := func(ctx context.Context) {
			md, _ := metadata.FromIncomingContext(ctx)
			mu.Lock()
			defer mu.Unlock()
			arrivals++
			if len(md.Get(previousAttemptsKey)) > 0 {
				retries++
				if incomingCriticality(ctx) != wire.SheddablePlus {
					badCrit++
				}
			}
		}
		ce := newCapacityEcho(ovTokens, ovService)
		cc := serveEchoWith(t, ce, srv, spy, c.DialOptions()...)
		res = load{gap: ovGap(3), dur: 3 * time.Second, deadline: ovDeadline}.run(cc)
		synctest.Wait() // every call the server got has its handler started: Add before Wait
		ce.active.Wait()
	})
	calls := res.calls[0]
	perCall := float64(arrivals) / float64(calls)
	t.Logf("calls %d, attempts at the server %d (%.3f per call), retries %d, goodput %d, codes %v",
		calls, arrivals, perCall, retries, res.good[0], res.codes)
	if perCall > 1.1 {
		t.Errorf("attempts per call = %.3f, want ≤ 1.1", perCall)
	}
	if badCrit > 0 {
		t.Errorf("%d retries arrived with a criticality other than SHEDDABLE_PLUS", badCrit)
	}
	if len(events) != retries {
		t.Errorf("OnRetry saw %d retries, the server %d", len(events), retries)
	}
	for _, e := range events {
		d, ok, refuse := pushback.Hint(e.Err, nil) // the RetryInfo detail
		if !e.Pushback || !ok || refuse || e.Delay != d {
			t.Errorf("retry after %v (pushback %v), want the server's RetryInfo %v (ok %v, refuse %v)", e.Delay, e.Pushback, d, ok, refuse)
			break
		}
	}
}

// TestOverloadCriticality runs twice the capacity, every other call
// SHEDDABLE: the server sheds the sheddable calls, and 99% of the CRITICAL
// calls or more succeed within their deadline.
func TestOverloadCriticality(t *testing.T) {
	res, st := runOverload(t, load{
		gap: ovGap(2), dur: 3 * time.Second, deadline: ovDeadline, measureFrom: time.Second,
		ctx: func(ctx context.Context, i int) context.Context {
			if i%2 == 1 {
				return wire.ContextWithCriticality(ctx, wire.Sheddable)
			}
			return ctx
		},
		class: func(i int) int { return i % 2 },
	}, withLimit(serviceconfig.ConcurrencyLimit{}))
	crit := float64(res.good[0]) / float64(res.calls[0])
	t.Logf("CRITICAL: %d/%d succeeded (%.1f%%); SHEDDABLE: %d/%d; limit %+v",
		res.good[0], res.calls[0], 100*crit, res.good[1], res.calls[1], st)
	if crit < 0.99 {
		t.Errorf("CRITICAL success = %.3f, want ≥ 0.99", crit)
	}
	if res.good[1] >= res.good[0] {
		t.Errorf("SHEDDABLE succeeded %d times, CRITICAL %d: want the sheddable shed first", res.good[1], res.good[0])
	}
}

// quotaEcho accepts at most rate calls per second (a token bucket of one
// second's worth) and fails the others with RESOURCE_EXHAUSTED; arrivals
// counts every call that reached it.
type quotaEcho struct {
	echov1.UnimplementedEchoServiceServer
	mu       sync.Mutex
	rate     float64
	tokens   float64
	last     time.Time
	arrivals int
}

func (q *quotaEcho) setRate(r float64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.rate, q.tokens = r, min(q.tokens, r)
}

func (q *quotaEcho) count() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.arrivals
}

func (q *quotaEcho) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	if !q.last.IsZero() {
		q.tokens = min(q.rate, q.tokens+q.rate*now.Sub(q.last).Seconds())
	}
	q.last = now
	q.arrivals++
	if q.tokens < 1 {
		return nil, status.Error(codes.ResourceExhausted, "over quota")
	}
	q.tokens--
	return &echov1.EchoResponse{}, nil
}

// TestAdaptiveThrottlingSettlesAndRecovers: a backend that accepts 30% of
// the offered load gets about K·accepts = 60% of it (within 20%) from a
// client in adaptive mode, and after it recovers the client sends
// everything again within one window.
func TestAdaptiveThrottlingSettlesAndRecovers(t *testing.T) {
	const rate, window = 50.0, 10 * time.Second
	cfg, err := serviceconfig.Parse([]byte(`{"methodConfig": [{"name": [{}],
		"circuitBreaker": {"mode": "adaptive", "k": 2, "window": "10s"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var settled, recovered float64
	var st interceptor.MethodStatus
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, interceptor.WithServiceConfig(cfg), interceptor.WithRandSource(rand.NewPCG(1, 2)))
		q := &quotaEcho{rate: 0.3 * rate, tokens: 0.3 * rate}
		cc := serveEcho(t, q, nil, c.DialOptions()...)
		gap := time.Duration(float64(time.Second) / rate)
		phase := func(d time.Duration) float64 {
			before := q.count()
			ld := load{gap: gap, dur: d, deadline: time.Second}
			res := ld.run(cc)
			return float64(q.count()-before) / float64(res.calls[0])
		}
		phase(2 * window)
		settled = phase(window)
		st = c.Status(echoMethod)
		q.setRate(2 * rate)
		phase(window)
		recovered = phase(time.Second)
	})
	t.Logf("backend at 30%%: the client sent %.3f of the offered load (K·accepts = 0.6); status %+v; one window after recovery: %.3f",
		settled, *st.Adaptive, recovered)
	if math.Abs(settled-0.6) > 0.6*0.2 {
		t.Errorf("backend at 30%%: sent %.3f, want 0.6 ± 20%%", settled)
	}
	if recovered < 0.99 {
		t.Errorf("one window after recovery: sent %.3f, want all", recovered)
	}
}

// TestOverloadCPUShedding runs the 3× scenario with CPU-aware shedding in
// place of the concurrency limit, the CPU use being the share of busy
// tokens: goodput stays at 90% of the capacity or more, and the admitted
// p99 within twice the service time.
func TestOverloadCPUShedding(t *testing.T) {
	const dur, from = 6 * time.Second, 2 * time.Second
	res, st := runOverload(t, load{gap: ovGap(3), dur: dur, deadline: ovDeadline, measureFrom: from}, func(ce *capacityEcho) []Option {
		return []Option{WithLimits(Limits{CPU: &CPUShedding{
			CPU: func() float64 { return float64(len(ce.tokens)) / ovTokens },
		}})}
	})
	window := capacityIn(dur - from)
	good := float64(res.good[0]) / window
	t.Logf("CPU shedding: goodput %d (%.1f%% of capacity), admitted p99 %v, codes %v, %+v", res.good[0], 100*good, res.p(0.99), res.codes, st)
	if good < 0.9 {
		t.Errorf("goodput = %.2f of capacity, want ≥ 0.9", good)
	}
	if p := res.p(0.99); p > 2*ovService {
		t.Errorf("admitted p99 = %v, want ≤ %v", p, 2*ovService)
	}
}

// TestOverloadGoodputWithQueue is the 3× scenario with a short queue (10
// calls, 50ms): goodput stays at 90% of capacity or more, and the p99 of
// admitted calls within twice the unloaded p99 plus MaxQueueWait (the
// queue trades that much latency for absorbing bursts).
func TestOverloadGoodputWithQueue(t *testing.T) {
	const dur, from = 3 * time.Second, time.Second
	res, st := runOverload(t, load{gap: ovGap(3), dur: dur, deadline: ovDeadline, measureFrom: from},
		withLimit(serviceconfig.ConcurrencyLimit{MaxQueue: 10, MaxQueueWait: 50 * time.Millisecond}))
	good := float64(res.good[0]) / capacityIn(dur-from)
	t.Logf("with a queue: goodput %.1f%% of capacity, admitted p99 %v, %+v", 100*good, res.p(0.99), st)
	if good < 0.9 {
		t.Errorf("goodput = %.2f of capacity, want ≥ 0.9", good)
	}
	if p := res.p(0.99); p > 2*ovService+50*time.Millisecond {
		t.Errorf("admitted p99 = %v, want ≤ %v", p, 2*ovService+50*time.Millisecond)
	}
}

// TestSlowdownLimitRecovers: at an offered load of 80 calls/s (40% of the
// capacity, 80% of it after the slowdown), the service time doubles for
// good (100ms → 200ms) although the server is not overloaded. The Vegas
// probe makes the new service time the base RTT: from 3s of fake time after
// the slowdown on, the limit stays at 80% of its value before it or more, and goodput over
// the 10s after the slowdown stays at 90% of the offered calls or more.
func TestSlowdownLimitRecovers(t *testing.T) {
	const (
		gap      = 12500 * time.Microsecond // 80 calls/s
		before   = 5 * time.Second
		after    = 10 * time.Second
		recovery = 3 * time.Second
	)
	var (
		res       *loadResult
		pre, low  int
		recovered time.Duration // the last sample with the limit below 80% of pre
		st        []LimitStatus
	)
	synctest.Test(t, func(t *testing.T) {
		srv, err := New(WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{})))
		if err != nil {
			t.Fatal(err)
		}
		ce := newCapacityEcho(ovTokens, ovService)
		cc := serveEcho(t, ce, srv)
		load{gap: gap, dur: before, deadline: ovDeadline}.run(cc)
		pre = srv.LimitStatuses()[0].Limit
		low = pre
		ce.slower.Store(int64(ovService))
		t0 := time.Now()
		done := make(chan struct{})
		go func() { // samples the limit every 50ms of fake time
			defer close(done)
			for time.Since(t0) < after {
				time.Sleep(50 * time.Millisecond)
				l := srv.LimitStatuses()[0].Limit
				low = min(low, l)
				if 5*l < 4*pre {
					recovered = time.Since(t0)
				}
			}
		}()
		res = load{gap: gap, dur: after, deadline: ovDeadline}.run(cc)
		<-done
		synctest.Wait() // every call the server got has its handler started: Add before Wait
		ce.active.Wait()
		st = srv.LimitStatuses()
	})
	good := float64(res.good[0]) / float64(res.calls[0])
	t.Logf("limit before the slowdown %d, lowest after %d, back to ≥ 80%% for good after %v; goodput %d/%d (%.1f%%), codes %v, %+v",
		pre, low, recovered, res.good[0], res.calls[0], 100*good, res.codes, st)
	if good < 0.9 {
		t.Errorf("goodput after the slowdown = %.3f of the offered calls, want ≥ 0.9", good)
	}
	if recovered > recovery {
		t.Errorf("the limit was below 80%% of %d until %v after the slowdown, want within %v", pre, recovered, recovery)
	}
}

// TestOverloadSustained runs the 3× scenario for 30s of fake time: each
// Vegas probe takes a queued sample for the base RTT, and this pins that
// the probes do not ratchet the limit up over a long overload: in the last
// 2s, goodput stays at 90% of the capacity or more and the admitted p99
// within twice the service time.
func TestOverloadSustained(t *testing.T) {
	const dur, last = 30 * time.Second, 2 * time.Second
	res, st := runOverload(t, load{gap: ovGap(3), dur: dur, deadline: ovDeadline, measureFrom: dur - last}, withLimit(serviceconfig.ConcurrencyLimit{}))
	good := float64(res.good[0]) / capacityIn(last)
	t.Logf("after %v at 3×: goodput %.1f%% of capacity, admitted p99 %v, %+v", dur, 100*good, res.p(0.99), st)
	if good < 0.9 {
		t.Errorf("goodput = %.2f of capacity, want ≥ 0.9", good)
	}
	if p := res.p(0.99); p > 2*ovService {
		t.Errorf("admitted p99 = %v, want ≤ %v", p, 2*ovService)
	}
}
