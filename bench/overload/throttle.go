package overload

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The isolation scenario of the client's adaptive throttling: a fresh
// client calls a slow method with many callers beside a fast one.
const (
	isoStreams   = 64                     // the server's MaxConcurrentStreams
	isoCallers   = 64                     // closed-loop callers of the slow method
	isoSlow      = 500 * time.Millisecond // the slow method's time
	isoBulkhead  = 48                     // the slow method's bulkhead, below the stream cap
	isoFastCalls = 200                    // fast calls per measurement, at least
)

// IsolationResult is one isolation run.
type IsolationResult struct {
	// Adaptive and Bulkhead: the client's configuration of the slow method.
	Adaptive, Bulkhead bool
	// IdleP99 and LoadedP99 are the fast method's p99, idle and while the
	// slow callers run; FastFailed counts the fast calls that failed.
	IdleP99, LoadedP99 time.Duration
	FastFailed         int
	// Throttled counts the slow calls adaptive throttling rejected
	// locally.
	Throttled int
}

// RunIsolation runs the isolation scenario with a fresh grpc-resilience
// client: the fast method's p99 on the idle connection (200 calls), then
// while 64 closed-loop callers call the slow method (500ms; the server
// allows 64 streams per connection) for at least 3 slow calls' time.
func RunIsolation(adaptive, bulkhead bool) (IsolationResult, error) {
	r := IsolationResult{Adaptive: adaptive, Bulkhead: bulkhead}
	impl := &capacityServer{slow: isoSlow}
	srv, err := serve(impl, grpc.MaxConcurrentStreams(isoStreams))
	if err != nil {
		return r, err
	}
	defer srv.stop()
	mc := serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService", Method: "Lookup"}}}
	if adaptive {
		mc.CircuitBreaker = &serviceconfig.CircuitBreaker{Mode: serviceconfig.ModeAdaptive}
	}
	if bulkhead {
		mc.Bulkhead = &serviceconfig.Bulkhead{MaxConcurrent: isoBulkhead, MaxQueue: isoCallers, MaxQueueWait: time.Second}
	}
	client, cc, err := srv.client(mc)
	if err != nil {
		return r, err
	}
	defer cc.Close()
	fast := func(least time.Duration) (time.Duration, int) {
		var lat []time.Duration
		failed := 0
		start := time.Now()
		for i := 0; i < isoFastCalls || time.Since(start) < least; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			began := time.Now()
			_, err := client.Echo(ctx, &echov1.EchoRequest{})
			cancel()
			if err != nil {
				failed++
				continue
			}
			lat = append(lat, time.Since(began))
		}
		return quantile(lat, 0.99), failed
	}
	fast(0) // warm up
	r.IdleP99, _ = fast(0)
	var throttled atomic.Int64
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range isoCallers {
		wg.Go(func() {
			for ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := client.Lookup(cctx, &echov1.LookupRequest{Message: "slow"})
				cancel()
				if errors.Is(err, interceptor.ErrCircuitOpen) {
					throttled.Add(1)
				}
			}
		})
	}
	r.LoadedP99, r.FastFailed = fast(3 * isoSlow)
	stop()
	wg.Wait()
	r.Throttled = int(throttled.Load())
	return r, nil
}

// OutageResult is one outage run of adaptive throttling.
type OutageResult struct {
	// Fresh: the outage came first, to a fresh client; else after a
	// healthy phase as long as the outage.
	Fresh bool
	// Recovered is the time from the backend's recovery until every later
	// 250ms of arrivals has 90% of its calls succeed; negative: never.
	Recovered time.Duration
	// SentInOutage is the share of the calls in the outage that reached the
	// backend.
	SentInOutage float64
}

// Outage phases: healthy, down, healthy again; arrivals per second.
const (
	outageBefore = 1500 * time.Millisecond
	outageFor    = 1500 * time.Millisecond
	outageAfter  = 4 * time.Second
	outageRate   = 200.0
	outageStep   = 250 * time.Millisecond
)

// RunOutage runs a fresh grpc-resilience client with adaptive throttling
// (defaults: K 2, window 60s) against a backend that refuses every call
// with UNAVAILABLE for 1.5s, then is healthy, at 200 calls a second, open
// loop; unless fresh, the backend is healthy for 1.5s before the outage.
func RunOutage(fresh bool) (OutageResult, error) {
	r := OutageResult{Fresh: fresh}
	before := outageBefore
	if fresh {
		before = 0
	}
	impl := &capacityServer{}
	var down atomic.Bool
	impl.refuse = func() error {
		if down.Load() {
			return status.Error(codes.Unavailable, "down")
		}
		return nil
	}
	srv, err := serve(impl)
	if err != nil {
		return r, err
	}
	defer srv.stop()
	client, cc, err := srv.client(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService"}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{Mode: serviceconfig.ModeAdaptive},
	})
	if err != nil {
		return r, err
	}
	defer cc.Close()
	var rec recorder
	t0 := time.Now()
	var inOutage atomic.Int64
	if fresh {
		down.Store(true)
	}
	go func() {
		time.Sleep(before - time.Since(t0))
		calls := impl.calls.Load()
		down.Store(true)
		time.Sleep(before + outageFor - time.Since(t0))
		down.Store(false)
		inOutage.Store(impl.calls.Load() - calls)
	}()
	openLoop(t0, []phase{{outageRate, before + outageFor + outageAfter}}, func(_ int, start time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		began := time.Now()
		_, err := client.Echo(ctx, &echov1.EchoRequest{})
		rec.add(outcome{start: start, took: time.Since(began), code: status.Code(err), ok: err == nil})
	})
	out := rec.all()
	back := before + outageFor
	r.Recovered = -1
	for at := back; at+outageStep <= back+outageAfter; at += outageStep {
		switch s := success(pick(out, -1, at, at+outageStep)); {
		case s < 0.9:
			r.Recovered = -1
		case r.Recovered < 0:
			r.Recovered = at - back
		}
	}
	r.SentInOutage = float64(inOutage.Load()) / (outageRate * outageFor.Seconds())
	return r, nil
}

// QuotaResult is one run against a backend that accepts 30% of the load.
type QuotaResult struct {
	// Sent is the share of the offered calls that reached the backend over
	// the measurement; Accepted the share it accepted. Adaptive throttling
	// aims at Sent ≈ K·Accepted.
	Sent, Accepted float64
	// K is the throttle's multiplier.
	K float64
}

// Quota scenario: arrivals per second, accepted share, phases.
const (
	quotaRate    = 100.0
	quotaShare   = 0.3
	quotaSettle  = 10 * time.Second
	quotaMeasure = 10 * time.Second
)

// RunQuota runs a grpc-resilience client with adaptive throttling (K 2,
// window 10s) against a backend that accepts 30% of the offered calls (a
// token bucket of one second's worth) and refuses the others with
// RESOURCE_EXHAUSTED: 10s to settle, 10s measured.
func RunQuota() (QuotaResult, error) {
	r := QuotaResult{K: 2}
	impl := &capacityServer{}
	var mu sync.Mutex
	rate := quotaShare * quotaRate
	tokens, last := rate, time.Now()
	var accepted atomic.Int64
	impl.refuse = func() error {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		tokens = math.Min(rate, tokens+rate*now.Sub(last).Seconds())
		last = now
		if tokens < 1 {
			return status.Error(codes.ResourceExhausted, "over quota")
		}
		tokens--
		accepted.Add(1)
		return nil
	}
	srv, err := serve(impl)
	if err != nil {
		return r, err
	}
	defer srv.stop()
	client, cc, err := srv.client(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService"}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{Mode: serviceconfig.ModeAdaptive, K: r.K, Window: 10 * time.Second},
	})
	if err != nil {
		return r, err
	}
	defer cc.Close()
	t0 := time.Now()
	mark := make(chan [2]int64, 1) // the counts when the measurement starts
	go func() {
		time.Sleep(quotaSettle - time.Since(t0))
		mark <- [2]int64{impl.calls.Load(), accepted.Load()}
	}()
	openLoop(t0, []phase{{quotaRate, quotaSettle + quotaMeasure}}, func(int, time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, _ = client.Echo(ctx, &echov1.EchoRequest{})
	})
	m := <-mark
	offered := quotaRate * quotaMeasure.Seconds()
	r.Sent = float64(impl.calls.Load()-m[0]) / offered
	r.Accepted = float64(accepted.Load()-m[1]) / offered
	return r, nil
}
