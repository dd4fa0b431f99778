// Package overload compares server-side overload protection in one
// open-loop scenario: no protection, failsafe-go's adaptive limiter through
// its gRPC server interceptor (failsafegrpc), and grpc-resilience's
// adaptive concurrency limit (interceptor.WithConcurrencyLimit).
//
// The server has a fixed capacity: each call holds one of Tokens tokens for
// Service (waiting for a token as long as its context lives; the work
// itself is not cancelled). Arrivals are open-loop, evenly spaced, each with
// its own Deadline, in three phases: Low× capacity, then High× (the step
// up), then Low× again (the step down). It runs in real time; with the
// defaults about 9s per contender.
//
// For each contender the report gives, over the overload phase after its
// first Settle: the goodput (calls that succeed within their deadline) as
// a share of the capacity, and the p99 latency of the calls that
// succeeded; the convergence time after the step up (until, in every later
// 500ms bucket of arrivals, the calls that succeeded are at least 90% of
// the bucket's capacity and their p90 latency is within 2× the unloaded
// p99); and the recovery time after the step down (until every later
// bucket has all its calls succeed). The unloaded p99 is each contender's own in the first
// phase.
package overload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/failsafe-go/failsafe-go/failsafegrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Config is the scenario. Zero fields take the defaults of DefaultConfig.
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

// validate bounds the scenario so that a run stays under a minute.
func (c Config) validate() error {
	switch {
	case c.Tokens < 1 || c.Service <= 0 || c.Deadline <= 0:
		return errors.New("overload: Tokens, Service and Deadline must be positive")
	case c.Low <= 0 || c.High <= 0:
		return errors.New("overload: Low and High must be positive")
	case c.LowFor < 0 || c.HighFor < 0 || c.After < 0 || c.Settle < 0 || c.Settle >= c.HighFor:
		return errors.New("overload: phases must not be negative, and Settle shorter than HighFor")
	case 3*(c.LowFor+c.HighFor+c.After+c.Deadline) > 60*time.Second:
		return errors.New("overload: the three runs would take more than 60s")
	case float64(c.Tokens)/c.Service.Seconds()*c.High > 20000:
		return errors.New("overload: more than 20000 calls per second")
	}
	return nil
}

// Result is one contender's numbers.
type Result struct {
	Name string
	// UnloadedP99 is the p99 latency in the first phase.
	UnloadedP99 time.Duration
	// Goodput is the share of the capacity served within the deadline
	// during the overload phase after Settle; AdmittedP99 the p99 latency of
	// those calls.
	Goodput     float64
	AdmittedP99 time.Duration
	// Converge is the time from the step up until every later bucket has
	// a goodput of 90% of its capacity or more, with a p90 latency within
	// 2× UnloadedP99; Recover the time from the step down until every later
	// bucket's calls all succeed. Negative: never within the phase.
	Converge, Recover time.Duration
	// Calls counts the calls started.
	Calls int
}

// Report is the results of one Run, in the order no protection,
// failsafe-go, grpc-resilience.
type Report struct {
	Config  Config
	Results []Result
}

// Run runs the scenario against each contender in turn.
func Run(cfg Config) (Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return Report{}, err
	}
	rep := Report{Config: cfg}
	ours, err := interceptor.NewServer(interceptor.WithConcurrencyLimit(serviceconfig.ConcurrencyLimit{}))
	if err != nil {
		return Report{}, err
	}
	fs := failsafegrpc.NewUnaryServerInterceptor[any](adaptivelimiter.NewBuilder[any]().Build())
	for _, c := range []struct {
		name string
		icpt grpc.UnaryServerInterceptor
	}{
		{"no protection", nil},
		{"failsafe-go adaptivelimiter", fs},
		{"grpc-resilience", ours.UnaryServerInterceptor()},
	} {
		r, err := runOne(cfg, c.icpt)
		if err != nil {
			return Report{}, fmt.Errorf("overload: %s: %w", c.name, err)
		}
		r.Name = c.name
		rep.Results = append(rep.Results, r)
	}
	return rep, nil
}

// server is the fixed-capacity echo server.
type server struct {
	echov1.UnimplementedEchoServiceServer
	tokens  chan struct{}
	service time.Duration
}

func (s *server) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	select {
	case s.tokens <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	time.Sleep(s.service)
	<-s.tokens
	return &echov1.EchoResponse{}, nil
}

// call is one call's outcome.
type call struct {
	start time.Duration // since the run's start
	took  time.Duration
	ok    bool // succeeded within its deadline
}

// runOne runs the three phases against a server with icpt (nil: none).
func runOne(cfg Config, icpt grpc.UnaryServerInterceptor) (Result, error) {
	lis := bufconn.Listen(1 << 20)
	var sopts []grpc.ServerOption
	if icpt != nil {
		sopts = append(sopts, grpc.UnaryInterceptor(icpt))
	}
	gs := grpc.NewServer(sopts...)
	echov1.RegisterEchoServiceServer(gs, &server{tokens: make(chan struct{}, cfg.Tokens), service: cfg.Service})
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return Result{}, err
	}
	defer cc.Close()
	client := echov1.NewEchoServiceClient(cc)

	capacity := float64(cfg.Tokens) / cfg.Service.Seconds()
	var (
		mu    sync.Mutex
		calls []call
		wg    sync.WaitGroup
	)
	t0 := time.Now()
	next := time.Duration(0)
	for _, ph := range []struct {
		load float64
		d    time.Duration
	}{{cfg.Low, cfg.LowFor}, {cfg.High, cfg.HighFor}, {cfg.Low, cfg.After}} {
		gap := time.Duration(float64(time.Second) / (capacity * ph.load))
		end := next + ph.d
		for ; next < end; next += gap {
			if d := next - time.Since(t0); d > 0 {
				time.Sleep(d)
			}
			start := next
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), cfg.Deadline)
				defer cancel()
				began := time.Now()
				_, err := client.Echo(ctx, &echov1.EchoRequest{})
				took := time.Since(began)
				mu.Lock()
				calls = append(calls, call{start: start, took: took, ok: err == nil && took <= cfg.Deadline})
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	return analyse(cfg, capacity, calls), nil
}

// analyse computes a Result from the calls.
func analyse(cfg Config, capacity float64, calls []call) Result {
	slices.SortFunc(calls, func(a, b call) int { return int(a.start - b.start) })
	up, down := cfg.LowFor, cfg.LowFor+cfg.HighFor
	r := Result{Calls: len(calls)}
	var unloaded, admitted []time.Duration
	good := 0
	for _, c := range calls {
		switch {
		case c.start < up && c.ok:
			unloaded = append(unloaded, c.took)
		case c.start >= up+cfg.Settle && c.start < down:
			if c.ok {
				good++
				admitted = append(admitted, c.took)
			}
		}
	}
	r.UnloadedP99 = p99(unloaded)
	r.AdmittedP99 = p99(admitted)
	r.Goodput = float64(good) / (capacity * (cfg.HighFor - cfg.Settle).Seconds())
	r.Converge = settleTime(calls, up, down, func(b []call) bool {
		var ok []time.Duration
		for _, c := range b {
			if c.ok {
				ok = append(ok, c.took)
			}
		}
		return float64(len(ok)) >= 0.9*capacity*bucket.Seconds() && quantile(ok, 0.9) <= 2*r.UnloadedP99
	})
	r.Recover = settleTime(calls, down, down+cfg.After, func(b []call) bool {
		for _, c := range b {
			if !c.ok {
				return false
			}
		}
		return true
	})
	return r
}

const bucket = 500 * time.Millisecond

// settleTime returns the time from `from` to the start of the first bucket
// after which every bucket up to `to` satisfies good; -1 when the last
// bucket does not.
func settleTime(calls []call, from, to time.Duration, good func([]call) bool) time.Duration {
	var buckets [][]call
	for b := from; b < to; b += bucket {
		var in []call
		for _, c := range calls {
			if c.start >= b && c.start < min(b+bucket, to) {
				in = append(in, c)
			}
		}
		buckets = append(buckets, in)
	}
	settled := -1
	for i := len(buckets) - 1; i >= 0; i-- {
		if !good(buckets[i]) {
			break
		}
		settled = i
	}
	if settled < 0 {
		return -1
	}
	return time.Duration(settled) * bucket
}

func p99(d []time.Duration) time.Duration { return quantile(d, 0.99) }

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// Markdown renders the report as a table with the scenario above it.
func (r Report) Markdown() string {
	c := r.Config
	var b strings.Builder
	fmt.Fprintf(&b, "Open-loop overload: %d tokens × %v (capacity %.0f calls/s), deadline %v; %.1f× for %v, %.1f× for %v, %.1f× for %v; goodput and p99 over the overload after %v.\n\n",
		c.Tokens, c.Service, float64(c.Tokens)/c.Service.Seconds(), c.Deadline, c.Low, c.LowFor, c.High, c.HighFor, c.Low, c.After, c.Settle)
	b.WriteString("| server | unloaded p99 | goodput (of capacity) | admitted p99 | converges after step up | recovers after step down |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, x := range r.Results {
		fmt.Fprintf(&b, "| %s | %v | %.1f%% | %v | %s | %s |\n", x.Name, x.UnloadedP99.Round(time.Millisecond),
			100*x.Goodput, x.AdmittedP99.Round(time.Millisecond), settled(x.Converge), settled(x.Recover))
	}
	return b.String()
}

func settled(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.String()
}
