package endpoint

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/balancer"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// exclusionAfterOnePause runs callers closed-loop callers over three 5ms
// endpoints on the bubble's clock, gives ep2 one answer of pause, and
// returns how long until ep2 is picked again (2 minutes at most).
func exclusionAfterOnePause(t *testing.T, conc int, decay time.Duration, callers int, pause time.Duration) time.Duration {
	var out time.Duration
	synctest.Test(t, func(t *testing.T) {
		pk, b := newTestPicker(t, 3, serviceconfig.EndpointPolicy{ChildPolicy: "peak_ewma", EndpointConcurrency: conc, DecayTime: decay})
		b.rand = rand.Uint64
		var pausedAt atomic.Int64 // nanotime of the pause; 0: not yet
		var back atomic.Int64     // nanotime of the first pick of ep2 after it
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					res, err := pk.Pick(balancer.PickInfo{Ctx: context.Background()})
					if err != nil {
						t.Error(err)
						return
					}
					if res.SubConn.(*fakeSubConn).name == "ep2" && pausedAt.Load() != 0 && back.Load() == 0 {
						back.Store(b.nanotimeNow())
					}
					time.Sleep(5 * time.Millisecond)
					res.Done(ok)
				}
			}()
		}
		time.Sleep(2 * time.Second) // warm: every estimate 5ms
		e := pk.ready[2].e
		e.lat.Observe(b.nanotimeNow(), pause, pk.decay) // one slow response: a pause
		pausedAt.Store(b.nanotimeNow())
		for back.Load() == 0 && time.Duration(b.nanotimeNow()-pausedAt.Load()) < 2*time.Minute {
			time.Sleep(10 * time.Millisecond)
		}
		close(stop)
		wg.Wait()
		out = time.Duration(back.Load() - pausedAt.Load())
	})
	return out
}

// TestOneSlowResponseBenchesAnEndpointForAboutTauLnRatio pins REVIEW class
// 1 (test the recovery, not only the protection) for peak_ewma. Three
// endpoints answer in 5ms, 16 callers in a closed loop (bench's
// endpoint-slow load); ep2 answers one call in 50ms (a pause), then 5ms
// again. The estimate takes the peak at once and ep2 gets no call until its
// decayed estimate undercuts a busy fast one: 50ms·e^(−t/τ) < 5ms × (1 +
// 8/endpointConcurrency), about τ·ln(50/15) ≈ 1.2τ at endpointConcurrency
// 4. At the defaults (4, 10s) that is about 10s (an adversary measured
// 9.6s): the price of keeping a persistently slow endpoint out, which the
// docs state; a decayTime of 1s brings it back within about a second (but
// tries a slow endpoint ten times as often: see tau_test.go), and
// Finagle's cost (endpointConcurrency 1) at once, as a busy fast endpoint
// (5ms × 9) costs about what the paused one does.
func TestOneSlowResponseBenchesAnEndpointForAboutTauLnRatio(t *testing.T) {
	def := exclusionAfterOnePause(t, 0, 0, 16, 50*time.Millisecond)
	short := exclusionAfterOnePause(t, 0, time.Second, 16, 50*time.Millisecond)
	linkerd := exclusionAfterOnePause(t, 1, 0, 16, 50*time.Millisecond)
	t.Logf("after one 50ms answer, ep2 is picked again after %v at the defaults, %v with decayTime 1s, %v at endpointConcurrency 1",
		def, short, linkerd)
	bound := time.Duration(1.5 * float64(10*time.Second) * math.Log(50.0/15))
	if def > bound || short > bound/10 || linkerd > time.Second {
		t.Errorf("one 50ms answer among 5ms ones kept a healthy endpoint out of 16 callers' picks for %v at the defaults "+
			"(want at most %v), %v with decayTime 1s (want at most %v), %v at endpointConcurrency 1 (want at most 1s)",
			def, bound, short, bound/10, linkerd)
	}
}

// TestOneSlowResponseBenchesAnEndpointOverGRPC is the same over real grpc
// on bufconn, on the bubble's clock, with the decay times short enough for
// the test to wait out (the defaults' 10s is pinned above, on the picker):
// three backends answering in 5ms, 16 closed-loop callers, backend 2
// answers one call in 50ms after a warm-up; how long from the end of that
// answer until backend 2 sees an attempt
// (waited for up to twice the bar; run uncapped it was 8.2-8.7s at
// endpointConcurrency 4 with a decay time of 10s, 5ms at
// endpointConcurrency 1).
func TestOneSlowResponseBenchesAnEndpointOverGRPC(t *testing.T) {
	for _, tt := range []struct {
		settings string
		max      time.Duration
	}{{`{"endpointConcurrency": 1}`, time.Second}, {`{"decayTime": "1s"}`, 2 * time.Second}} {
		synctest.Test(t, func(t *testing.T) {
			cl := resiliencetest.StartCluster(t, 3, nil, resiliencetest.WithServiceConfig(ewmaConfig(tt.settings)))
			var paused atomic.Bool
			var pausedAt, backAt atomic.Int64
			start := time.Now()
			for i, be := range cl.Backends {
				be.OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
					if i == 2 && time.Since(start) > 2*time.Second {
						if paused.CompareAndSwap(false, true) {
							pausedAt.Store(int64(time.Since(start)))
							return resiliencetest.Step{Delay: 50 * time.Millisecond}
						}
						// An attempt picked after the slow answer ended,
						// when the policy took its peak.
						if now := int64(time.Since(start)); now > pausedAt.Load()+int64(50*time.Millisecond) {
							backAt.CompareAndSwap(0, now)
						}
					}
					return resiliencetest.Step{Delay: 5 * time.Millisecond}
				})
			}
			ctx, cancel := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						_, _ = cl.EchoClient().Echo(ctx, &echov1.EchoRequest{Message: "x"})
					}
				}()
			}
			// Wait no longer than the bar needs: 1s past the slow answer's end.
			for backAt.Load() == 0 && (pausedAt.Load() == 0 || time.Since(start) < time.Duration(pausedAt.Load())+50*time.Millisecond+2*tt.max) {
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			wg.Wait()
			if backAt.Load() == 0 {
				t.Errorf("peak_ewma %s: one 50ms answer kept backend 2 out of 16 callers' calls for more than %v; want at most %v",
					tt.settings, 2*tt.max, tt.max)
				return
			}
			out := time.Duration(backAt.Load() - pausedAt.Load() - int64(50*time.Millisecond))
			t.Logf("peak_ewma %s: backend 2 back %v after its 50ms answer ended", tt.settings, out)
			if out > tt.max {
				t.Errorf("peak_ewma %s: one 50ms answer kept backend 2 out of 16 callers' calls for %v; want at most %v",
					tt.settings, out, tt.max)
			}
		})
	}
}

// TestZeroLatencyEstimateStillWeighsOutstanding pins the Penalty path for an
// estimate of 0 (an answer within one tick of a coarse monotonic clock, or
// any instant answer on a synctest bubble's clock): the cost is 0 × (1 +
// outstanding/N) = 0 whatever is in flight, so an endpoint with 100
// attempts stuck on it is cheaper than an idle one at 5ms, and a stalled
// endpoint that once answered "instantly" takes every call until τ passes.
// Finagle prices rtt 0 with work pending at its penalty. Not introduced by
// this commit (the old cost multiplied 0 too), but it is where
// endpointConcurrency's weighting has no effect at all.
func TestZeroLatencyEstimateStillWeighsOutstanding(t *testing.T) {
	pk, b := newTestPicker(t, 2, serviceconfig.EndpointPolicy{ChildPolicy: "peak_ewma"})
	now := b.nanotime(time.Now())
	pk.ready[0].e.lat.Observe(now, 0, pk.decay)
	pk.ready[1].e.lat.Observe(now, 5*time.Millisecond, pk.decay)
	pk.ready[0].e.outstanding.Store(100)
	defer pk.ready[0].e.outstanding.Store(0)
	if got, _ := pk.cheaper(0, 1, now); got != 1 {
		t.Errorf("cheaper(0ms with 100 in flight, 5ms idle) = ep%d, want ep1", got)
	}
}
