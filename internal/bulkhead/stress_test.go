package bulkhead

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/internal/clock"
)

// TestStress has many goroutines take and give back slots, some with
// contexts cancelled while they wait and some timing out, and checks the
// invariants: never more than MaxConcurrent holders or MaxQueue waiters,
// every rejection one of the documented errors, and an empty bulkhead at
// the end.
func TestStress(t *testing.T) {
	const (
		goroutines = 8
		iterations = 500
		slots      = 3
		queue      = 4
	)
	b := mustNew(t, Config{MaxConcurrent: slots, MaxQueue: queue, MaxQueueWait: 100 * time.Microsecond}, clock.Real)
	var (
		holders  atomic.Int64
		admitted atomic.Int64
		rejected [3]atomic.Int64 // queue full, timeout, context done
		wg       sync.WaitGroup
	)
	for g := range goroutines {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for range iterations {
				ctx, cancel := context.WithCancel(context.Background())
				if r.IntN(10) == 0 {
					go cancel() // races with the wait
				}
				err := b.Acquire(ctx)
				switch {
				case err == nil:
					admitted.Add(1)
					if n := holders.Add(1); n > slots {
						t.Errorf("%d holders, want at most %d", n, slots)
					}
					if s := b.Snapshot(); s.InFlight > slots || s.Queued > queue {
						t.Errorf("Snapshot() = %+v, want InFlight ≤ %d, Queued ≤ %d", s, slots, queue)
					}
					for range r.IntN(4) {
						runtime.Gosched()
					}
					holders.Add(-1)
					b.Release()
				case err == ErrQueueFull:
					rejected[0].Add(1)
				case err == ErrQueueTimeout:
					rejected[1].Add(1)
				case errors.Is(err, ErrContextDone) && errors.Is(err, context.Canceled):
					rejected[2].Add(1)
				default:
					t.Errorf("Acquire() = %v, want nil or a documented rejection", err)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	wantSnapshot(t, b, 0, 0)
	t.Logf("admitted %d, queue full %d, timed out %d, context done %d",
		admitted.Load(), rejected[0].Load(), rejected[1].Load(), rejected[2].Load())
}
