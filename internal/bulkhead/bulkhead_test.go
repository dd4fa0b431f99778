package bulkhead

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/grpc-resilience/resilience/internal/clock"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func mustNew(t *testing.T, cfg Config, clk clock.Clock) *Bulkhead {
	t.Helper()
	b, err := New(cfg, clk)
	if err != nil {
		t.Fatalf("New(%+v) = %v", cfg, err)
	}
	return b
}

func wantSnapshot(t *testing.T, b *Bulkhead, inFlight, queued int) {
	t.Helper()
	if got, want := b.Snapshot(), (Snapshot{InFlight: inFlight, Queued: queued}); got != want {
		t.Fatalf("Snapshot() = %+v, want %+v", got, want)
	}
}

// acquireAsync starts Acquire in a goroutine and returns the channel its
// result arrives on.
func acquireAsync(ctx context.Context, b *Bulkhead) <-chan error {
	c := make(chan error, 1)
	go func() { c <- b.Acquire(ctx) }()
	return c
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "one slot", cfg: Config{MaxConcurrent: 1}},
		{name: "all set", cfg: Config{MaxConcurrent: 64, MaxQueue: 128, MaxQueueWait: time.Second}},
		{name: "zero", cfg: Config{},
			wantErr: "bulkhead: Config.MaxConcurrent = 0: must be in [1, 2147483647]"},
		{name: "too many slots", cfg: Config{MaxConcurrent: 1 << 31},
			wantErr: "bulkhead: Config.MaxConcurrent = 2147483648: must be in [1, 2147483647]"},
		{name: "negative queue", cfg: Config{MaxConcurrent: 1, MaxQueue: -1},
			wantErr: "bulkhead: Config.MaxQueue = -1: must be in [0, 2147483647]"},
		{name: "negative wait", cfg: Config{MaxConcurrent: 1, MaxQueueWait: -time.Millisecond},
			wantErr: "bulkhead: Config.MaxQueueWait = -1ms: must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ""
			if err := tt.cfg.Validate(); err != nil {
				got = err.Error()
			}
			if got != tt.wantErr {
				t.Errorf("Validate() = %q, want %q", got, tt.wantErr)
			}
			b, err := New(tt.cfg, nil)
			if (err == nil) != (tt.wantErr == "") || (err == nil) != (b != nil) {
				t.Errorf("New() = %v, %v, want error %q", b, err, tt.wantErr)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		err   error
		is    []error
		isNot []error
	}{
		{err: ErrQueueFull, is: []error{ErrFull}, isNot: []error{ErrQueueTimeout, ErrContextDone}},
		{err: ErrQueueTimeout, is: []error{ErrFull}, isNot: []error{ErrQueueFull, ErrContextDone}},
		{err: &contextError{context.Canceled}, is: []error{ErrContextDone, context.Canceled}, isNot: []error{ErrFull}},
		{err: &contextError{context.DeadlineExceeded}, is: []error{ErrContextDone, context.DeadlineExceeded}},
	}
	for _, tt := range tests {
		for _, target := range tt.is {
			if !errors.Is(tt.err, target) {
				t.Errorf("errors.Is(%v, %v) = false, want true", tt.err, target)
			}
		}
		for _, target := range tt.isNot {
			if errors.Is(tt.err, target) {
				t.Errorf("errors.Is(%v, %v) = true, want false", tt.err, target)
			}
		}
	}
}

func TestCapacityWithoutQueue(t *testing.T) {
	b := mustNew(t, Config{MaxConcurrent: 2}, nil)
	ctx := context.Background()
	for i := range 2 {
		if err := b.Acquire(ctx); err != nil {
			t.Fatalf("Acquire() #%d = %v, want nil", i, err)
		}
	}
	wantSnapshot(t, b, 2, 0)
	if err := b.Acquire(ctx); err != ErrQueueFull {
		t.Fatalf("Acquire() with every slot taken = %v, want %v", err, ErrQueueFull)
	}
	b.Release()
	wantSnapshot(t, b, 1, 0)
	if err := b.Acquire(ctx); err != nil {
		t.Fatalf("Acquire() after Release = %v, want nil", err)
	}
	b.Release()
	b.Release()
	wantSnapshot(t, b, 0, 0)
}

func TestFreeSlotIgnoresDoneContext(t *testing.T) {
	b := mustNew(t, Config{MaxConcurrent: 1, MaxQueue: 1}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Acquire(ctx); err != nil {
		t.Fatalf("Acquire(done ctx) with a free slot = %v, want nil", err)
	}
	// With every slot taken, a done context is not queued.
	if err := b.Acquire(ctx); !errors.Is(err, ErrContextDone) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire(done ctx) with every slot taken = %v, want ErrContextDone and context.Canceled", err)
	}
	wantSnapshot(t, b, 1, 0)
	b.Release()
}

func TestQueueBoundAndFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(t, Config{MaxConcurrent: 1, MaxQueue: 2}, nil)
		ctx := context.Background()
		if err := b.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		first := acquireAsync(ctx, b)
		synctest.Wait()
		second := acquireAsync(ctx, b)
		synctest.Wait()
		wantSnapshot(t, b, 1, 2)
		if err := b.Acquire(ctx); err != ErrQueueFull {
			t.Fatalf("Acquire() with the queue full = %v, want %v", err, ErrQueueFull)
		}

		b.Release() // to first
		synctest.Wait()
		select {
		case err := <-first:
			if err != nil {
				t.Fatalf("first waiter: Acquire() = %v, want nil", err)
			}
		default:
			t.Fatal("Release did not wake the first waiter")
		}
		select {
		case err := <-second:
			t.Fatalf("second waiter: Acquire() = %v before its turn", err)
		default:
		}
		wantSnapshot(t, b, 1, 1)

		b.Release() // to second
		if err := <-second; err != nil {
			t.Fatalf("second waiter: Acquire() = %v, want nil", err)
		}
		wantSnapshot(t, b, 1, 0)
		b.Release()
		wantSnapshot(t, b, 0, 0)
	})
}

func TestQueueWaitTimeout(t *testing.T) {
	tests := []struct {
		name string
		clk  func() *clock.Fake // nil: clock.Real, fake inside the bubble
	}{
		{name: "fake clock", clk: func() *clock.Fake { return clock.NewFake(time.Unix(1000, 0)) }},
		{name: "real clock in a synctest bubble"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const wait = 100 * time.Millisecond
				var (
					fake *clock.Fake
					clk  clock.Clock = clock.Real
				)
				if tt.clk != nil {
					fake = tt.clk()
					clk = fake
				}
				b := mustNew(t, Config{MaxConcurrent: 1, MaxQueue: 1, MaxQueueWait: wait}, clk)
				if err := b.Acquire(context.Background()); err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				done := acquireAsync(context.Background(), b)
				synctest.Wait()
				wantSnapshot(t, b, 1, 1)
				if fake != nil {
					fake.Advance(wait - time.Nanosecond)
					synctest.Wait()
					wantSnapshot(t, b, 1, 1)
					fake.Advance(time.Nanosecond)
				}
				if err := <-done; err != ErrQueueTimeout {
					t.Fatalf("Acquire() = %v, want %v", err, ErrQueueTimeout)
				}
				if fake == nil {
					if waited := time.Since(start); waited != wait {
						t.Errorf("Acquire() gave up after %v, want %v", waited, wait)
					}
				} else if n := fake.Pending(); n != 0 {
					t.Errorf("fake clock has %d pending timers, want 0", n)
				}
				wantSnapshot(t, b, 1, 0)
				b.Release()
				wantSnapshot(t, b, 0, 0)
			})
		})
	}
}

func TestContextDoneWhileQueued(t *testing.T) {
	tests := []struct {
		name    string
		wait    time.Duration
		ctx     func() (context.Context, context.CancelFunc)
		cancel  bool // cancel instead of letting the deadline pass
		wantCtx error
	}{
		{
			name: "cancel",
			wait: time.Hour,
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithCancel(context.Background())
			},
			cancel:  true,
			wantCtx: context.Canceled,
		},
		{
			name: "deadline before MaxQueueWait",
			wait: time.Hour,
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), time.Second)
			},
			wantCtx: context.DeadlineExceeded,
		},
		{
			name: "deadline without MaxQueueWait",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), time.Second)
			},
			wantCtx: context.DeadlineExceeded,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := mustNew(t, Config{MaxConcurrent: 1, MaxQueue: 2, MaxQueueWait: tt.wait}, nil)
				if err := b.Acquire(context.Background()); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := tt.ctx()
				defer cancel()
				start := time.Now()
				done := acquireAsync(ctx, b)
				other := acquireAsync(context.Background(), b)
				synctest.Wait()
				wantSnapshot(t, b, 1, 2)
				if tt.cancel {
					cancel()
				}
				err := <-done
				if !errors.Is(err, ErrContextDone) || !errors.Is(err, tt.wantCtx) {
					t.Fatalf("Acquire() = %v, want ErrContextDone and %v", err, tt.wantCtx)
				}
				if !tt.cancel && time.Since(start) != time.Second {
					t.Errorf("Acquire() gave up after %v, want 1s", time.Since(start))
				}
				wantSnapshot(t, b, 1, 1) // left the queue at once
				b.Release()              // to the other waiter
				if err := <-other; err != nil {
					t.Fatalf("other waiter: Acquire() = %v, want nil", err)
				}
				b.Release()
				wantSnapshot(t, b, 0, 0)
			})
		})
	}
}

// TestGrantedWaiterThatGivesUp pins what happens when a slot is handed to a
// waiter just as it gives up: after a timeout it keeps the slot; after its
// context is done it passes the slot on.
func TestGrantedWaiterThatGivesUp(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantErr    error
		wantQueued int // after giveUp; a second waiter was queued behind
	}{
		{name: "timeout keeps the slot", err: ErrQueueTimeout, wantErr: nil, wantQueued: 1},
		{name: "context done passes it on", err: &contextError{context.Canceled}, wantErr: ErrContextDone, wantQueued: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustNew(t, Config{MaxConcurrent: 1, MaxQueue: 2}, nil)
			b.state.Store(1 + 2*oneWaiting)
			w1 := &waiter{ready: make(chan struct{})}
			w2 := &waiter{ready: make(chan struct{})}
			b.pushLocked(w1)
			b.pushLocked(w2)
			b.Release() // hands the slot to w1
			if !w1.granted {
				t.Fatal("Release did not grant the slot to the first waiter")
			}
			wantSnapshot(t, b, 1, 1)
			if err := b.giveUp(w1, tt.err); !errors.Is(err, tt.wantErr) {
				t.Fatalf("giveUp(%v) = %v, want %v", tt.err, err, tt.wantErr)
			}
			if w2.granted != (tt.wantQueued == 0) {
				t.Errorf("second waiter granted = %v, want %v", w2.granted, tt.wantQueued == 0)
			}
			wantSnapshot(t, b, 1, tt.wantQueued)
		})
	}
}

func TestReleaseWithoutSlotPanics(t *testing.T) {
	b := mustNew(t, Config{MaxConcurrent: 1}, nil)
	defer func() {
		if r := recover(); r == nil {
			t.Error("Release() without a slot did not panic")
		}
	}()
	b.Release()
}

func TestFastPathDoesNotAllocate(t *testing.T) {
	b := mustNew(t, Config{MaxConcurrent: 1, MaxQueue: 1}, nil)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		if err := b.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		b.Release()
	})
	if allocs != 0 {
		t.Errorf("AllocsPerRun(Acquire+Release) = %v, want 0", allocs)
	}
	if err := b.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	b2 := mustNew(t, Config{MaxConcurrent: 1}, nil)
	if err := b2.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	allocs = testing.AllocsPerRun(1000, func() {
		if err := b2.Acquire(ctx); err != ErrQueueFull {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("AllocsPerRun(rejected Acquire) = %v, want 0", allocs)
	}
	b.Release()
	b2.Release()
}

// TestFull: Full is true exactly when Acquire would refuse at once with
// ErrQueueFull: every slot taken and the queue full.
func TestFull(t *testing.T) {
	ctx := context.Background()
	b := mustNew(t, Config{MaxConcurrent: 1}, nil)
	if b.Full() {
		t.Error("Full() with a free slot = true")
	}
	if err := b.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if !b.Full() {
		t.Error("Full() with every slot taken and no queue = false")
	}
	b.Release()
	if b.Full() {
		t.Error("Full() after Release = true")
	}

	q := mustNew(t, Config{MaxConcurrent: 1, MaxQueue: 1, MaxQueueWait: time.Hour}, nil)
	if err := q.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if q.Full() {
		t.Error("Full() with a place in the queue = true")
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- q.Acquire(wctx) }()
	for q.Snapshot().Queued != 1 {
		runtime.Gosched()
	}
	if !q.Full() {
		t.Error("Full() with the queue full = false")
	}
	if err := q.Acquire(ctx); err != ErrQueueFull {
		t.Errorf("Acquire() when Full = %v, want %v", err, ErrQueueFull)
	}
	cancel()
	<-done
	q.Release()
}

// TestTryAcquireTakesOnlyAFreeSlot pins TryAcquire: it takes a free slot,
// never waits, and never takes a slot while others wait in the queue.
func TestTryAcquireTakesOnlyAFreeSlot(t *testing.T) {
	b, err := New(Config{MaxConcurrent: 1, MaxQueue: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !b.TryAcquire() {
		t.Fatal("TryAcquire on a free bulkhead = false, want true")
	}
	if b.TryAcquire() {
		t.Fatal("TryAcquire with every slot taken = true, want false")
	}
	queued := make(chan error)
	go func() { queued <- b.Acquire(context.Background()) }()
	for b.Snapshot().Queued != 1 {
		runtime.Gosched()
	}
	b.Release() // the slot goes to the waiter, not to a newcomer
	if err := <-queued; err != nil {
		t.Fatalf("queued Acquire = %v, want the freed slot", err)
	}
	if b.TryAcquire() {
		t.Error("TryAcquire took the slot the waiter was granted")
	}
	b.Release()
	if n := testing.AllocsPerRun(100, func() {
		if b.TryAcquire() {
			b.Release()
		}
	}); n != 0 {
		t.Errorf("TryAcquire+Release: %v allocs, want 0", n)
	}
}
