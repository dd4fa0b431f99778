package interceptor_test

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The slow-tail workload of issue 10: each attempt takes base, or 40ms
// with probability 5%, drawn from a seeded generator by the attempt's
// arrival number, so every run is the same. Calls are made one after the
// other on fake time (testing/synctest) over real gRPC on bufconn: the
// latencies are exact.

const tailSeed = 10

// tailLatency returns how long attempt n (from 1) takes when the base
// latency is base.
func tailLatency(n int, base time.Duration) time.Duration {
	if rand.New(rand.NewPCG(tailSeed, uint64(n))).Float64() < 0.05 {
		return 40 * time.Millisecond
	}
	return base
}

// tailRun is what a run of calls measured.
type tailRun struct {
	calls    int
	attempts int             // attempts the server saw
	lat      []time.Duration // call latencies, in call order
}

// extra is the share of attempts beyond one per call.
func (r tailRun) extra() float64 { return float64(r.attempts-r.calls) / float64(r.calls) }

// extraIn is the share of extra attempts among calls [from, to), counted
// from the attempts made while they ran (attemptsAt[i] is the server's
// count when call i returned).
func extraIn(attemptsAt []int, from, to int) float64 {
	before := 0
	if from > 0 {
		before = attemptsAt[from-1]
	}
	return float64(attemptsAt[to-1]-before-(to-from)) / float64(to-from)
}

// quantile returns the q-quantile of lat (the ⌈q·n⌉-th smallest).
func quantile(lat []time.Duration, q float64) time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[int(math.Ceil(q*float64(len(s))))-1]
}

// runTail makes calls hedged (or not, with hedge nil) under the slow-tail
// workload, the base latency being base(n) for attempt n, and returns
// what it measured, with the server's attempt count after each call.
func runTail(t *testing.T, hedge *serviceconfig.HedgingPolicy, calls int, base func(n int) time.Duration) (run tailRun, attemptsAt []int) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			return testserver.Outcome{Delay: tailLatency(a.N, base(a.N))}
		})
		c, err := interceptor.NewClient(interceptor.WithMethodConfig(serviceconfig.MethodConfig{
			Name:          []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService"}},
			HedgingPolicy: hedge,
		}))
		if err != nil {
			t.Fatal(err)
		}
		cc := testserver.Start(t, srv, c.DialOptions()...)
		client := echov1.NewEchoServiceClient(cc)
		for range calls {
			start := time.Now()
			if _, err := client.Echo(t.Context(), &echov1.EchoRequest{Message: "tail"}); err != nil {
				t.Fatalf("Echo: %v", err)
			}
			run.lat = append(run.lat, time.Since(start))
			synctest.Wait() // the losing copy ends: the next call starts alone
			attemptsAt = append(attemptsAt, srv.Count("Echo"))
		}
		run.calls, run.attempts = calls, srv.Count("Echo")
	})
	return run, attemptsAt
}

func constant(d time.Duration) func(int) time.Duration { return func(int) time.Duration { return d } }

// TestAdaptiveHedgingMeetsTheTailTarget pins issue 10's goal: on attempts
// of 2ms, or 40ms with probability 5%, hedging at the observed latency
// quantile keeps the p99 within 0.25× of the unhedged p99 with at most 6%
// extra attempts, at the example quantile (0.95) and at 0.9. A
// fixed delay of 10ms is logged beside them.
//
// At 0.95 the workload's quantile sits on the edge between the two
// latencies (exactly 5% are slow): the window then reads the tail's
// cut-off copies, recorded at what they ran (about 4ms), so the delay
// settles one step above the fast latency instead of on it.
func TestAdaptiveHedgingMeetsTheTailTarget(t *testing.T) {
	const calls = 2000
	base := constant(2 * time.Millisecond)
	plain, _ := runTail(t, nil, calls, base)
	p50, p99 := quantile(plain.lat, 0.5), quantile(plain.lat, 0.99)
	t.Logf("%-26s p50 %v  p99 %v  extra attempts %.2f%%", "unhedged", p50, p99, 100*plain.extra())
	if p99 != 40*time.Millisecond || plain.extra() != 0 {
		t.Fatalf("unhedged: p99 %v with %.2f%% extra attempts, want 40ms and none", p99, 100*plain.extra())
	}
	tests := []struct {
		name   string
		policy serviceconfig.HedgingPolicy
		target bool // held to the target
	}{
		{"adaptive, quantile 0.95", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.95}, true},
		{"adaptive, quantile 0.9", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.9}, true},
		{"fixed hedgingDelay 10ms", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 10 * time.Millisecond}, false},
	}
	for _, tt := range tests {
		r, _ := runTail(t, &tt.policy, calls, base)
		r50, r99 := quantile(r.lat, 0.5), quantile(r.lat, 0.99)
		ratio := float64(r99) / float64(p99)
		t.Logf("%-26s p50 %v (%.2f×)  p99 %v (%.3f×)  extra attempts %.2f%%",
			tt.name, r50, float64(r50)/float64(p50), r99, ratio, 100*r.extra())
		if tt.target && (ratio > 0.25 || r.extra() > 0.06 || r50 != p50) {
			t.Errorf("%s: p50 %v, p99 %.3f× of unhedged with %.2f%% extra attempts, want p50 %v, at most 0.25× and 6%%",
				tt.name, r50, ratio, 100*r.extra(), p50)
		}
	}
}

// TestAdaptiveHedgingFollowsDrift pins how both kinds of delay follow a
// drift: when the base latency doubles midway (2ms to 4ms from the 1051st
// attempt, at about the 1000th call), the adaptive delay keeps hedging
// about the tail, and a fixed delay tuned for 2ms (3ms, which hedges the 5%
// tail), now below every call, is rationed under the retry budget (the
// default: 20% of calls plus 10 per second): it would hedge more calls than
// the budget pays for, so it is raised to the observed p95 (capped at 1.5×
// the p90), and hedges the slow calls. Unrationed (issue 20), it hedged
// about a third of the calls until the budget was spent, and left the tail
// unhedged (p99 back at 40ms, 1.75× the load for no gain in real time).
func TestAdaptiveHedgingFollowsDrift(t *testing.T) {
	const calls, switchAt = 2000, 1051
	drift := func(n int) time.Duration {
		if n >= switchAt {
			return 4 * time.Millisecond
		}
		return 2 * time.Millisecond
	}
	run := func(name string, hp *serviceconfig.HedgingPolicy) (before, after float64, p99 time.Duration) {
		r, at := runTail(t, hp, calls, drift)
		// The last 800 calls: the switch and the window's turn are past.
		before, after, p99 = extraIn(at, 0, 1000), extraIn(at, calls-800, calls), quantile(r.lat[calls-800:], 0.99)
		t.Logf("%-24s extra attempts %.2f%% in calls 1-1000, %.2f%% in calls 1201-2000 (p99 %v), %.2f%% overall",
			name, 100*before, 100*after, p99, 100*r.extra())
		return before, after, p99
	}
	aBefore, aAfter, aP99 := run("adaptive, quantile 0.9", &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.9})
	fBefore, fAfter, fP99 := run("fixed hedgingDelay 3ms", &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 3 * time.Millisecond})
	if aBefore > 0.06 || aAfter > 0.07 || aP99 > 10*time.Millisecond {
		t.Errorf("adaptive: %.2f%% extra attempts before the drift and %.2f%% after, p99 %v after; want at most 6%%, 7%% and 10ms",
			100*aBefore, 100*aAfter, aP99)
	}
	if fBefore > 0.06 || fAfter > 0.07 || fP99 > aP99*3/2 {
		t.Errorf("fixed 3ms: %.2f%% extra attempts before the drift and %.2f%% after, p99 %v after; want at most 6%% and 7%% (rationed), and a p99 within 1.5× the adaptive's %v",
			100*fBefore, 100*fAfter, fP99, aP99)
	}
}

const echoMethod = "/resilience.echo.v1.EchoService/Echo"

// echoHedged returns a client hedging EchoService under hp and a server
// answering every attempt after took(n) (n from 1), in the synctest bubble
// of t.
func echoHedged(t *testing.T, hp *serviceconfig.HedgingPolicy, took func(n int) time.Duration) (*interceptor.Client, *testserver.Server, echov1.EchoServiceClient) {
	srv := &testserver.Server{}
	srv.SetScript(func(a testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: took(a.N)} })
	c, err := interceptor.NewClient(interceptor.WithMethodConfig(serviceconfig.MethodConfig{
		Name:          []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService"}},
		HedgingPolicy: hp,
	}))
	if err != nil {
		t.Fatal(err)
	}
	cc := testserver.Start(t, srv, c.DialOptions()...)
	return c, srv, echov1.NewEchoServiceClient(cc)
}

// TestAdaptiveHedgingWarmUp pins the delay before HedgingDelayMinSamples:
// HedgingDelay when set; when not, no timed copies at all.
func TestAdaptiveHedgingWarmUp(t *testing.T) {
	slow := func(int) time.Duration { return 40 * time.Millisecond }
	tests := []struct {
		name      string
		delay     time.Duration
		wantDelay time.Duration
		wantOK    bool
		wantSent  int // attempts of the first call
	}{
		{"hedgingDelay until the samples", 10 * time.Millisecond, 10 * time.Millisecond, true, 2},
		{"no hedgingDelay: no timed copies", 0, 0, false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, srv, client := echoHedged(t, &serviceconfig.HedgingPolicy{
					MaxAttempts: 2, HedgingDelay: tt.delay, HedgingDelayQuantile: 0.9, HedgingDelayMinSamples: 3,
				}, slow)
				if d, ok := c.HedgingDelay(echoMethod); d != tt.wantDelay || ok != tt.wantOK {
					t.Errorf("HedgingDelay before any call = %v, %v, want %v, %v", d, ok, tt.wantDelay, tt.wantOK)
				}
				if _, err := client.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
					t.Fatalf("Echo: %v", err)
				}
				synctest.Wait()
				if got := srv.Count("Echo"); got != tt.wantSent {
					t.Errorf("the first call sent %d attempts, want %d", got, tt.wantSent)
				}
				for range 3 {
					if _, err := client.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
						t.Fatalf("Echo: %v", err)
					}
					synctest.Wait()
				}
				// Every copy took 40ms or was cut off after it: the p90 is
				// 40ms rounded up to its bucket.
				if d, ok := c.HedgingDelay(echoMethod); d != 41943040 || !ok {
					t.Errorf("HedgingDelay after the samples = %v, %v, want 41.94304ms, true", d, ok)
				}
			})
		})
	}
}

// TestAdaptiveHedgingFloor pins HedgingDelayFloor: the delay never goes
// below it, however fast the method.
func TestAdaptiveHedgingFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _, client := echoHedged(t, &serviceconfig.HedgingPolicy{
			MaxAttempts: 2, HedgingDelayQuantile: 0.9, HedgingDelayFloor: 5 * time.Millisecond, HedgingDelayMinSamples: 1,
		}, func(int) time.Duration { return time.Millisecond })
		for range 3 {
			if _, err := client.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
				t.Fatalf("Echo: %v", err)
			}
		}
		if d, ok := c.HedgingDelay(echoMethod); d != 5*time.Millisecond || !ok {
			t.Errorf("HedgingDelay of a 1ms method with a 5ms floor = %v, %v, want 5ms, true", d, ok)
		}
	})
}

// TestAdaptiveHedgingCarriesAcrossUpdates pins that a method's observed
// latencies survive a config update, as its breaker and latency estimate
// do: a new quantile reads the same observations at once, while an update
// to a fixed delay ends them.
func TestAdaptiveHedgingCarriesAcrossUpdates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// 2ms, and every 4th attempt 8ms: the p50 is 2ms, the p90 8ms.
		c, _, client := echoHedged(t, &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.9, HedgingDelayMinSamples: 20},
			func(n int) time.Duration {
				if n%4 == 0 {
					return 8 * time.Millisecond
				}
				return 2 * time.Millisecond
			})
		for range 40 {
			if _, err := client.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
				t.Fatalf("Echo: %v", err)
			}
			synctest.Wait()
		}
		hedged := func(hp serviceconfig.HedgingPolicy) *serviceconfig.Config {
			return &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
				Name: []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService"}}, HedgingPolicy: &hp,
			}}}
		}
		steps := []struct {
			name   string
			policy serviceconfig.HedgingPolicy
			want   time.Duration
			wantOK bool
		}{
			{"before the updates", serviceconfig.HedgingPolicy{}, 8388608, true},
			{"a new quantile reads the same samples", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.5, HedgingDelayMinSamples: 20}, 2097152, true},
			{"a fixed delay", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 7 * time.Millisecond}, 7 * time.Millisecond, true},
			{"adaptive again starts afresh", serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.5}, 0, false},
		}
		for i, s := range steps {
			if i > 0 {
				if err := c.UpdateServiceConfig(hedged(s.policy)); err != nil {
					t.Fatalf("%s: UpdateServiceConfig: %v", s.name, err)
				}
			}
			if d, ok := c.HedgingDelay(echoMethod); d != s.want || ok != s.wantOK {
				t.Errorf("%s: HedgingDelay = %v, %v, want %v, %v", s.name, d, ok, s.want, s.wantOK)
			}
		}
	})
}

// TestAdaptiveHedgingConcurrentCallers runs the slow-tail workload from 8
// callers at once, with every 7th call cancelled by its caller after 3ms:
// the window takes observations from many copies at once (the race
// detector watches), calls end as they should, and the hedged share stays
// near the tail's.
func TestAdaptiveHedgingConcurrentCallers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, srv, client := echoHedged(t, &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.9, HedgingDelayMinSamples: 50},
			func(n int) time.Duration { return tailLatency(n, 2*time.Millisecond) })
		const callers, calls = 8, 150
		errs := make(chan error, callers*calls)
		for g := range callers {
			go func() {
				for i := range calls {
					ctx, cancel := context.WithCancel(t.Context())
					if (g*calls+i)%7 == 0 {
						time.AfterFunc(3*time.Millisecond, cancel)
					}
					_, err := client.Echo(ctx, &echov1.EchoRequest{})
					cancel()
					errs <- err
				}
			}()
		}
		cancelled := 0
		for range callers * calls {
			switch err := <-errs; status.Code(err) {
			case codes.OK:
			case codes.Canceled:
				cancelled++
			default:
				t.Fatalf("Echo: %v, want success or Canceled", err)
			}
		}
		synctest.Wait()
		extra := float64(srv.Count("Echo")-callers*calls) / float64(callers*calls)
		t.Logf("%d calls, %d cancelled, extra attempts %.2f%%", callers*calls, cancelled, 100*extra)
		if cancelled == 0 || extra > 0.08 {
			t.Errorf("%d calls cancelled, %.2f%% extra attempts; want some cancelled and at most 8%% extra", cancelled, 100*extra)
		}
	})
}

// TestHedgingBuysTheTailWhenLatencyTriples pins issue 20's hedging goals on
// a model of bench/'s slow tail that triples, on fake time over real gRPC:
// each attempt takes the base latency plus up to 25% (seeded jitter), or 20×
// the base with probability 5%; the base is 2ms for the first half of the
// calls and 6ms for the second; 4 concurrent callers, 3200 calls. The
// adaptive delay (p95) keeps the p99 within 0.15× of the unhedged with at
// most 6% extra attempts (the drift target of issue 32); a fixed 5ms delay,
// set for the first half, is below every call of the second: under the
// default retry budget (which pays for about 21% of calls here, 1,600 a
// second: 0.2 + 10/1600) the delay is raised to the latency the slowest
// 21% outlast (hedge_delay.go), so the p99 stays within 0.25× for at most
// the budget's share of extra attempts over the second half (14% overall).
// Before any such rule, the fixed delay hedged every call of the second
// half until the budget ran out, and left the tail unhedged.
func TestHedgingBuysTheTailWhenLatencyTriples(t *testing.T) {
	bare := runDrift(t, 3, "").p99
	tests := []struct {
		name             string
		policy           string
		maxP99, maxExtra float64
	}{
		{"adaptive p95", `{"maxAttempts": 2, "hedgingDelayQuantile": 0.95}`, 0.15, 0.06},
		{"fixed 5ms", `{"maxAttempts": 2, "hedgingDelay": "0.005s"}`, 0.25, 0.14},
	}
	for _, tt := range tests {
		r := runDrift(t, 3, tt.policy)
		ratio := float64(r.p99) / float64(bare)
		t.Logf("%-13s p99 %v (%.3f× the unhedged %v), extra attempts %.2f%%", tt.name, r.p99, ratio, bare, 100*r.extra)
		if ratio > tt.maxP99 || r.extra > tt.maxExtra {
			t.Errorf("%s: p99 %.3f× the unhedged with %.2f%% extra attempts, want at most %.2f× and %.0f%%",
				tt.name, ratio, 100*r.extra, tt.maxP99, 100*tt.maxExtra)
		}
	}
}

// TestHedgingDelayFollowsADriftUpAtOnce pins the drift detector of
// hedge_delay.go on bench/'s drift scenario of issue 32 (the base latency
// ×4 halfway), modelled as in TestHedgingBuysTheTailWhenLatencyTriples:
// once the new base latency passes the adaptive delay, every call is hedged
// until the delay follows, and the window of 256 to 512 copies followed
// only once the new latencies were a share of it: here 61 calls whose
// first attempt was fast were hedged after the drift, 6.5% extra attempts
// overall (bench/'s scenario: 6.4-6.9% in real time, against a target of
// 6%). Restarted from its last 16 copies when 12 of them pass the delay,
// it follows within a few calls (14 here, 5.0% overall); the p99 stays
// within 0.15× of the unhedged.
func TestHedgingDelayFollowsADriftUpAtOnce(t *testing.T) {
	bare := runDrift(t, 4, "").p99
	r := runDrift(t, 4, `{"maxAttempts": 2, "hedgingDelayQuantile": 0.95}`)
	ratio := float64(r.p99) / float64(bare)
	t.Logf("p99 %v (%.3f× the unhedged %v), extra attempts %.2f%%, %d calls with a fast first attempt hedged after the drift",
		r.p99, ratio, bare, 100*r.extra, r.fastHedgedAfter)
	if r.fastHedgedAfter > 20 || ratio > 0.15 || r.extra > 0.06 {
		t.Errorf("%d calls with a fast first attempt hedged after the drift, p99 %.3f× the unhedged, %.2f%% extra attempts; "+
			"want at most 20, 0.15× and 6%%", r.fastHedgedAfter, ratio, 100*r.extra)
	}
}

// driftRun is what runDrift measured.
type driftRun struct {
	p99   time.Duration
	extra float64 // the share of attempts beyond one per call
	// fastHedgedAfter counts the calls of the second half whose first
	// attempt was not slow and that were hedged all the same.
	fastHedgedAfter int
}

// runDrift makes 3200 calls from 4 concurrent callers on fake time over
// real gRPC, hedged under hedgingPolicy (none when empty): each attempt
// takes the base latency plus up to 25% (seeded jitter), or 20× the base
// with probability 5%; the base is 2ms for the first half of the calls and
// factor× that for the second.
func runDrift(t *testing.T, factor int, hedgingPolicy string) (run driftRun) {
	const total = 3200
	synctest.Test(t, func(t *testing.T) {
		var (
			mu       sync.Mutex
			slow     [total]bool // the call's first attempt was slow
			attempts [total]int
		)
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			i, _ := strconv.Atoi(a.Messages[0])
			r := rand.New(rand.NewPCG(tailSeed, uint64(i)*8+uint64(max(a.Previous, 0))))
			base := 2 * time.Millisecond
			if i >= total/2 {
				base *= time.Duration(factor)
			}
			d := base + time.Duration(r.Float64()*float64(base)/4)
			s := r.Float64() < 0.05
			if s {
				d = 20 * base
			}
			mu.Lock()
			if attempts[i]++; attempts[i] == 1 {
				slow[i] = s
			}
			mu.Unlock()
			return testserver.Outcome{Delay: d}
		})
		doc := `{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService"}]`
		if hedgingPolicy != "" {
			doc += `, "hedgingPolicy": ` + hedgingPolicy
		}
		cfg, err := serviceconfig.Parse([]byte(doc + `}]}`))
		if err != nil {
			t.Fatal(err)
		}
		c, err := interceptor.NewClient(interceptor.WithServiceConfig(cfg))
		if err != nil {
			t.Fatal(err)
		}
		client := echov1.NewEchoServiceClient(testserver.Start(t, srv, c.DialOptions()...))
		var (
			next int
			lat  []time.Duration
			wg   sync.WaitGroup
		)
		for range 4 {
			wg.Go(func() {
				for {
					mu.Lock()
					i := next
					next++
					mu.Unlock()
					if i >= total {
						return
					}
					start := time.Now()
					if _, err := client.Echo(t.Context(), &echov1.EchoRequest{Message: strconv.Itoa(i)}); err != nil {
						t.Errorf("Echo: %v", err)
					}
					mu.Lock()
					lat = append(lat, time.Since(start))
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		synctest.Wait()
		run.p99, run.extra = quantile(lat, 0.99), float64(srv.Count("Echo")-total)/total
		for i := total / 2; i < total; i++ {
			if attempts[i] > 1 && !slow[i] {
				run.fastHedgedAfter++
			}
		}
	})
	return run
}
