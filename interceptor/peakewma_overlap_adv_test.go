package interceptor

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestPeakEWMAPricesABusyHedgedAwayEndpointAboveTheCut (adv43b): under load
// the group rule of ObserveCut never ends a group. A cut joins the group
// when its attempt was sent before the latest cut, and with attempts in
// flight on the endpoint at every moment each one was, so every cut weighs
// the estimate saved before the first cut of the group, which decays to
// nothing: the price falls back to the bare cut, the defect ObserveCut was
// made to fix. One backend of three turns from 5 ms to 40 ms under 96
// closed-loop callers, hedging after 7 ms: its copies are cut at 12 ms.
// On the branch its estimate is ~15 ms and it gets 5.5% of the first
// attempts; with groups ended at their first cut, as ObserveCut's doc
// says ("sent before the first of them was cut"), ~24 ms and 3.25%.
func TestPeakEWMAPricesABusyHedgedAwayEndpointAboveTheCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mc := serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: echoService}},
			HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 7 * time.Millisecond,
				NonFatalStatusCodes: []codes.Code{codes.Unavailable}}}
		c := newTestClient(t, WithMethodConfig(mc), WithRetryBudget(nil))
		rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"childPolicy": [{"peak_ewma": {}}], `+noEjection[1:]))...)
		rg.waitReady(3)
		var slow atomic.Bool
		var slowFirst, calls atomic.Int64
		for i, b := range rg.backends {
			b.OnCall(func(a resiliencetest.Attempt) resiliencetest.Step {
				if i == 1 && slow.Load() {
					if a.Previous <= 0 {
						slowFirst.Add(1)
					}
					return resiliencetest.Step{Delay: 40 * time.Millisecond}
				}
				return resiliencetest.Step{Delay: 5 * time.Millisecond}
			})
		}
		stop := time.Now().Add(8 * time.Second)
		var wg sync.WaitGroup
		for range 96 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					_, _ = rg.echo().Echo(t.Context(), &echov1.EchoRequest{Message: "x"})
					if slow.Load() {
						calls.Add(1)
					}
				}
			})
		}
		time.Sleep(2 * time.Second)
		slow.Store(true)
		wg.Wait()
		est := rg.snapshot().Endpoints[1].Latency
		synctest.Wait()
		share := float64(slowFirst.Load()) / float64(calls.Load())
		t.Logf("slow backend: %d first attempts of %d calls (%.2f%%), estimate %v", slowFirst.Load(), calls.Load(), 100*share, est)
		if share > 0.042 {
			t.Fatalf("the slow backend got %.2f%% of the first attempts, estimate %v, want at most 4.2%% (~3.25%% with cuts in a row building up to 24ms): a group of cuts that never ends priced it at the 12ms cut", 100*share, est)
		}
	})
}
