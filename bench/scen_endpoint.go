package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	_ "google.golang.org/grpc/xds" // registers outlier_detection_experimental (gRFC A50) for the side-by-side rows

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/endpoint"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The endpoint scenarios (issue 22) run three backends on loopback TCP
// behind one target (resiliencetest.ServeCluster), in real time, and
// compare the resilience_endpoint policy with grpc-go's own balancers.

const (
	epBackends = 3
	epCallers  = 16
	// epRetryPolicy is every peer's retry policy: maxAttempts 2.
	epRetryPolicy = `"retryPolicy":{"maxAttempts":2,"initialBackoff":"0.01s","maxBackoff":"0.1s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}`
)

// epPeer is one client setup of the endpoint scenarios.
type epPeer struct {
	name string
	// dial returns the dial options; lb is the loadBalancingConfig entry,
	// methods the methodConfig's extra fields (after the name).
	dial func(lb, methods, extra string) ([]grpc.DialOption, error)
	lb   string
}

// oursLB is ours with a load-balancing config.
func oursLB(name, lb string) epPeer {
	return epPeer{name: name, lb: lb, dial: func(lb, methods, extra string) ([]grpc.DialOption, error) {
		doc := fmt.Sprintf(`{"methodConfig":[{"name":[{"service":%q}],%s}]%s}`, echoService, methods, extra)
		cfg, err := serviceconfig.Parse([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("bench: %s: %w", name, err)
		}
		c, err := interceptor.NewClient(interceptor.WithServiceConfig(cfg))
		if err != nil {
			return nil, err
		}
		return append(c.DialOptions(), grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[`+lb+`]}`)), nil
	}}
}

// grpcLB is grpc-go's built-in retry with a load-balancing config.
func grpcLB(name, lb string) epPeer {
	return epPeer{name: name, lb: lb, dial: func(lb, methods, _ string) ([]grpc.DialOption, error) {
		return []grpc.DialOption{grpc.WithDefaultServiceConfig(fmt.Sprintf(
			`{"loadBalancingConfig":[%s],"methodConfig":[{"name":[{"service":%q}],%s}]}`, lb, echoService, methods))}, nil
	}}
}

// Row names the targets read.
const (
	epOursRR     = "grpc-resilience, resilience_endpoint (round_robin)"
	epOursPF     = "grpc-resilience, resilience_endpoint (pick_first)"
	epOursHedged = "grpc-resilience hedged, resilience_endpoint (round_robin)"
)

const (
	lbOursRR      = `{"resilience_endpoint":{"childPolicy":[{"round_robin":{}}]}}`
	lbOursPF      = `{"resilience_endpoint":{"childPolicy":[{"pick_first":{}}]}}`
	lbRR          = `{"round_robin":{}}`
	lbPF          = `{"pick_first":{}}`
	lbOutlierBase = `{"outlier_detection_experimental":{"interval":"10s","baseEjectionTime":"30s","maxEjectionPercent":50,` +
		`"failurePercentageEjection":{"threshold":50,"minimumHosts":3,"requestVolume":20},"childPolicy":[{"round_robin":{}}]}}`
)

// epCluster is one run's cluster with what its backends saw: per attempt,
// when it arrived, and whether it was a call's first.
type epCluster struct {
	*resiliencetest.Cluster
	stop  func()
	start time.Time
	mu    sync.Mutex
	seen  [][]epArrival // per backend
	// behave decides each backend's answer; set before the load starts.
	behave func(backend int, at time.Duration) resiliencetest.Step
}

type epArrival struct {
	at    time.Duration
	first bool
	call  string // the call-id header, when sent
}

func startEPCluster(opts []grpc.DialOption) (*epCluster, error) {
	cl, stop, err := resiliencetest.ServeCluster(epBackends, opts, resiliencetest.WithLoopbackTCP())
	if err != nil {
		return nil, err
	}
	c := &epCluster{Cluster: cl, stop: stop, seen: make([][]epArrival, epBackends)}
	for i, b := range cl.Backends {
		b.OnCall(func(a resiliencetest.Attempt) resiliencetest.Step {
			arr := epArrival{first: a.Previous <= 0}
			if v := a.MD.Get("call-id"); len(v) > 0 {
				arr.call = v[0]
			}
			c.mu.Lock()
			arr.at = time.Since(c.start)
			c.seen[i] = append(c.seen[i], arr)
			behave := c.behave
			c.mu.Unlock()
			if behave == nil {
				return resiliencetest.Step{}
			}
			return behave(i, arr.at)
		})
	}
	return c, nil
}

// warm makes one call per backend's worth so that connections are up.
func (c *epCluster) warm(ctx context.Context) {
	echo := c.EchoClient()
	for range 2 * epBackends {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		_, _ = echo.Echo(wctx, &echov1.EchoRequest{Message: "warm"}, grpc.WaitForReady(true))
		cancel()
	}
	c.mu.Lock()
	c.seen = make([][]epArrival, epBackends)
	c.mu.Unlock()
}

// run drives 16 closed-loop callers for d, each call with a 2 s deadline
// and a call-id header, and returns the outcomes.
func (c *epCluster) run(ctx context.Context, d time.Duration) *load {
	echo := c.EchoClient()
	var l load
	start := time.Now()
	c.mu.Lock()
	c.start = start
	c.mu.Unlock()
	l.closedLoop(ctx, epCallers, 0, start.Add(d), func(ctx context.Context, i int) error {
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "call-id", strconv.Itoa(i))
		_, err := echo.Echo(ctx, &echov1.EchoRequest{Message: "e"})
		return err
	})
	return &l
}

func successRate(l *load) (ok, n int) {
	for _, o := range l.outcomes {
		if o.err == nil {
			ok++
		}
	}
	return ok, len(l.outcomes)
}

func percent(a, b int) string {
	if b == 0 {
		return "n/a"
	}
	return strconv.FormatFloat(100*float64(a)/float64(b), 'f', 2, 64) + "%"
}

// badShare returns the share of first attempts backend bad received in
// [from, to), and the first instant after which every 100 ms bucket gives
// it under 1% of the first attempts (-1: never).
func (c *epCluster) badShare(bad int, from, to time.Duration) (share string, below time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	const bucket = 100 * time.Millisecond
	nb := int(to/bucket) + 1
	badB, allB := make([]int, nb), make([]int, nb)
	badN, allN := 0, 0
	for b, arrs := range c.seen {
		for _, a := range arrs {
			if !a.first || a.at >= to {
				continue
			}
			k := int(a.at / bucket)
			allB[k]++
			if b == bad {
				badB[k]++
			}
			if a.at >= from {
				allN++
				if b == bad {
					badN++
				}
			}
		}
	}
	// below: just after the last bucket where it had 1% or more; never
	// when that is the last bucket.
	below = 0
	for k := range nb {
		if allB[k] > 0 && badB[k]*100 >= allB[k] {
			below = time.Duration(k+1) * bucket
			if k == nb-1 {
				below = -1
			}
		}
	}
	return percent(badN, allN), below
}

// retriesTo returns how many retries (not first attempts) backend b saw,
// and how many all backends saw.
func (c *epCluster) retriesTo(b int) (n, all int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, arrs := range c.seen {
		for _, a := range arrs {
			if !a.first {
				all++
				if i == b {
					n++
				}
			}
		}
	}
	return n, all
}

// setBehavior sets what the backends answer from now on.
func (c *epCluster) setBehavior(f func(backend int, at time.Duration) resiliencetest.Step) {
	c.mu.Lock()
	c.behave = f
	c.mu.Unlock()
}

func (c *epCluster) attempts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, arrs := range c.seen {
		n += len(arrs)
	}
	return n
}

// fmtBelow writes d in milliseconds, or "never" when negative.
func fmtBelow(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return strconv.FormatInt(d.Milliseconds(), 10)
}

// EndpointFailing is the first target: one backend of three fails
// every call.
func EndpointFailing() Scenario {
	return Scenario{
		Name: "endpoint-failing",
		Workload: "Three backends on loopback TCP behind one target (manual resolver); backend 0, first in the resolver's order, " +
			"fails every call with UNAVAILABLE from the start. maxAttempts 2 (backoff 10 ms), 16 closed-loop callers, each call " +
			"with a 2 s deadline, for 4 phases. Ours: interceptor.NewClient with the retry policy and its default retry budget, " +
			"under resilience_endpoint (defaults: consecutiveFailures 5, baseEjectionTime 30 s, maxEjectionPercent 50). grpc-go: " +
			"its built-in retry (same policy) under round_robin, pick_first, and outlier_detection_experimental (gRFC A50, " +
			"through google.golang.org/grpc/xds; interval 10 s (A50's default), failurePercentageEjection threshold 50, " +
			"minimumHosts 3, requestVolume 20, maxEjectionPercent 50, child round_robin). 'bad share' is backend 0's share of " +
			"first attempts; 'under 1% from' is the first instant after which every 100 ms gives it under 1% of first attempts.",
		Run: runEndpointFailing,
	}
}

func runEndpointFailing(ctx context.Context, sz Size) ([]Table, error) {
	peers := []epPeer{
		oursLB(epOursRR, lbOursRR),
		oursLB(epOursPF, lbOursPF),
		oursLB("grpc-resilience, round_robin", lbRR),
		grpcLB("grpc-go retry, round_robin", lbRR),
		grpcLB("grpc-go retry, pick_first", lbPF),
		grpcLB("grpc-go retry, outlier_detection (round_robin)", lbOutlierBase),
	}
	d := 4 * sz.Phase
	t := Table{Title: "One backend of three failing every call (maxAttempts 2, 16 callers)",
		Header: []string{"peer", "calls", "success", "bad share of first attempts, 0–2 s", "after 2 s", "under 1% from (ms)", "retries to the bad backend", "retries", "attempts/call"}}
	for _, p := range peers {
		opts, err := p.dial(p.lb, epRetryPolicy, "")
		if err != nil {
			return nil, err
		}
		c, err := startEPCluster(opts)
		if err != nil {
			return nil, err
		}
		c.warm(ctx)
		c.setBehavior(func(b int, at time.Duration) resiliencetest.Step {
			if b == 0 {
				return resiliencetest.Step{Code: codes.Unavailable}
			}
			return resiliencetest.Step{}
		})
		l := c.run(ctx, d)
		ok, n := successRate(l)
		early, below := c.badShare(0, 0, min(2*time.Second, d))
		late, _ := c.badShare(0, min(2*time.Second, d), d+callTimeout)
		r, all := c.retriesTo(0)
		t.Rows = append(t.Rows, []string{p.name, strconv.Itoa(n), percent(ok, n), early, late, fmtBelow(below),
			strconv.Itoa(r), strconv.Itoa(all), strconv.FormatFloat(float64(c.attempts())/float64(max(n, 1)), 'f', 2, 64)})
		c.stop()
	}
	t.Notes = append(t.Notes, "targets (issue 22): ours ≥ 99.9% success; the bad backend under 1% of first attempts within 2 s.",
		"pick_first rows: backend 0 comes first, so grpc-go's pick_first sends every attempt to it.")
	return []Table{t}, nil
}

// EndpointRecovery is the second target: a backend bad for a
// while, then healthy, comes back within its ejection time.
func EndpointRecovery() Scenario {
	return Scenario{
		Name: "endpoint-recovery",
		Workload: "Three backends on loopback TCP; backend 0 fails every call with UNAVAILABLE for the first phase, then " +
			"answers. 16 closed-loop callers for 4 phases, maxAttempts 2. Ours: resilience_endpoint with baseEjectionTime " +
			"one phase (1 s at the default size); grpc-go: outlier_detection_experimental with interval and baseEjectionTime of one phase (A50). 'back after' is " +
			"the time from the recovery to backend 0's first successful first attempt; 'share after' its share of first " +
			"attempts from 1.5 s after the recovery on.",
		Run: runEndpointRecovery,
	}
}

func runEndpointRecovery(ctx context.Context, sz Size) ([]Table, error) {
	peers := []epPeer{
		oursLB(epOursRR, fmt.Sprintf(`{"resilience_endpoint":{"baseEjectionTime":"%gs"}}`, sz.Phase.Seconds())),
		grpcLB("grpc-go retry, outlier_detection (round_robin)", fmt.Sprintf(`{"outlier_detection_experimental":{"interval":"%gs","baseEjectionTime":"%gs",`+
			`"maxEjectionPercent":50,"failurePercentageEjection":{"threshold":50,"minimumHosts":3,"requestVolume":20},"childPolicy":[{"round_robin":{}}]}}`,
			sz.Phase.Seconds(), sz.Phase.Seconds())),
		grpcLB("grpc-go retry, round_robin", lbRR),
	}
	bad := sz.Phase
	d := 4 * sz.Phase
	t := Table{Title: "A backend bad for one phase, then healthy (ejection time: one phase)",
		Header: []string{"peer", "success", "bad share of first attempts while bad", "back after (ms)", "share after"}}
	for _, p := range peers {
		opts, err := p.dial(p.lb, epRetryPolicy, "")
		if err != nil {
			return nil, err
		}
		c, err := startEPCluster(opts)
		if err != nil {
			return nil, err
		}
		c.warm(ctx)
		c.setBehavior(func(b int, at time.Duration) resiliencetest.Step {
			if b == 0 && at < bad {
				return resiliencetest.Step{Code: codes.Unavailable}
			}
			return resiliencetest.Step{}
		})
		l := c.run(ctx, d)
		ok, n := successRate(l)
		during, _ := c.badShare(0, 0, bad)
		after, _ := c.badShare(0, bad+1500*time.Millisecond, d+callTimeout)
		back := "never"
		c.mu.Lock()
		for _, a := range c.seen[0] {
			if a.first && a.at >= bad {
				back = strconv.FormatInt((a.at - bad).Milliseconds(), 10)
				break
			}
		}
		c.mu.Unlock()
		t.Rows = append(t.Rows, []string{p.name, percent(ok, n), during, back, after})
		c.stop()
	}
	t.Notes = append(t.Notes, "target (issue 22): back in rotation within its ejection time after it recovers (one phase, or two after a second ejection in a row).")
	return []Table{t}, nil
}

// EndpointHedge is the third target: hedges to a different
// endpoint when one backend is 10× slower.
func EndpointHedge() Scenario {
	return Scenario{
		Name: "endpoint-hedge",
		Workload: "Three backends on loopback TCP; backends 0 and 2 answer in 5 ms, backend 1 in 50 ms (10× slower). 16 " +
			"closed-loop callers for 4 phases. Ours with hedgingPolicy {maxAttempts 2, hedgingDelay 7 ms} and a retry budget " +
			"of ratio 1 (a third of the calls need a hedge; under 1, a fixed delay is rationed to the slowest 5%, and an " +
			"adaptive one's allowance leaves about 1% of calls unhedged in bursts), under resilience_endpoint " +
			"or round_robin; and ours unhedged under round_robin for the baseline p99. 'hedges elsewhere' is the share of " +
			"calls with two copies whose copies reached two different backends (told apart by a call-id header).",
		Run: runEndpointHedge,
	}
}

func runEndpointHedge(ctx context.Context, sz Size) ([]Table, error) {
	const hedge = `"hedgingPolicy":{"maxAttempts":2,"hedgingDelay":"0.007s","nonFatalStatusCodes":["UNAVAILABLE"]}`
	const budget = `,"retryBudget":{"ratio":1,"minRetriesPerSecond":10,"ttl":"10s"}`
	rows := []struct {
		p       epPeer
		methods string
	}{
		{oursLB("grpc-resilience unhedged, round_robin", lbRR), epRetryPolicy},
		{oursLB("grpc-resilience hedged, round_robin", lbRR), hedge},
		{oursLB(epOursHedged, lbOursRR), hedge},
	}
	d := 4 * sz.Phase
	t := Table{Title: "One backend of three 10× slower, hedging on",
		Header: []string{"peer", "calls", "p50 (ms)", "p99 (ms)", "p99 / unhedged p99", "hedged calls", "hedges elsewhere"}}
	var baseP99 time.Duration
	for _, r := range rows {
		opts, err := r.p.dial(r.p.lb, r.methods, budget)
		if err != nil {
			return nil, err
		}
		c, err := startEPCluster(opts)
		if err != nil {
			return nil, err
		}
		c.warm(ctx)
		c.setBehavior(func(b int, at time.Duration) resiliencetest.Step {
			if b == 1 {
				return resiliencetest.Step{Delay: 50 * time.Millisecond}
			}
			return resiliencetest.Step{Delay: 5 * time.Millisecond}
		})
		l := c.run(ctx, d)
		time.Sleep(100 * time.Millisecond) // the losers' arrivals are in
		var lat []time.Duration
		for _, o := range l.outcomes {
			if o.err == nil {
				lat = append(lat, o.end.Sub(o.start))
			}
		}
		slices.Sort(lat)
		p50, p99 := quantile(lat, 0.5), quantile(lat, 0.99)
		if baseP99 == 0 {
			baseP99 = p99
		}
		hedged, elsewhere := c.hedgePairs()
		t.Rows = append(t.Rows, []string{r.p.name, strconv.Itoa(len(l.outcomes)), ms(p50), ms(p99),
			strconv.FormatFloat(float64(p99)/float64(baseP99), 'f', 2, 64),
			percent(hedged, len(l.outcomes)), percent(elsewhere, hedged)})
		c.stop()
	}
	t.Notes = append(t.Notes, "targets (issue 22): ≥ 99% of hedges to a different endpoint; p99 ≤ 0.2× the unhedged p99.",
		"a hedged slow call ends at the hedging delay + the fast latency at best; with the delay just above the fast mode (7 ms against 5 ms), p99/unhedged ≥ (7 + 5)/50 ≈ 0.24: the 0.2 target is below what a delay above the fast latency allows.")
	return []Table{t}, nil
}

// ms writes d in milliseconds with two decimals.
func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
}

// hedgePairs counts the calls that reached the backends twice, and those
// of them whose two copies went to different backends.
func (c *epCluster) hedgePairs() (hedged, elsewhere int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	where := map[string][]int{}
	for b, arrs := range c.seen {
		for _, a := range arrs {
			if a.call != "" {
				where[a.call] = append(where[a.call], b)
			}
		}
	}
	for _, bs := range where {
		if len(bs) < 2 {
			continue
		}
		hedged++
		if bs[0] != bs[1] {
			elsewhere++
		}
	}
	return hedged, elsewhere
}

// EndpointOutage is the fourth target: a whole-cluster outage.
func EndpointOutage() Scenario {
	return Scenario{
		Name: "endpoint-outage",
		Workload: "Three backends on loopback TCP, all failing every call with UNAVAILABLE, 16 closed-loop callers for 4 " +
			"phases. Ours with maxAttempts 2, the default retry budget, and a circuitBreaker {consecutiveFailures 5, " +
			"openDuration 1s}, under resilience_endpoint (maxEjectionPercent 50) or round_robin: the breaker and the budget " +
			"must act alike under both. 'most ejected' samples Snapshots every 5 ms.",
		Run: runEndpointOutage,
	}
}

func runEndpointOutage(ctx context.Context, sz Size) ([]Table, error) {
	const methods = epRetryPolicy + `,"circuitBreaker":{"consecutiveFailures":5,"openDuration":"1s"}`
	peers := []epPeer{
		oursLB(epOursRR, `{"resilience_endpoint":{"maxEjectionPercent":50}}`),
		oursLB("grpc-resilience, round_robin", lbRR),
	}
	d := 4 * sz.Phase
	t := Table{Title: "Whole-cluster outage",
		Header: []string{"peer", "calls", "most ejected at once", "ejections refused", "attempts/call", "calls refused by the breaker"}}
	for _, p := range peers {
		opts, err := p.dial(p.lb, methods, "")
		if err != nil {
			return nil, err
		}
		c, err := startEPCluster(opts)
		if err != nil {
			return nil, err
		}
		c.warm(ctx)
		c.setBehavior(func(int, time.Duration) resiliencetest.Step { return resiliencetest.Step{Code: codes.Unavailable} })
		var most atomic.Int64
		var overflow atomic.Uint64
		done := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			tk := time.NewTicker(5 * time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-done:
					return
				case <-tk.C:
				}
				for _, s := range endpoint.Snapshots(time.Now()) {
					if s.Target != c.Conn.Target() {
						continue
					}
					n := int64(0)
					for _, e := range s.Endpoints {
						if !e.EjectedUntil.IsZero() {
							n++
						}
					}
					if n > most.Load() {
						most.Store(n)
					}
					overflow.Store(s.Overflow)
				}
			}
		}()
		l := c.run(ctx, d)
		close(done)
		<-sampled
		refused := 0
		for _, o := range l.outcomes {
			if errorsIsOpen(o.err) {
				refused++
			}
		}
		mostS, overS := "n/a", "n/a"
		if p.lb != lbRR {
			mostS = strconv.FormatInt(most.Load(), 10)
			overS = strconv.FormatUint(overflow.Load(), 10)
		}
		t.Rows = append(t.Rows, []string{p.name, strconv.Itoa(len(l.outcomes)), mostS, overS,
			strconv.FormatFloat(float64(c.attempts())/float64(max(len(l.outcomes), 1)), 'f', 2, 64), percent(refused, len(l.outcomes))})
		c.stop()
	}
	t.Notes = append(t.Notes, "target (issue 22): at most maxEjectionPercent (50% of 3: one endpoint) ejected; the breaker and budget as under round_robin.")
	return []Table{t}, nil
}

func errorsIsOpen(err error) bool {
	return err != nil && errors.Is(err, interceptor.ErrCircuitOpen)
}

// HedgeBudget is the hedging target of issue 32: one backend of three 50×
// slower, hedging with the default retry budget, open loop at a rate where
// the budget pays for the slow third and at one where it cannot.
func HedgeBudget() Scenario {
	return Scenario{
		Name: "hedge-budget",
		Workload: "Three backends on loopback TCP under round_robin; backends 0 and 2 answer in 2 ms, backend 1 in 100 ms (50× " +
			"slower). Open loop for 12 s (the retry budget's 10 s window and more), each call with a 2 s deadline, at 40 and " +
			"at 400 calls a second. Ours unhedged, and hedged {maxAttempts 2, hedgingDelay 5 ms} under the default retry " +
			"budget (ratio 0.2, minRetriesPerSecond 10, ttl 10s), which pays for a share 0.2 + 10/rate of the calls: 45% at " +
			"40 a second, more than the slow third; 22.5% at 400, less. The delay follows the latency that share of calls " +
			"outlasts (package interceptor, What a hedge may spend). Extra attempts are the backends' attempts per call minus 1; " +
			"p99 over the calls after the first 2 s.",
		Run: runHedgeBudget,
	}
}

// Row names of hedge-budget.
const (
	hbUnhedged = "grpc-resilience unhedged, round_robin"
	hbHedged   = "grpc-resilience hedged 5 ms, default budget, round_robin"
)

func runHedgeBudget(ctx context.Context, sz Size) ([]Table, error) {
	const hedge = `"hedgingPolicy":{"maxAttempts":2,"hedgingDelay":"0.005s"}`
	d := 12 * sz.Phase
	t := Table{Title: "One backend of three 50× slower, hedging under the default retry budget",
		Header: []string{"peer", "calls/s", "budget's share", "calls", "p50 (ms)", "p99 (ms)", "p99 / unhedged p99", "extra attempts"}}
	for _, rate := range []float64{40, 400} {
		var baseP99 time.Duration
		for _, r := range []struct {
			name, methods string
		}{{hbUnhedged, `"timeout":"10s"`}, {hbHedged, hedge}} {
			opts, err := oursLB(r.name, lbRR).dial(lbRR, r.methods, "")
			if err != nil {
				return nil, err
			}
			c, err := startEPCluster(opts)
			if err != nil {
				return nil, err
			}
			c.warm(ctx)
			c.setBehavior(func(b int, _ time.Duration) resiliencetest.Step {
				if b == 1 {
					return resiliencetest.Step{Delay: 100 * time.Millisecond}
				}
				return resiliencetest.Step{Delay: 2 * time.Millisecond}
			})
			var l load
			start := time.Now()
			echo := c.EchoClient()
			l.openLoop(ctx, rate, start.Add(d), func(ctx context.Context, _ int) error {
				ctx, cancel := context.WithTimeout(ctx, callTimeout)
				defer cancel()
				_, err := echo.Echo(ctx, &echov1.EchoRequest{Message: "h"})
				return err
			})
			time.Sleep(300 * time.Millisecond) // the losers' arrivals are in
			var lat []time.Duration
			for _, o := range l.outcomes {
				if o.err == nil && !o.start.Before(start.Add(d/6)) {
					lat = append(lat, o.end.Sub(o.start))
				}
			}
			slices.Sort(lat)
			p50, p99 := quantile(lat, 0.5), quantile(lat, 0.99)
			if baseP99 == 0 {
				baseP99 = p99
			}
			extra := float64(c.attempts()-len(l.outcomes)) / float64(len(l.outcomes))
			t.Rows = append(t.Rows, []string{r.name, strconv.FormatFloat(rate, 'f', 0, 64), pct(0.2 + 10/rate),
				strconv.Itoa(len(l.outcomes)), ms(p50), ms(p99), strconv.FormatFloat(float64(p99)/float64(baseP99), 'f', 2, 64), pct(extra)})
			c.stop()
		}
	}
	t.Notes = append(t.Notes, "target (issue 32): at 40 calls a second, p99 ≤ 0.5× the unhedged, for extra attempts within the budget's share. "+
		"At 400 a second the slow third is more than the budget pays for: hedging cannot lower the p99 (the extra attempts, the budget's share, buy the p90 and the mean).")
	return []Table{t}, nil
}
