package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestOverloadGoodputOfTheIssuesServer pins the goodput target of issue 33
// (finding 6) on fake time, for the issue's own server: 8 tokens × 5ms
// (capacity 1,600 calls/s), calls with 100ms deadlines, open loop at three
// times the capacity, no client retries, the default limit (Vegas): ≥ 95%
// of the capacity served at ≤ 2× the unloaded p99 (here 100% at 1.88×). In
// real time on loopback the issue measured 89.4-90.0% at 1.94-1.99×. The
// limit before the cost classes served 100% at 1.88× here too: on fake
// time (no sleep overshoots, no wait for a core) the limiter loses none of
// the capacity, so the tenth lost in real time is the machine's, which
// bench/overload's step scenario reports (tokens busy, service time as
// delivered, calls answered late).
func TestOverloadGoodputOfTheIssuesServer(t *testing.T) {
	if raceEnabled && *stressFor == 0 {
		t.Skip("14,400 calls over gRPC take minutes with -race on a busy machine (the numbers are fake time's, the same without it); -stress=1s runs it")
	}
	const (
		tokens   = 8
		service  = 5 * time.Millisecond
		deadline = 100 * time.Millisecond
		dur      = 3 * time.Second
		from     = time.Second
	)
	gap := func(x float64) time.Duration { return time.Duration(float64(service) / (tokens * x)) }
	run := func(ld load, limited bool) (*loadResult, []LimitStatus) {
		var res *loadResult
		var st []LimitStatus
		synctest.Test(t, func(t *testing.T) {
			ce := newCapacityEcho(tokens, service)
			var srv *Server
			if limited {
				srv = newLimitServer(t, limitsOf(serviceconfig.ConcurrencyLimit{}))
			}
			cc := serveEcho(t, ce, srv)
			res = ld.run(cc)
			synctest.Wait()
			ce.active.Wait()
			if srv != nil {
				st = srv.LimitStatuses()
			}
		})
		return res, st
	}
	unloaded, _ := run(load{gap: gap(0.5), dur: time.Second, deadline: deadline}, false)
	res, st := run(load{gap: gap(3), dur: dur, deadline: deadline, measureFrom: from}, true)
	capacity := float64(tokens) * float64(dur-from) / float64(service)
	good := float64(res.good[0]) / capacity
	base := unloaded.p(0.99)
	t.Logf("goodput %d of %.0f (%.1f%%), admitted p99 %v (%.2f× the unloaded %v), codes %v; %+v",
		res.good[0], capacity, 100*good, res.p(0.99), float64(res.p(0.99))/float64(base), base, res.codes, st)
	if good < 0.95 {
		t.Errorf("goodput at 3× = %.3f of the capacity, want ≥ 0.95", good)
	}
	if p := res.p(0.99); p > 2*base {
		t.Errorf("admitted p99 at 3× = %v, want ≤ 2 × the unloaded %v", p, base)
	}
}

// cheapCapacityEcho is a capacityEcho with a cheap method beside it:
// Lookup answers at once, holding no token.
type cheapCapacityEcho struct{ *capacityEcho }

func (cheapCapacityEcho) Lookup(_ context.Context, req *echov1.LookupRequest) (*echov1.LookupResponse, error) {
	return &echov1.LookupResponse{Message: req.GetMessage()}, nil
}

// TestOverloadCheapMethodBelowCapacity pins the cost target of issue 33
// (finding 1) on fake time, for the issue's server (8 tokens × 5ms,
// 100ms deadlines) under one server-wide limit of each algorithm: open
// loop below the capacity, with a cheap method at 1% of the calls beside
// the expensive one, no more than 5% of the expensive calls fail. With one
// base RTT for the server (before the cost classes), the cheap method's
// answer in no time became AIMD's base, the limit fell to 1 and 57% (at
// 0.5×) and 75% (at 0.9×) of the expensive calls were shed; Vegas needed
// more cheap calls than 1% to fall (TestLimitCheapMethodDoesNotShedAnExpensiveOne
// has the issue's one every millisecond).
func TestOverloadCheapMethodBelowCapacity(t *testing.T) {
	if raceEnabled && *stressFor == 0 {
		t.Skip("13,000 calls over gRPC take minutes with -race on a busy machine (the numbers are fake time's, the same without it); -stress=1s runs it")
	}
	const (
		tokens   = 8
		service  = 5 * time.Millisecond
		deadline = 100 * time.Millisecond
		dur      = 3 * time.Second
	)
	for _, algorithm := range []string{"vegas", "aimd"} {
		for _, x := range []float64{0.5, 0.9} {
			t.Run(fmt.Sprintf("%s at %.1f×", algorithm, x), func(t *testing.T) {
				var calls, shed, cheap atomic.Int64
				var st []LimitStatus
				synctest.Test(t, func(t *testing.T) {
					ce := newCapacityEcho(tokens, service)
					srv := newLimitServer(t, limitsOf(serviceconfig.ConcurrencyLimit{Algorithm: algorithm}))
					client := echov1.NewEchoServiceClient(serveEcho(t, cheapCapacityEcho{ce}, srv))
					gap := time.Duration(float64(service) / (tokens * x))
					var wg sync.WaitGroup
					for i := 0; time.Duration(i)*gap < dur; i++ {
						wg.Go(func() {
							ctx, cancel := context.WithTimeout(context.Background(), deadline)
							defer cancel()
							if i%100 == 50 {
								if _, err := client.Lookup(ctx, &echov1.LookupRequest{}); err == nil {
									cheap.Add(1)
								}
								return
							}
							_, err := client.Echo(ctx, &echov1.EchoRequest{})
							calls.Add(1)
							if err != nil {
								shed.Add(1)
							}
						})
						time.Sleep(gap)
					}
					wg.Wait()
					synctest.Wait()
					ce.active.Wait()
					st = srv.LimitStatuses()
				})
				share := float64(shed.Load()) / float64(calls.Load())
				t.Logf("%d of %d expensive calls failed (%.2f%%), %d cheap calls; %+v", shed.Load(), calls.Load(), 100*share, cheap.Load(), st)
				if share > 0.05 {
					t.Errorf("%.3f of the expensive calls failed below the capacity beside a cheap method at 1%%, want ≤ 0.05", share)
				}
			})
		}
	}
}
