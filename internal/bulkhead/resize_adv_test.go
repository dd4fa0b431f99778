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

// TestResizeNeverStrandsAWaiter resizes every limit at random (caps 1 to
// 4, queues 0 to 8, queue waits none or short) while callers take and give
// back slots, some cancelled while they wait, some timing out: no Acquire
// waits past a resize that leaves a slot free (each is bounded by a 5s
// watchdog whose expiry would mean a stranded waiter), and nothing is held
// at the end.
func TestResizeNeverStrandsAWaiter(t *testing.T) {
	const goroutines, iterations = 24, 300
	b := mustNew(t, Config{MaxConcurrent: 2, MaxQueue: 4}, clock.Real)
	stop := make(chan struct{})
	var resizer, callers sync.WaitGroup
	resizer.Go(func() {
		r := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			cfg := Config{MaxConcurrent: 1 + r.IntN(4), MaxQueue: r.IntN(9)}
			if r.IntN(2) == 0 {
				cfg.MaxQueueWait = time.Duration(r.IntN(200)) * time.Microsecond
			}
			if err := b.Resize(cfg); err != nil {
				t.Error(err)
			}
			for range r.IntN(8) {
				runtime.Gosched()
			}
		}
	})
	var stranded atomic.Int64
	for g := range goroutines {
		callers.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 3))
			for range iterations {
				watchdog, stopWatch := context.WithTimeout(context.Background(), 5*time.Second)
				ctx, cancel := context.WithCancel(watchdog)
				if r.IntN(5) == 0 {
					go cancel()
				}
				err := b.Acquire(ctx)
				switch {
				case err == nil:
					for range r.IntN(4) {
						runtime.Gosched()
					}
					b.Release()
				case watchdog.Err() != nil:
					stranded.Add(1)
				case !errors.Is(err, ErrFull) && !errors.Is(err, ErrContextDone):
					t.Errorf("Acquire() = %v", err)
				}
				cancel()
				stopWatch()
			}
		})
	}
	callers.Wait()
	close(stop)
	resizer.Wait()
	if n := stranded.Load(); n > 0 {
		t.Errorf("%d waiters were never woken", n)
	}
	wantSnapshot(t, b, 0, 0)
}
