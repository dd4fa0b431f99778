package bulkhead

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/grpc-resilience/resilience/internal/clock"
)

// queueN starts n Acquires that must queue, one after the other so that
// their order in the queue is that of the returned channels. Call it inside
// a synctest bubble.
func queueN(ctx context.Context, b *Bulkhead, n int) []<-chan error {
	var cs []<-chan error
	for range n {
		cs = append(cs, acquireAsync(ctx, b))
		synctest.Wait()
	}
	return cs
}

// granted reports which of cs got a slot by now (nil), failing t on any
// other result.
func granted(t *testing.T, cs []<-chan error) []bool {
	t.Helper()
	got := make([]bool, len(cs))
	for i, c := range cs {
		select {
		case err := <-c:
			if err != nil {
				t.Fatalf("waiter %d: Acquire() = %v, want nil", i, err)
			}
			got[i] = true
		default:
		}
	}
	return got
}

func TestResizeRaisedCapAdmitsWaitersAtOnceOldestFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(t, Config{MaxConcurrent: 1, MaxQueue: 4}, nil)
		if err := b.Acquire(t.Context()); err != nil {
			t.Fatal(err)
		}
		ws := queueN(t.Context(), b, 3)
		wantSnapshot(t, b, 1, 3)
		if err := b.Resize(Config{MaxConcurrent: 3, MaxQueue: 4}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := granted(t, ws); !got[0] || !got[1] || got[2] {
			t.Fatalf("after raising MaxConcurrent 1 → 3, waiters granted = %v, want [true true false]", got)
		}
		wantSnapshot(t, b, 3, 1)
		if b.TryAcquire() {
			t.Fatal("TryAcquire() with every slot taken and one waiting = true")
		}
		b.Release() // to the last waiter
		synctest.Wait()
		if got := granted(t, ws[2:]); !got[0] {
			t.Fatal("last waiter not granted the released slot")
		}
		for range 3 {
			b.Release()
		}
		wantSnapshot(t, b, 0, 0)
	})
}

func TestResizeLoweredCapPreemptsNoOneAndAdmitsBelowIt(t *testing.T) {
	b := mustNew(t, Config{MaxConcurrent: 4}, nil)
	for range 4 {
		if err := b.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Resize(Config{MaxConcurrent: 1}); err != nil {
		t.Fatal(err)
	}
	wantSnapshot(t, b, 4, 0) // nobody preempted
	for held := 4; held > 1; held-- {
		if b.TryAcquire() || b.Acquire(context.Background()) != ErrQueueFull || !b.Full() {
			t.Fatalf("with %d in flight under MaxConcurrent 1, a slot was taken or Full() = false", held)
		}
		b.Release()
	}
	wantSnapshot(t, b, 1, 0)
	if b.TryAcquire() {
		t.Fatal("TryAcquire() with 1 in flight under MaxConcurrent 1 = true")
	}
	b.Release()
	if !b.TryAcquire() {
		t.Fatal("TryAcquire() with none in flight = false")
	}
	b.Release()
	wantSnapshot(t, b, 0, 0)
}

// A Release above a lowered cap frees its slot instead of handing it to a
// waiter; the waiter gets the first slot freed under the cap.
func TestResizeLoweredCapHandsNoSlotToWaitersAboveIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(t, Config{MaxConcurrent: 3, MaxQueue: 2}, nil)
		for range 3 {
			if err := b.Acquire(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		ws := queueN(t.Context(), b, 2)
		if err := b.Resize(Config{MaxConcurrent: 1, MaxQueue: 2}); err != nil {
			t.Fatal(err)
		}
		b.Release()
		b.Release()
		synctest.Wait()
		if got := granted(t, ws); got[0] || got[1] {
			t.Fatalf("Release() with 3 then 2 in flight under MaxConcurrent 1 granted %v, want no waiter", got)
		}
		wantSnapshot(t, b, 1, 2)
		b.Release()
		synctest.Wait()
		if got := granted(t, ws); !got[0] || got[1] {
			t.Fatalf("Release() with 1 in flight under MaxConcurrent 1 granted %v, want the oldest waiter", got)
		}
		wantSnapshot(t, b, 1, 1)
		b.Release()
		synctest.Wait()
		granted(t, ws[1:])
		b.Release()
		wantSnapshot(t, b, 0, 0)
	})
}

// Waiters already queued keep their places under a lowered MaxQueue, and
// are served in order; newcomers are refused until fewer than it wait.
func TestResizeLoweredQueueKeepsTheWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(t, Config{MaxConcurrent: 1, MaxQueue: 4}, nil)
		if err := b.Acquire(t.Context()); err != nil {
			t.Fatal(err)
		}
		ws := queueN(t.Context(), b, 3)
		if err := b.Resize(Config{MaxConcurrent: 1, MaxQueue: 1}); err != nil {
			t.Fatal(err)
		}
		wantSnapshot(t, b, 1, 3)
		if err := b.Acquire(t.Context()); err != ErrQueueFull || !b.Full() {
			t.Fatalf("Acquire() with 3 waiting under MaxQueue 1 = %v (Full %v), want %v", err, b.Full(), ErrQueueFull)
		}
		for i := range ws {
			b.Release()
			synctest.Wait()
			if got := granted(t, ws[i:]); !got[0] {
				t.Fatalf("waiter %d not granted in turn", i)
			}
			if i == 1 { // one waits: the queue is full again at MaxQueue 1
				if err := b.Acquire(t.Context()); err != ErrQueueFull {
					t.Fatalf("Acquire() with 1 waiting under MaxQueue 1 = %v, want %v", err, ErrQueueFull)
				}
			}
		}
		wantSnapshot(t, b, 1, 0)
		late := queueN(t.Context(), b, 1) // room again
		wantSnapshot(t, b, 1, 1)
		b.Release()
		synctest.Wait()
		granted(t, late)
		b.Release()
		wantSnapshot(t, b, 0, 0)
	})
}

// A new MaxQueueWait bounds the waits that begin after Resize; a wait
// under way keeps its own.
func TestResizeQueueWaitAppliesToNewWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(t, Config{MaxConcurrent: 1, MaxQueue: 2, MaxQueueWait: 10 * time.Second}, clock.Real)
		if err := b.Acquire(t.Context()); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		old := queueN(t.Context(), b, 1)
		if err := b.Resize(Config{MaxConcurrent: 1, MaxQueue: 2, MaxQueueWait: time.Second}); err != nil {
			t.Fatal(err)
		}
		late := queueN(t.Context(), b, 1)
		if err := <-late[0]; err != ErrQueueTimeout || time.Since(start) != time.Second {
			t.Errorf("wait begun after Resize = %v after %v, want %v after 1s", err, time.Since(start), ErrQueueTimeout)
		}
		if err := <-old[0]; err != ErrQueueTimeout || time.Since(start) != 10*time.Second {
			t.Errorf("wait begun before Resize = %v after %v, want %v after 10s", err, time.Since(start), ErrQueueTimeout)
		}
		b.Release()
		wantSnapshot(t, b, 0, 0)
	})
}

func TestResizeRefusesABadConfigAndKeepsTheLimits(t *testing.T) {
	b := mustNew(t, Config{MaxConcurrent: 1}, nil)
	err := b.Resize(Config{MaxConcurrent: 0})
	if want := "bulkhead: Config.MaxConcurrent = 0: must be in [1, 2147483647]"; err == nil || err.Error() != want {
		t.Fatalf("Resize(MaxConcurrent 0) = %v, want %q", err, want)
	}
	if !b.TryAcquire() || b.TryAcquire() {
		t.Fatal("after a refused Resize, MaxConcurrent is not 1")
	}
	b.Release()
}

// TestFastPathDoesNotAllocateAfterResize: a resized bulkhead's Acquire and
// Release allocate nothing, as a new one's.
func TestFastPathDoesNotAllocateAfterResize(t *testing.T) {
	b := mustNew(t, Config{MaxConcurrent: 4}, nil)
	if err := b.Resize(Config{MaxConcurrent: 1, MaxQueue: 1}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if allocs := testing.AllocsPerRun(1000, func() {
		if err := b.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		b.Release()
	}); allocs != 0 {
		t.Errorf("AllocsPerRun(Acquire+Release after Resize) = %v, want 0", allocs)
	}
}

// TestResizeStress flips MaxConcurrent between 1 and 8 (and MaxQueue with
// it) while goroutines take and give back slots, some cancelled while they
// wait: the holders never outnumber the largest MaxConcurrent in force
// since the oldest holder began to acquire, and nothing is held at the end.
func TestResizeStress(t *testing.T) {
	const goroutines, iterations = 16, 300
	var (
		mu      sync.Mutex
		caps    = []int{8} // caps[e]: MaxConcurrent from epoch e on
		epoch   atomic.Int64
		holders atomic.Int64
		starts  = map[*int64]bool{} // the epochs at which holders began
		wg      sync.WaitGroup
		stop    = make(chan struct{})
	)
	b := mustNew(t, Config{MaxConcurrent: 8, MaxQueue: 16}, clock.Real)
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			n := []int{1, 8}[i%2]
			mu.Lock()
			caps = append(caps, n)
			mu.Unlock()
			epoch.Add(1)
			if err := b.Resize(Config{MaxConcurrent: n, MaxQueue: 2 * n}); err != nil {
				t.Error(err)
			}
			runtime.Gosched()
		}
	})
	// bound is the largest MaxConcurrent in force since the oldest holder
	// began: an epoch before its start too, as a Resize under way may not
	// have stored its cap yet when the epoch moved.
	bound := func() int {
		mu.Lock()
		defer mu.Unlock()
		oldest := epoch.Load()
		for e := range starts {
			oldest = min(oldest, *e)
		}
		m := 0
		for _, c := range caps[max(oldest-1, 0):] {
			m = max(m, c)
		}
		return m
	}
	var callers sync.WaitGroup
	for g := range goroutines {
		callers.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 9))
			for range iterations {
				ctx, cancel := context.WithCancel(context.Background())
				if r.IntN(8) == 0 {
					go cancel()
				}
				start := epoch.Load()
				mu.Lock()
				starts[&start] = true
				mu.Unlock()
				err := b.Acquire(ctx)
				if err == nil {
					if n, m := holders.Add(1), bound(); int(n) > m {
						t.Errorf("%d holders, want at most %d (the largest cap since the oldest began)", n, m)
					}
					for range r.IntN(4) {
						runtime.Gosched()
					}
					holders.Add(-1)
					b.Release()
				} else if !errors.Is(err, ErrFull) && !errors.Is(err, ErrContextDone) {
					t.Errorf("Acquire() = %v, want nil or a documented rejection", err)
				}
				mu.Lock()
				delete(starts, &start)
				mu.Unlock()
				cancel()
			}
		})
	}
	callers.Wait()
	close(stop)
	wg.Wait()
	wantSnapshot(t, b, 0, 0)
}
