package bench

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// The saturation workload. The rule of thumb it shows: a bulkhead's
// maxConcurrent on a slow method must stay below the connection's
// MaxConcurrentStreams minus what the other methods need at once, here
// 48 < 64 - 1 fast caller, with room to spare.
const (
	satStreams      = 64                     // the server's MaxConcurrentStreams
	satSlowCallers  = 128                    // closed-loop callers of the slow method
	satSlowDelay    = 100 * time.Millisecond // the slow method's time per call
	satSlowBulkhead = 48                     // ours: bulkhead maxConcurrent on the slow method
	satLimit        = 1.5                    // the fast method's loaded p99 must stay within this × its idle p99
)

// Saturation shows per-method isolation: a slow method fills the
// connection's streams while a fast one is called.
func Saturation() Scenario {
	return Scenario{
		Name: "slow method saturating the connection (per-method isolation)",
		Workload: fmt.Sprintf("The server allows %d concurrent streams per connection (grpc.MaxConcurrentStreams). "+
			"Lookup (the slow method) takes %v; Echo (the fast one) answers at once. One connection per peer. "+
			"First one caller makes 2×Size.Calls sequential Echo calls on the idle connection (idle p99); then %d closed-loop "+
			"callers call Lookup while the same caller makes 2×Size.Calls Echo calls again, and for at least 3 slow calls' time, at most "+
			"max(Size.Phase, 3 slow calls' time) (loaded p99 of "+
			"the successful ones; failed ones counted). "+
			"Ours has a bulkhead of %d on Lookup alone (maxQueueWait 1 s), below the connection's capacity. "+
			"Rule of thumb: a slow method's bulkhead maxConcurrent < the connection's MaxConcurrentStreams minus the fast "+
			"methods' peak concurrency; then the slow method queues in its own bulkhead, not in the transport, "+
			"where it would make every method wait for a stream. Pass: loaded p99 ≤ %.1f× idle p99.",
			satStreams, satSlowDelay, satSlowCallers, satSlowBulkhead, satLimit),
		Run: runSaturation,
	}
}

func runSaturation(ctx context.Context, sz Size) ([]Table, error) {
	pol := DefaultPolicy
	pol.SlowBulkhead = satSlowBulkhead
	peers := retryPeers()
	t := Table{
		Header: []string{"peer", "fast loaded p99 / own idle p99", "fast calls failed", fmt.Sprintf("within %.1f×", satLimit), "slow calls succeeded"},
	}
	for _, p := range peers {
		opts, cannot, err := p.setup(pol, needUnary)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		if cannot != "" {
			t.Rows = append(t.Rows, []string{p.name, "(" + cannot + ")", "—", "—", "—"})
			continue
		}
		res, err := saturate(ctx, opts, 2*sz.Calls, sz.Phase)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		r := float64(res.loaded) / float64(res.idle)
		pass := "no"
		if r <= satLimit && res.fastFailed == 0 {
			pass = "yes"
		}
		t.Rows = append(t.Rows, []string{p.name, ratio(r),
			strconv.Itoa(res.fastFailed), pass, pct(res.slowOK)})
	}
	return []Table{t}, nil
}

// satResult is one peer's saturation run.
type satResult struct {
	idle, loaded time.Duration // the fast method's p99, idle and under load
	fastFailed   int           // fast calls that failed under load
	slowOK       float64       // the slow calls' success rate
}

// saturate measures the fast method's p99 over n calls on the idle
// connection, then over at most n calls for at most phase while the slow
// method saturates the connection.
func saturate(ctx context.Context, opts []grpc.DialOption, n int, phase time.Duration) (satResult, error) {
	ts, err := StartServer(Bufconn, grpc.MaxConcurrentStreams(satStreams))
	if err != nil {
		return satResult{}, err
	}
	defer ts.Stop()
	ts.SetBehavior(func(method, _ string, _ int) (time.Duration, error) {
		if method == MethodLookup {
			return satSlowDelay, nil
		}
		return 0, nil
	})
	cc, err := ts.Dial(opts...)
	if err != nil {
		return satResult{}, err
	}
	defer cc.Close()
	c := echov1.NewEchoServiceClient(cc)
	fc := &fastCaller{ctx: ctx, c: c, n: n}
	var idle time.Duration
	for range 2 { // warm up, then idle
		var failed int
		if idle, failed, err = fc.run(0, time.Hour); err != nil || failed > 0 {
			return satResult{}, fmt.Errorf("fast calls on the idle connection: %d failed (%v)", failed, err)
		}
	}

	slowCtx, stopSlow := context.WithCancel(ctx)
	var (
		l  load
		wg sync.WaitGroup
	)
	wg.Go(func() {
		l.closedLoop(slowCtx, satSlowCallers, 0, time.Now().Add(time.Hour), func(ctx context.Context, i int) error {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err := c.Lookup(ctx, &echov1.LookupRequest{Message: "s" + strconv.Itoa(i)})
			return err
		})
	})
	// The slow callers have filled what they can fill once the server holds
	// at least the smaller of the connection's streams and ours' bulkhead.
	for deadline := time.Now().Add(5 * time.Second); ts.InFlight() < satSlowBulkhead; {
		if time.Now().After(deadline) {
			stopSlow()
			wg.Wait()
			return satResult{}, fmt.Errorf("slow callers: %d in flight after 5 s, want %d", ts.InFlight(), satSlowBulkhead)
		}
		time.Sleep(time.Millisecond)
	}
	// At least 3 slow calls' time, so that slow calls cycle through the
	// streams (or ours' bulkhead) while the fast ones are measured.
	loaded, fastFailed, err := fc.run(3*satSlowDelay, max(phase, 3*satSlowDelay))
	stopAt := time.Now()
	stopSlow()
	wg.Wait()
	if err != nil {
		return satResult{}, fmt.Errorf("fast calls under load: %w", err)
	}
	return satResult{idle: idle, loaded: loaded, fastFailed: fastFailed, slowOK: slowSuccess(&l, stopAt)}, nil
}

// slowSuccess is the share of slow calls that succeeded, less those that
// failed because the run stopped them at stopAt; NaN when none ended.
func slowSuccess(l *load, stopAt time.Time) float64 {
	ok, total := 0, 0
	for _, o := range l.outcomes {
		if o.err != nil && !o.end.Before(stopAt) {
			continue
		}
		total++
		if o.err == nil {
			ok++
		}
	}
	if total == 0 {
		return math.NaN()
	}
	return float64(ok) / float64(total)
}

// fastCaller makes the fast method's sequential calls, each with a new
// message, and times them.
type fastCaller struct {
	ctx  context.Context
	c    echov1.EchoServiceClient
	n    int // calls per run, at least
	next int // the next call's number
}

// run makes fast calls until it has made n and least has passed, but for
// at most budget, and returns the p99 of the successful ones and how many
// failed.
func (f *fastCaller) run(least, budget time.Duration) (p99 time.Duration, failed int, err error) {
	ds := make([]time.Duration, 0, f.n)
	start := time.Now()
	for i := 0; (i < f.n || time.Since(start) < least) && time.Since(start) < budget; i++ {
		d, err := f.call()
		if err != nil {
			failed++
			continue
		}
		ds = append(ds, d)
	}
	if len(ds) == 0 {
		return 0, failed, fmt.Errorf("every fast call failed")
	}
	return quantile(ds, 0.99), failed, nil
}

func (f *fastCaller) call() (time.Duration, error) {
	ctx, cancel := context.WithTimeout(f.ctx, 5*time.Second)
	defer cancel()
	f.next++
	start := time.Now()
	_, err := f.c.Echo(ctx, &echov1.EchoRequest{Message: "f" + strconv.Itoa(f.next)})
	return time.Since(start), err
}
