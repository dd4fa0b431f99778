package endpoint

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

	"google.golang.org/grpc/balancer"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// tauLoad is a load on three endpoints on a bubble's clock: callers
// closed-loop callers, each waiting gap between the end of a call and its
// next pick, for dur; an attempt on endpoint k takes lat(k).
type tauLoad struct {
	callers int
	gap     time.Duration
	lat     func(k int) time.Duration
	dur     time.Duration
}

// tauResult is what the load saw: picks per endpoint and every call's
// latency.
type tauResult struct {
	picks [3]int
	lats  []time.Duration
}

func (r tauResult) share(k int) float64 {
	return float64(r.picks[k]) / float64(r.picks[0]+r.picks[1]+r.picks[2])
}

func (r tauResult) p99() time.Duration {
	s := slices.Clone(r.lats)
	slices.Sort(s)
	return s[len(s)*99/100]
}

func runTauLoad(t *testing.T, p serviceconfig.EndpointPolicy, l tauLoad) tauResult {
	var res tauResult
	synctest.Test(t, func(t *testing.T) {
		pk, b := newTestPicker(t, 3, p)
		b.rand = rand.Uint64
		var mu sync.Mutex
		deadline := time.Now().Add(l.dur)
		var wg sync.WaitGroup
		for range l.callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					r, err := pk.Pick(balancer.PickInfo{Ctx: context.Background()})
					if err != nil {
						t.Error(err)
						return
					}
					k := int(r.SubConn.(*fakeSubConn).name[2] - '0')
					d := l.lat(k)
					time.Sleep(d)
					r.Done(ok)
					mu.Lock()
					res.picks[k]++
					res.lats = append(res.lats, d)
					mu.Unlock()
					time.Sleep(l.gap)
				}
			}()
		}
		wg.Wait()
	})
	return res
}

// slowEp2 is three endpoints, ep2 10× slower than the others.
func slowEp2(fast time.Duration) func(int) time.Duration {
	return func(k int) time.Duration {
		if k == 2 {
			return 10 * fast
		}
		return fast
	}
}

// TestPeakEWMATriesASlowEndpointOncePerTauLnRatioAtLowTraffic pins what
// peak_ewma gives a persistently 10× slower endpoint at the request rates
// of a quiet client: one caller, one call every 1s, 200ms and 100ms (1, 5,
// 10 calls/s). The slow endpoint's estimate decays toward zero between its
// samples, so peak_ewma tries it again about every τ·ln(10) (23s at the
// default 10s): its share is about 1 / (rate × τ·ln 10), 4% at one call a
// second. An adversary found that a decay time of 1s (v0.5.0's first cut)
// sent it 20% of the calls at one a second and 4% at ten: the default
// stays Finagle's 10s.
func TestPeakEWMATriesASlowEndpointOncePerTauLnRatioAtLowTraffic(t *testing.T) {
	for _, gap := range []time.Duration{time.Second, 200 * time.Millisecond, 100 * time.Millisecond} {
		l := tauLoad{callers: 1, gap: gap, lat: slowEp2(5 * time.Millisecond), dur: 10 * time.Minute}
		def := runTauLoad(t, serviceconfig.EndpointPolicy{ChildPolicy: "peak_ewma"}, l)
		short := runTauLoad(t, serviceconfig.EndpointPolicy{ChildPolicy: "peak_ewma", DecayTime: time.Second}, l)
		rr := runTauLoad(t, serviceconfig.EndpointPolicy{ChildPolicy: "round_robin"}, l)
		t.Logf("a call every %v: slow endpoint's share %.1f%% (p99 %v) at the default τ 10s, %.1f%% (p99 %v) at 1s, round_robin %.1f%%",
			gap, 100*def.share(2), def.p99(), 100*short.share(2), short.p99(), 100*rr.share(2))
		rate := float64(time.Second) / float64(gap+5*time.Millisecond)
		want := 1.5 / (rate * 10 * math.Log(10))
		if def.share(2) > want {
			t.Errorf("a call every %v: peak_ewma (defaults) sent the 10× slower endpoint %.1f%% of the calls (p99 %v); want at most %.1f%%, "+
				"about one call per τ·ln 10", gap, 100*def.share(2), def.p99(), 100*want)
		}
	}
}

// TestPeakEWMAPricesABusyEndpointOfASlowMethodAsUnmeasured pins the
// Penalty rule ("attempts outstanding and no observation within τ: Penalty
// + outstanding", meant for an endpoint never measured or back after a
// long absence) against a decay time shorter than a method's latency (an
// adversary's finding on v0.5.0's first cut, a default of 1s): on a method
// that takes 2s, an
// endpoint measured 1.1s ago at 2s with one call in flight costs Penalty
// (about 39 hours), so an idle endpoint measured 1.1s ago at 20s (10×
// slower) is cheaper and takes the pick. With τ 10s the busy fast one
// costs 2.2s against the slow one's 18s.
func TestPeakEWMAPricesABusyEndpointOfASlowMethodAsUnmeasured(t *testing.T) {
	for _, tau := range []time.Duration{0, 10 * time.Second} { // the default, and explicitly
		pk, b := newTestPicker(t, 3, serviceconfig.EndpointPolicy{ChildPolicy: "peak_ewma", DecayTime: tau})
		t0 := b.nanotime(time.Now())
		pk.ready[0].e.lat.Observe(t0, 2*time.Second, pk.decay)
		pk.ready[2].e.lat.Observe(t0, 20*time.Second, pk.decay)
		pk.ready[0].e.outstanding.Store(1)
		now := t0 + int64(1100*time.Millisecond)
		if got, _ := pk.cheaper(0, 2, now); got != 0 {
			t.Errorf("τ %v: cheaper(2s measured 1.1s ago with 1 in flight, 20s measured 1.1s ago idle) = ep%d, want ep0 (costs %.3g vs %.3g ns)",
				pk.decay, got,
				pk.ready[0].e.lat.Cost(now, 1, pk.perAttempt, pk.decay), pk.ready[2].e.lat.Cost(now, 0, pk.perAttempt, pk.decay))
		}
		pk.ready[0].e.outstanding.Store(0)
	}
}

// TestPeakEWMAAvoidsASlowEndpointOnAMethodSlowerThanTheDecayTime: 12
// closed-loop callers on a method that takes 1.5s or 2s, one endpoint of
// three 10× slower (15s, 20s). A fast endpoint with about 6 calls in
// flight costs 2s × (1 + 6/4) = 5s; the idle slow one's 20s estimate decays
// below that τ·ln 4 after its last answer: at a decay time of 1s (v0.5.0's
// first cut) it was probed again about every 1.4s and got 2.9–3.0% of the
// calls, its latency the p99; at the default 10s, 0.5%.
func TestPeakEWMAAvoidsASlowEndpointOnAMethodSlowerThanTheDecayTime(t *testing.T) {
	for _, fast := range []time.Duration{1500 * time.Millisecond, 2 * time.Second} {
		l := tauLoad{callers: 12, lat: slowEp2(fast), dur: time.Hour}
		def := runTauLoad(t, serviceconfig.EndpointPolicy{ChildPolicy: "peak_ewma"}, l)
		t.Logf("a %v method, 12 callers: slow endpoint's share %.2f%% (p99 %v) at the default τ 10s",
			fast, 100*def.share(2), def.p99())
		if def.share(2) > 0.01 {
			t.Errorf("a %v method, 12 callers: peak_ewma (defaults) sent the 10× slower endpoint %.2f%% of the calls (p99 %v); want at most 1%% (p99 %v)",
				fast, 100*def.share(2), def.p99(), fast)
		}
	}
}

// TestPeakEWMAAvoidsASlowBackendAtOneCallPerSecondOverGRPC is the low
// traffic case over real grpc on bufconn, on the bubble's clock: three
// backends, backend 2 answers in 50ms and the others in 5ms, one call per
// second for 5 minutes: at most about one call per τ·ln 10 (23s) to the
// slow one, 4% (20% at a decay time of 1s).
func TestPeakEWMAAvoidsASlowBackendAtOneCallPerSecondOverGRPC(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl := resiliencetest.StartCluster(t, 3, nil, resiliencetest.WithServiceConfig(ewmaConfig(`{}`)))
		var calls [3]atomic.Int64
		for i, be := range cl.Backends {
			be.OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
				calls[i].Add(1)
				if i == 2 {
					return resiliencetest.Step{Delay: 50 * time.Millisecond}
				}
				return resiliencetest.Step{Delay: 5 * time.Millisecond}
			})
		}
		const n = 300
		for range n {
			if _, err := cl.EchoClient().Echo(t.Context(), &echov1.EchoRequest{Message: "x"}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
		}
		share := float64(calls[2].Load()) / float64(calls[0].Load()+calls[1].Load()+calls[2].Load())
		t.Logf("one call per second: backends saw %d/%d/%d calls", calls[0].Load(), calls[1].Load(), calls[2].Load())
		if want := 1.5 / (10 * math.Log(10)); share > want {
			t.Errorf("one call per second: peak_ewma (defaults) sent the 10× slower backend %.1f%% of %d calls; want at most %.1f%%, about one per τ·ln 10",
				100*share, n, 100*want)
		}
	})
}
