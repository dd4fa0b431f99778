// Package overload measures server-side overload protection in real time,
// over loopback TCP, open loop, with deadlines on every call:
//
//   - Run: the step scenario. A server of fixed capacity under arrivals at
//     Low× its capacity, then High× (3× by default), then Low× again, with
//     no protection, failsafe-go's adaptive limiter (failsafegrpc) and
//     grpc-resilience's concurrency limit (server.Limits, defaults);
//     first with plain clients (no retries), then with grpc-resilience's
//     client retrying RESOURCE_EXHAUSTED and UNAVAILABLE under its default
//     retry budget. It reports goodput, the admitted p99 against the
//     unloaded p99, and how the limit came back after the step down.
//   - Hostile: honest CRITICAL callers beside a caller that sends fast
//     failures, one that sends short deadlines and never cancels (a raw
//     HTTP/2 client: the server's own timer ends its calls), or a flood of
//     SHEDDABLE calls.
//   - Fairness: two tenants, one at 10 times its fair share, one at half.
//   - Throttling: the client's adaptive throttling, in three scenarios.
//
// The server has a fixed capacity: each call holds one of Tokens tokens for
// Service (waiting for a token as long as its context lives; the work
// itself is not cancelled). Arrivals are open-loop and evenly spaced. Suite
// runs everything several times and reports min/median/max; cmd/overload
// prints it. Real time on a shared machine is noisy: run it on a quiet one
// for headline numbers.
package overload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/failsafe-go/failsafe-go/failsafegrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/server"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Config is the step scenario. Zero fields take the defaults of
// DefaultConfig.
type Config struct {
	// Tokens and Service make the capacity: Tokens/Service calls per second.
	Tokens  int
	Service time.Duration
	// Deadline is each call's deadline.
	Deadline time.Duration
	// Low and High are the loads of the phases, in multiples of capacity.
	Low, High float64
	// LowFor, HighFor and After are the phases' lengths.
	LowFor, HighFor, After time.Duration
	// Settle is skipped at the start of the overload phase for its goodput
	// and p99.
	Settle time.Duration
}

// DefaultConfig is 10 tokens of 50ms (200 calls/s), deadlines of 500ms,
// 0.5× for 2s, 3× for 4s, 0.5× for 2s, the first second of overload
// skipped.
func DefaultConfig() Config {
	return Config{
		Tokens: 10, Service: 50 * time.Millisecond, Deadline: 500 * time.Millisecond,
		Low: 0.5, High: 3, LowFor: 2 * time.Second, HighFor: 4 * time.Second, After: 2 * time.Second,
		Settle: time.Second,
	}
}

// withDefaults sets each zero field to DefaultConfig's.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	c.Tokens = cmp.Or(c.Tokens, d.Tokens)
	c.Service = cmp.Or(c.Service, d.Service)
	c.Deadline = cmp.Or(c.Deadline, d.Deadline)
	c.Low = cmp.Or(c.Low, d.Low)
	c.High = cmp.Or(c.High, d.High)
	c.LowFor = cmp.Or(c.LowFor, d.LowFor)
	c.HighFor = cmp.Or(c.HighFor, d.HighFor)
	c.After = cmp.Or(c.After, d.After)
	c.Settle = cmp.Or(c.Settle, d.Settle)
	return c
}

// capacity is the calls per second the server can serve.
func (c Config) capacity() float64 { return float64(c.Tokens) / c.Service.Seconds() }

// validate bounds the scenario so that a run stays under a few minutes.
func (c Config) validate() error {
	switch {
	case c.Tokens < 1 || c.Service <= 0 || c.Deadline <= 0:
		return errors.New("overload: Tokens, Service and Deadline must be positive")
	case c.Low <= 0 || c.High <= 0:
		return errors.New("overload: Low and High must be positive")
	case c.LowFor < 0 || c.HighFor < 0 || c.After < 0 || c.Settle < 0 || c.Settle >= c.HighFor:
		return errors.New("overload: phases must not be negative, and Settle shorter than HighFor")
	case 6*(c.LowFor+c.HighFor+c.After+c.Deadline) > 3*time.Minute:
		return errors.New("overload: the six runs would take more than 3 minutes")
	case c.capacity()*c.High > 20000:
		return errors.New("overload: more than 20000 calls per second")
	}
	return nil
}

// Contender names.
const (
	NoProtection = "no protection"
	Failsafe     = "failsafe-go adaptivelimiter"
	Ours         = "grpc-resilience"
)

// Result is one contender's numbers in one run.
type Result struct {
	Name string
	// Retrying: the client was grpc-resilience's, retrying under its
	// default budget; else a plain client, no retries.
	Retrying bool
	// UnloadedP99 is the p99 latency in the first phase.
	UnloadedP99 time.Duration
	// Goodput is the share of the capacity served within the deadline
	// during the overload phase after Settle; AdmittedP99 the p99 latency of
	// those calls, as the client saw them (with a retrying client, a call's
	// latency includes its retries and their pushback).
	Goodput     float64
	AdmittedP99 time.Duration
	// ServerUnloadedP99 and ServerAdmittedP99 are the same p99s of the
	// attempts the server answered OK, measured in the server from arrival
	// to answer (outside the limiter): the server's own latency, without
	// the network and the client, and without a retried call's earlier
	// attempts.
	ServerUnloadedP99, ServerAdmittedP99 time.Duration
	// Converge is the time from the step up until every later 500ms bucket
	// of arrivals has a goodput of 90% of its capacity or more, with a p90
	// latency within 2× UnloadedP99; Recover the time from the step down
	// until every later bucket's calls all succeed. Negative: never within
	// the phase.
	Converge, Recover time.Duration
	// LimitBefore is the median limit over the last second before the step
	// up, LimitOverload over the overload after Settle (0 without a
	// limiter); LimitBack the time from the step down until the limit is
	// within 10% of LimitBefore for the rest of the run (negative: never).
	LimitBefore, LimitOverload float64
	LimitBack                  time.Duration
	// Calls counts the calls started; Attempts the calls the server's
	// handler or limiter saw (retries included).
	Calls, Attempts int
	// Utilization is the share of the tokens' time they were held during
	// the overload after Settle; Late the calls answered OK after their
	// deadline there, as a share of the capacity. Goodput is at most
	// Utilization: what it lacks is tokens left idle (a limit below the
	// service's concurrency, gaps between a slot's release and the next
	// admission) or work done for calls that came back late.
	Utilization, Late float64
	// Codes counts the calls of the overload after Settle by the status
	// the client saw ("OK late" for an OK past the deadline).
	Codes map[string]int
	// MeanHold is the mean time a call held a token then: Service as the
	// machine delivered it. A busy machine's sleeps overshoot, and the
	// capacity the server really had is Tokens/MeanHold, not
	// Tokens/Service.
	MeanHold time.Duration
}

// AttemptsPerCall is Attempts/Calls.
func (r Result) AttemptsPerCall() float64 { return float64(r.Attempts) / float64(max(r.Calls, 1)) }

// Report is the results of one Run: no protection, failsafe-go,
// grpc-resilience with plain clients, then the same with retrying clients.
type Report struct {
	Config  Config
	Results []Result
}

// Run runs the step scenario against each contender in turn, with plain
// clients and then with retrying ones.
func Run(cfg Config) (Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return Report{}, err
	}
	rep := Report{Config: cfg}
	for _, retrying := range []bool{false, true} {
		for _, name := range []string{NoProtection, Failsafe, Ours} {
			r, err := runStep(cfg, name, retrying)
			if err != nil {
				return Report{}, fmt.Errorf("overload: %s: %w", name, err)
			}
			rep.Results = append(rep.Results, r)
		}
	}
	return rep, nil
}

// protection is a contender's server interceptor and its limit now (nil:
// none).
type protection struct {
	icpt  grpc.UnaryServerInterceptor
	limit func() int
}

func newProtection(name string) (protection, error) {
	switch name {
	case Failsafe:
		l := adaptivelimiter.NewBuilder[any]().Build()
		return protection{icpt: failsafegrpc.NewUnaryServerInterceptor[any](l), limit: l.Limit}, nil
	case Ours:
		s, err := server.New(server.WithLimits(ourLimits()))
		if err != nil {
			return protection{}, err
		}
		return protection{icpt: s.UnaryServerInterceptor(), limit: func() int { return s.LimitStatuses()[0].Limit }}, nil
	}
	return protection{}, nil
}

// OurLimit is grpc-resilience's concurrency limit in every scenario: the
// defaults unless a command sets it (cmd/overload's -queue and -queuewait
// try a queue).
var OurLimit serviceconfig.ConcurrencyLimit

// ourLimits is the server-wide limit OurLimit.
func ourLimits() server.Limits {
	l := OurLimit
	return server.Limits{Config: serviceconfig.ServerConfig{ConcurrencyLimit: &l}}
}

// retryingClient is grpc-resilience's client retrying RESOURCE_EXHAUSTED
// and UNAVAILABLE (3 attempts at most) under its default retry budget.
func retryingClient() (*interceptor.Client, error) {
	cfg, err := serviceconfig.Parse([]byte(`{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService"}],
		"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s", "backoffMultiplier": 2,
			"retryableStatusCodes": ["RESOURCE_EXHAUSTED", "UNAVAILABLE"]}}]}`))
	if err != nil {
		return nil, err
	}
	return interceptor.NewClient(interceptor.WithServiceConfig(cfg))
}

// attempts counts the calls that reach the server, and times those it
// answers OK, outside any limiter.
type attempts struct {
	t0  time.Time
	n   atomic.Int64
	rec recorder // of the attempts answered OK
}

func (a *attempts) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	a.n.Add(1)
	start := time.Since(a.t0)
	resp, err := h(ctx, req)
	if err == nil {
		a.rec.add(outcome{start: start, took: time.Since(a.t0) - start, ok: true})
	}
	return resp, err
}

// runStep runs the three phases against a server protected by name.
func runStep(cfg Config, name string, retrying bool) (Result, error) {
	prot, err := newProtection(name)
	if err != nil {
		return Result{}, err
	}
	att := &attempts{}
	chain := []grpc.UnaryServerInterceptor{att.intercept}
	if prot.icpt != nil {
		chain = append(chain, prot.icpt)
	}
	capsrv := newCapacityServer(cfg.Tokens, cfg.Service)
	srv, err := serve(capsrv, grpc.ChainUnaryInterceptor(chain...))
	if err != nil {
		return Result{}, err
	}
	defer srv.stop()
	var dopts []grpc.DialOption
	if retrying {
		c, err := retryingClient()
		if err != nil {
			return Result{}, err
		}
		dopts = c.DialOptions()
	}
	cc, err := srv.dial(dopts...)
	if err != nil {
		return Result{}, err
	}
	defer cc.Close()
	client := echov1.NewEchoServiceClient(cc)
	capacity := cfg.capacity()
	var rec recorder
	t0 := time.Now()
	att.t0 = t0
	capsrv.window(t0, cfg.LowFor+cfg.Settle, cfg.LowFor+cfg.HighFor)
	var lim *sampler
	if prot.limit != nil {
		lim = sample(t0, prot.limit)
	}
	openLoop(t0, []phase{{cfg.Low * capacity, cfg.LowFor}, {cfg.High * capacity, cfg.HighFor}, {cfg.Low * capacity, cfg.After}},
		func(_ int, start time.Duration) {
			ctx, cancel := context.WithTimeout(context.Background(), cfg.Deadline)
			defer cancel()
			began := time.Now()
			_, err := client.Echo(ctx, &echov1.EchoRequest{})
			took := time.Since(began)
			rec.add(outcome{start: start, took: took, code: status.Code(err), ok: err == nil && took <= cfg.Deadline})
		})
	r := analyse(cfg, capacity, rec.all())
	r.Name, r.Retrying, r.Attempts = name, retrying, int(att.n.Load())
	r.Utilization, r.MeanHold = capsrv.utilization(), capsrv.meanHold()
	up, down := cfg.LowFor, cfg.LowFor+cfg.HighFor
	srvOK := att.rec.all()
	_, lat := good(pick(srvOK, -1, 0, up))
	r.ServerUnloadedP99 = quantile(lat, 0.99)
	_, lat = good(pick(srvOK, -1, up+cfg.Settle, down))
	r.ServerAdmittedP99 = quantile(lat, 0.99)
	if lim != nil {
		lim.end()
		r.LimitBefore = lim.median(up-time.Second, up)
		r.LimitOverload = lim.median(up+cfg.Settle, down)
		r.LimitBack = lim.settled(down, down+cfg.After, r.LimitBefore)
	}
	return r, nil
}

// analyse computes a Result from the calls.
func analyse(cfg Config, capacity float64, calls []outcome) Result {
	up, down := cfg.LowFor, cfg.LowFor+cfg.HighFor
	r := Result{Calls: len(calls)}
	_, unloaded := good(pick(calls, -1, 0, up))
	n, admitted := good(pick(calls, -1, up+cfg.Settle, down))
	r.UnloadedP99 = quantile(unloaded, 0.99)
	r.AdmittedP99 = quantile(admitted, 0.99)
	r.Goodput = float64(n) / (capacity * (cfg.HighFor - cfg.Settle).Seconds())
	late := 0
	r.Codes = map[string]int{}
	for _, o := range pick(calls, -1, up+cfg.Settle, down) {
		c := o.code.String()
		if o.code == codes.OK && !o.ok {
			late++
			c = "OK late"
		}
		r.Codes[c]++
	}
	r.Late = float64(late) / (capacity * (cfg.HighFor - cfg.Settle).Seconds())
	r.Converge = settleTime(calls, up, down, func(b []outcome) bool {
		n, ok := good(b)
		return float64(n) >= 0.9*capacity*bucket.Seconds() && quantile(ok, 0.9) <= 2*r.UnloadedP99
	})
	r.Recover = settleTime(calls, down, down+cfg.After, func(b []outcome) bool {
		n, _ := good(b)
		return n == len(b)
	})
	return r
}

const bucket = 500 * time.Millisecond

// settleTime returns the time from `from` to the start of the first bucket
// after which every bucket up to `to` satisfies ok; -1 when the last
// bucket does not.
func settleTime(calls []outcome, from, to time.Duration, ok func([]outcome) bool) time.Duration {
	var buckets [][]outcome
	for b := from; b < to; b += bucket {
		buckets = append(buckets, pick(calls, -1, b, min(b+bucket, to)))
	}
	settled := -1
	for i := len(buckets) - 1; i >= 0; i-- {
		if !ok(buckets[i]) {
			break
		}
		settled = i
	}
	if settled < 0 {
		return -1
	}
	return time.Duration(settled) * bucket
}

// Markdown renders the report as tables with the scenario above them.
func (r Report) Markdown() string {
	c := r.Config
	var b strings.Builder
	fmt.Fprintf(&b, "Open-loop overload over loopback TCP: %d tokens × %v (capacity %.0f calls/s), deadline %v; %.1f× for %v, %.1f× for %v, %.1f× for %v; goodput and p99 over the overload after %v.\n\n",
		c.Tokens, c.Service, c.capacity(), c.Deadline, c.Low, c.LowFor, c.High, c.HighFor, c.Low, c.After, c.Settle)
	b.WriteString("| server | client | unloaded p99 | goodput (of capacity) | admitted p99 | p99 ratio | attempts/call | limit before / during / back within 10% after |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.Results {
		client := "plain, no retries"
		if x.Retrying {
			client = "ours, retrying (default budget)"
		}
		lim := "—"
		if x.LimitBefore > 0 {
			lim = fmt.Sprintf("%.0f / %.0f / %s", x.LimitBefore, x.LimitOverload, settled(x.LimitBack))
		}
		fmt.Fprintf(&b, "| %s | %s | %v | %.1f%% | %v | %.2f× | %.2f | %s |\n", x.Name, client, x.UnloadedP99.Round(time.Millisecond),
			100*x.Goodput, x.AdmittedP99.Round(time.Millisecond), ratio(x.AdmittedP99, x.UnloadedP99), x.AttemptsPerCall(), lim)
	}
	return b.String()
}

// ratio is a/b, 0 when b is 0.
func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func settled(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.String()
}
