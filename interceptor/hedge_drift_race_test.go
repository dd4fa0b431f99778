package interceptor

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/internal/budget"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestHedgeTailRestartsUnderConcurrencyNeverLoseTheDelay drives the drift
// detector of hedge_delay.go from 8 goroutines at once while config updates
// race with it: the latency jumps between 2ms and 40ms every 48 copies, so
// the window restarts up and down again and again, racing with the copies
// observed meanwhile, with the recomputes every 16 copies and with
// configure. Every copy lasts 1ms or more, so the delay in force, whenever
// it is read from the window, is 1ms or more: a delay of 0 (every copy sent
// at once) would mean a recompute read an empty window. The race detector
// watches the rest.
func TestHedgeTailRestartsUnderConcurrencyNeverLoseTheDelay(t *testing.T) {
	p95 := &hedgePolicy{quantile: 0.95, delay: noTimedCopies, minSamples: 32}
	p50 := &hedgePolicy{quantile: 0.5, delay: noTimedCopies, minSamples: 32}
	tail := newHedgeTail()
	tail.configure(p95, nil)
	var (
		wg      sync.WaitGroup
		stop    atomic.Bool
		count   atomic.Uint64
		zero    atomic.Int64 // a delay of 0 read, or 0
		readers sync.WaitGroup
	)
	readers.Add(1)
	go func() {
		defer readers.Done()
		for !stop.Load() {
			if d := tail.delayOf(p95); d == 0 {
				zero.Add(1)
			}
		}
	}()
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 4000 {
				n := count.Add(1)
				d := 2*time.Millisecond + time.Duration(k%7)*50*time.Microsecond
				if (n/48)%2 == 1 {
					d = 40*time.Millisecond + time.Duration(g)*time.Millisecond
				}
				tail.observe(d, k%3 == 0) // a third cut off by a sibling
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 200 {
			if i%2 == 0 {
				tail.configure(p50, nil)
			} else {
				tail.configure(p95, nil)
			}
		}
		tail.configure(p95, nil)
	}()
	wg.Wait()
	stop.Store(true)
	readers.Wait()
	if n := zero.Load(); n > 0 {
		t.Errorf("the delay read 0 (every copy at once) %d times; every copy lasted 1ms or more", n)
	}
	if d := tail.delayOf(p95); d < time.Millisecond {
		t.Errorf("delay at the end = %v, want 1ms or more", d)
	}
	// The detector still follows a drift up: 32 copies of 100ms.
	for range 32 {
		tail.observe(100*time.Millisecond, false)
	}
	if d := tail.delayOf(p95); d < 100*time.Millisecond || d > 105*time.Millisecond {
		t.Errorf("delay after 32 copies of 100ms = %v, want their bucket's edge (104.9ms)", d)
	}
}

// TestHedgeTailRestartKeepsTheWindowWhenNoCopyQualifies pins restart's
// guard: when none of the last 16 copies is below the delay a drift up
// left (copies observed meanwhile took the places of those that counted),
// the window is kept, not emptied: an empty window reads a delay of 0,
// every copy sent at once.
func TestHedgeTailRestartKeepsTheWindowWhenNoCopyQualifies(t *testing.T) {
	hp := &hedgePolicy{quantile: 0.95, delay: noTimedCopies, minSamples: 32}
	tail := newHedgeTail()
	tail.configure(hp, nil)
	for range 64 {
		tail.observe(40*time.Millisecond, false)
	}
	tail.restart(10 * time.Millisecond) // every recent copy is 40ms
	tail.maybeRecompute(tail.window.Samples(), true)
	if d := tail.delayOf(hp); d < 40*time.Millisecond {
		t.Errorf("delay after a restart with no copy below 10ms = %v, want the 40ms bucket's edge", d)
	}
}

// TestHedgeTailCountsNothingAboveNoTimedCopies: with no timed copies (a
// budget paying for nothing: the delay is noTimedCopies, below every
// duration), no copy counts as above the delay, so the drift detector
// forces no recompute every driftOver copies (before, every copy counted,
// and every 12th took the tail's lock to recompute a delay that cannot
// change).
func TestHedgeTailCountsNothingAboveNoTimedCopies(t *testing.T) {
	now := time.Now()
	b, err := budget.New(budget.Config{Ratio: 0, MinRetriesPerSecond: 0, TTL: 10 * time.Second}, now)
	if err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		b.OnRequest(now)
	}
	hp := newHedgePolicy(&serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 5 * time.Millisecond})
	tail := newHedgeTail()
	tail.configure(hp, b)
	for i := range 64 {
		tail.observe(time.Duration(2+i%3)*time.Millisecond, false)
	}
	if d := tail.delayOf(hp); d != noTimedCopies {
		t.Fatalf("delay = %v, want noTimedCopies: the budget pays for nothing", d)
	}
	for range 40 {
		tail.observe(40*time.Millisecond, false)
	}
	if n := tail.over.Load(); n != 0 {
		t.Errorf("%d copies counted above a delay of noTimedCopies, want 0", n)
	}
}
