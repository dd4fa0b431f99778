package interceptor

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
)

// TestPeakEWMAPricesABusyHedgedAwayEndpointAboveTheCut (the second
// adversary, stop 43): one backend of three turns from 5 ms to 40 ms under
// 32 closed-loop callers, hedging after 7 ms, so its copies are cut at
// 12 ms with attempts on it in flight at every moment. Each cut weighs the
// estimate its attempt was sent under, so the cuts build up to twice the
// cut, 24 ms, and it gets 1.38% of the first attempts; counted as the bare
// cut it is priced at 12 ms and gets 6.1–6.2%. A rule that grouped each
// cut with the latest cut before it never ended the group under such
// traffic and weighed every cut against the 5 ms from before it, decayed
// toward nothing: about 15 ms and 5.5% at 96 callers (7 of 7 runs).
func TestPeakEWMAPricesABusyHedgedAwayEndpointAboveTheCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rg := hedgedPeakEWMARig(t, 7*time.Millisecond)
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
		stop := time.Now().Add(5 * time.Second)
		var wg sync.WaitGroup
		for range 32 {
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
		if est < 20*time.Millisecond || share > 0.042 {
			t.Fatalf("the slow backend got %.2f%% of the first attempts, estimate %v, want at least 20ms (twice the 12ms cut) and at most 4.2%%: its cuts priced it near the bare cut", 100*share, est)
		}
	})
}
