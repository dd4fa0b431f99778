package budget

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The simulation below drives one Budget the way the client interceptor will:
// closed-loop callers, each making logical calls one after another, each call
// up to MaxAttempts attempts with A6's jittered exponential backoff between
// them. Time is simulated: an event queue orders every attempt's end by its
// instant, so 32 callers interleave as they would on a real client, and the
// run is deterministic for a seed.

// simConfig describes one simulated run.
type simConfig struct {
	callers     int
	calls       int           // logical calls in total, across callers; 0: until horizon
	horizon     time.Duration // simulated time to run for when calls is 0
	failP       float64       // probability that an attempt fails with UNAVAILABLE; 1 is an outage
	maxAttempts int
	attempt     [2]time.Duration // an attempt's duration is uniform in [attempt[0], attempt[1])
	budget      *Config          // nil: plain retries, no budget
	seed        uint64
}

// A6 backoff of the DESIGN.md example: initialBackoff 50ms, multiplier 2,
// maxBackoff 1s; retry n waits random(0, min(50ms × 2^(n−1), 1s)).
const (
	initialBackoff = 50 * time.Millisecond
	maxBackoff     = time.Second
)

type simResult struct {
	calls, attempts, successes int
	retries, denied            int // retries sent; retries refused by the budget
	failedRetries              int
	elapsed                    time.Duration
}

func (r simResult) attemptsPerCall() float64 { return float64(r.attempts) / float64(r.calls) }
func (r simResult) successRate() float64     { return float64(r.successes) / float64(r.calls) }

// event is the end of one attempt of one caller.
type event struct {
	at     time.Duration // since the start of the run
	caller int
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].caller < q[j].caller
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

func simulate(t testing.TB, cfg simConfig) simResult {
	t.Helper()
	rng := rand.New(rand.NewPCG(cfg.seed, 0x5eed))
	var b *Budget
	if cfg.budget != nil {
		var err error
		if b, err = New(*cfg.budget, t0); err != nil {
			t.Fatalf("New(%+v) = %v", *cfg.budget, err)
		}
	}
	dur := func() time.Duration {
		return cfg.attempt[0] + time.Duration(rng.Int64N(int64(cfg.attempt[1]-cfg.attempt[0])))
	}
	type callerState struct {
		attempt int   // attempts made in the current call
		retry   Retry // the current attempt's withdrawal, if it is a retry
	}
	callers := make([]callerState, cfg.callers)
	var res simResult
	started := 0
	q := &eventQueue{}
	more := func(now time.Duration) bool {
		if cfg.calls > 0 {
			return started < cfg.calls
		}
		return now < cfg.horizon
	}
	startCall := func(c int, now time.Duration) {
		if !more(now) {
			return
		}
		started++
		res.calls++
		if b != nil {
			b.OnRequest(t0.Add(now))
		}
		callers[c] = callerState{attempt: 1}
		res.attempts++
		heap.Push(q, event{now + dur(), c})
	}
	for c := range cfg.callers {
		startCall(c, 0)
	}
	for q.Len() > 0 {
		ev := heap.Pop(q).(event)
		now, c := ev.at, ev.caller
		res.elapsed = now
		st := &callers[c]
		failed := rng.Float64() < cfg.failP
		if st.attempt > 1 && failed {
			res.failedRetries++
		}
		if !failed {
			if b != nil {
				b.Refund(st.retry)
			}
			res.successes++
			startCall(c, now)
			continue
		}
		if st.attempt == cfg.maxAttempts {
			startCall(c, now)
			continue
		}
		if b != nil {
			r, ok := b.TryRetry(t0.Add(now))
			if !ok {
				res.denied++
				startCall(c, now)
				continue
			}
			st.retry = r
		}
		cap := min(initialBackoff<<(st.attempt-1), maxBackoff)
		backoff := time.Duration(rng.Int64N(int64(cap)))
		st.attempt++
		res.attempts++
		res.retries++
		heap.Push(q, event{now + backoff + dur(), c})
	}
	return res
}

var (
	defaults = DefaultConfig()
	fast     = [2]time.Duration{time.Millisecond, 3 * time.Millisecond}
)

// TestRandomFailuresStillSucceed is case (a) of the issue: 20 % of attempts
// fail at random, MaxAttempts 4, 32 callers, the default budget. Refunds keep
// the budget out of the way: ≥ 99.5 % of calls succeed (1 − 0.2⁴ = 99.84 %
// with unbounded retries).
func TestRandomFailuresStillSucceed(t *testing.T) {
	for _, seed := range []uint64{1, 2} {
		res := simulate(t, simConfig{
			callers: 32, calls: 32 * 2000, failP: 0.2, maxAttempts: 4,
			attempt: fast, budget: &defaults, seed: seed,
		})
		t.Logf("seed %d: %d calls over %v simulated: success %.3f%%, %.4f attempts per call, %d retries (%d failed), %d denied by the budget",
			seed, res.calls, res.elapsed.Round(time.Millisecond), 100*res.successRate(), res.attemptsPerCall(), res.retries, res.failedRetries, res.denied)
		if got := res.successRate(); got < 0.995 {
			t.Errorf("seed %d: success rate = %.4f, want ≥ 0.995", seed, got)
		}
		if res.elapsed < 2*DefaultTTL {
			t.Errorf("seed %d: the run covered %v, want several windows (≥ %v)", seed, res.elapsed, 2*DefaultTTL)
		}
		// Failed retries per call are p² + p³ + p⁴ = 0.0496 (doc.go).
		if got := float64(res.failedRetries) / float64(res.calls); math.Abs(got-0.0496) > 0.005 {
			t.Errorf("seed %d: failed retries per call = %.4f, want 0.0496 ± 0.005", seed, got)
		}
	}
}

// TestOutageAttemptsPerCall is case (b) of the issue: every attempt fails,
// MaxAttempts 4, 32 callers. Plain retries make 4 attempts per call; the
// default budget at most 1 + 0.2 + 100/N for N calls in one window, ≤ 1.25
// from N = 2000 on.
func TestOutageAttemptsPerCall(t *testing.T) {
	plain := simulate(t, simConfig{callers: 32, calls: 32 * 63, failP: 1, maxAttempts: 4, attempt: fast, seed: 1})
	t.Logf("plain retries: %d calls, %.4f attempts per call", plain.calls, plain.attemptsPerCall())
	if got := plain.attemptsPerCall(); got != 4 {
		t.Errorf("plain retries in an outage: attempts per call = %v, want 4", got)
	}
	tests := []struct {
		name  string
		calls int
		want  float64 // at most
	}{
		{"32 callers × 50 calls: reserve not yet amortized", 32 * 50, 1 + 0.2 + 100.0/(32*50)},
		{"the worst-case threshold, 2000 calls", 2000, 1.25},
		{"32 callers × 63 calls", 32 * 63, 1.25},
		{"32 callers × 100 calls", 32 * 100, 1.25},
		{"32 callers × 300 calls", 32 * 300, 1.25},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, seed := range []uint64{1, 2, 3} {
				res := simulate(t, simConfig{
					callers: 32, calls: tt.calls, failP: 1, maxAttempts: 4,
					attempt: fast, budget: &defaults, seed: seed,
				})
				bound := 1 + 0.2 + 100/float64(res.calls)
				t.Logf("seed %d: %d calls over %v simulated: %.4f attempts per call (bound 1 + 0.2 + 100/N = %.4f), %d retries, %d denied",
					seed, res.calls, res.elapsed.Round(time.Millisecond), res.attemptsPerCall(), bound, res.retries, res.denied)
				if got := res.attemptsPerCall(); got > tt.want || got > bound {
					t.Errorf("seed %d: attempts per call = %.4f, want ≤ %.4f", seed, got, min(tt.want, bound))
				}
				if res.successes != 0 {
					t.Errorf("seed %d: %d successes in an outage, want 0", seed, res.successes)
				}
			}
		})
	}
}

// TestSmallestOutageRunWithinBound finds, by simulation, the smallest number
// of calls for which a fresh default budget keeps an outage at ≤ 1.25
// attempts per call with 32 callers, and checks it against the worst-case
// 2000 of doc.go.
func TestSmallestOutageRunWithinBound(t *testing.T) {
	smallest := 0
	for n := 2000; n >= 1500; n-- {
		worst := 0.0
		for _, seed := range []uint64{1, 2, 3} {
			res := simulate(t, simConfig{callers: 32, calls: n, failP: 1, maxAttempts: 4, attempt: fast, budget: &defaults, seed: seed})
			worst = max(worst, res.attemptsPerCall())
		}
		if worst > 1.25 {
			break
		}
		smallest = n
	}
	t.Logf("smallest run within 1.25 attempts per call: %d calls (worst case from doc.go: 2000)", smallest)
	if smallest == 0 || smallest > 2000 {
		t.Errorf("smallest run within the bound = %d calls, want in (0, 2000]", smallest)
	}
}

// TestSustainedOutage pins the reserve's refill: over many windows the
// budget allows Ratio × λ + MinRetriesPerSecond retries per second, so
// attempts per call tend to 1 + Ratio + MinRetriesPerSecond/λ: 1.2 for a busy
// client, more for a quiet one, which keeps its MinRetriesPerSecond.
func TestSustainedOutage(t *testing.T) {
	tests := []struct {
		name    string
		callers int
		attempt [2]time.Duration
	}{
		{"busy: 32 callers, 5-15ms attempts", 32, [2]time.Duration{5 * time.Millisecond, 15 * time.Millisecond}},
		{"quiet: 4 callers, 40-60ms attempts", 4, [2]time.Duration{40 * time.Millisecond, 60 * time.Millisecond}},
	}
	const horizon = 60 * time.Second
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := simulate(t, simConfig{
				callers: tt.callers, horizon: horizon, failP: 1, maxAttempts: 4,
				attempt: tt.attempt, budget: &defaults, seed: 1,
			})
			secs := res.elapsed.Seconds()
			rate := float64(res.calls) / secs // λ, calls per second
			// Withdrawals are forgotten at most TTL after they were taken, so
			// over T seconds the reserve pays for at most
			// MinRetriesPerSecond × (T + TTL) retries.
			limit := 0.2*float64(res.calls) + DefaultMinRetriesPerSecond*(secs+DefaultTTL.Seconds())
			steady := 1 + 0.2 + DefaultMinRetriesPerSecond/rate // doc.go: 1 + Ratio + MinRetriesPerSecond/λ
			t.Logf("%d calls in %.1fs (λ = %.0f/s): %.4f attempts per call (1 + 0.2 + 10/λ = %.4f), %d retries (%.1f/s, 0.2λ + 10 = %.1f/s), limit %.0f",
				res.calls, secs, rate, res.attemptsPerCall(), steady, res.retries, float64(res.retries)/secs, 0.2*rate+10, limit)
			if got := float64(res.retries); got > limit {
				t.Errorf("retries = %v, want ≤ 0.2 × calls + 10/s × (T + TTL) = %.0f", got, limit)
			}
			if got := res.attemptsPerCall(); math.Abs(got-steady) > 0.02 {
				t.Errorf("attempts per call = %.4f, want 1 + 0.2 + 10/λ = %.4f ± 0.02", got, steady)
			}
		})
	}
}

// TestBudgetBindsAboveTheFailureRateOfDocGo pins where the budget starts to
// bind with independent failures: p²(1 − p³)/(1 − p) > Ratio, at p ≈ 0.365
// for MaxAttempts 4. At p = 0.3 it refuses nothing once warm; at p = 0.45
// it holds failed retries to the share of requests.
func TestBudgetBindsAboveTheFailureRateOfDocGo(t *testing.T) {
	for _, p := range []float64{0.3, 0.45} {
		res := simulate(t, simConfig{
			callers: 32, calls: 32 * 1500, failP: p, maxAttempts: 4,
			attempt: fast, budget: &defaults, seed: 1,
		})
		perCall := float64(res.failedRetries) / float64(res.calls)
		unbounded := p * p * (1 - p*p*p) / (1 - p)
		t.Logf("p = %.2f: %d calls, failed retries per call %.4f (unbounded %.4f), %d denied, success %.2f%%",
			p, res.calls, perCall, unbounded, res.denied, 100*res.successRate())
		switch p {
		case 0.3:
			if res.denied != 0 {
				t.Errorf("p = 0.3: %d retries denied, want 0", res.denied)
			}
		case 0.45:
			if res.denied == 0 {
				t.Error("p = 0.45: no retry denied, want the budget to bind")
			}
			if perCall > 0.2+0.01 {
				t.Errorf("p = 0.45: failed retries per call = %.4f, want ≤ Ratio 0.2 (+ the reserve's share)", perCall)
			}
		}
	}
}

// TestRealGoroutines runs both cases of the issue with 32 real goroutines
// sharing one Budget (run it with -race). Time is a shared counter that every
// attempt advances by 100µs, so the run is short in simulated time and the
// interleaving is the scheduler's. Backoff is not simulated: it changes when
// retries happen, not whether the budget pays for them.
func TestRealGoroutines(t *testing.T) {
	tests := []struct {
		name        string
		failP       float64
		callsEach   int
		wantSuccess float64 // at least
		wantAPC     float64 // attempts per call, at most
	}{
		{"20% random failures", 0.2, 300, 0.995, 4},
		{"full outage", 1, 100, 0, 1.25},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const callers, maxAttempts = 32, 4
			b := mustNew(t, defaults)
			var clock, attempts, successes atomic.Int64
			tick := func() time.Time { return t0.Add(time.Duration(clock.Add(int64(100 * time.Microsecond)))) }
			var wg sync.WaitGroup
			for g := range callers {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 7))
					for range tt.callsEach {
						b.OnRequest(tick())
						var r Retry
						for n := 1; ; n++ {
							attempts.Add(1)
							if rng.Float64() >= tt.failP {
								b.Refund(r)
								successes.Add(1)
								break
							}
							if n == maxAttempts {
								break
							}
							var ok bool
							if r, ok = b.TryRetry(tick()); !ok {
								break
							}
						}
					}
				})
			}
			wg.Wait()
			calls := float64(callers * tt.callsEach)
			success, apc := float64(successes.Load())/calls, float64(attempts.Load())/calls
			t.Logf("%d calls by %d goroutines over %v simulated: success %.2f%%, %.4f attempts per call",
				int(calls), callers, time.Duration(clock.Load()), 100*success, apc)
			if success < tt.wantSuccess {
				t.Errorf("success rate = %.4f, want ≥ %v", success, tt.wantSuccess)
			}
			if apc > tt.wantAPC {
				t.Errorf("attempts per call = %.4f, want ≤ %v", apc, tt.wantAPC)
			}
			if tt.failP == 1 {
				if bound := 1 + 0.2 + 100/calls; apc > bound {
					t.Errorf("attempts per call = %.4f, want ≤ 1 + 0.2 + 100/N = %.4f", apc, bound)
				}
			}
		})
	}
}
