package interceptor

import (
	"sync"
	"testing"
	"time"
)

// TestHedgeTailConfigureWinsOverAConcurrentRecompute: a config update
// (configure) while copies are observed must leave the delay the new config
// computes. An observation's recompute read the old config's inputs and
// stored its delay, and ready, after configure's: a new config that raised
// hedgingDelayMinSamples past the copies seen kept the old config's delay
// in force (ready) until the window reached the new warm-up, instead of
// the policy's own delay.
func TestHedgeTailConfigureWinsOverAConcurrentRecompute(t *testing.T) {
	warm := &hedgePolicy{quantile: 0.95, floor: time.Millisecond, minSamples: 1}
	cold := &hedgePolicy{delay: 7 * time.Millisecond, minSamples: 1 << 40}
	for i := range 200 {
		tail := newHedgeTail()
		tail.configure(warm, nil)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for k := range 32 {
					// Every observation recomputes: the count passes a
					// multiple of 16 often, and ready is false at times.
					tail.observe(time.Duration(1+(g*32+k)%50)*time.Millisecond, false)
				}
			}()
		}
		close(start)
		tail.configure(cold, nil)
		wg.Wait()
		if got := tail.delayOf(cold); got != cold.delay {
			t.Fatalf("run %d: delay %v after the update to a policy whose window is not warm, want its own %v (ready %v)",
				i, got, cold.delay, tail.ready.Load())
		}
	}
}
