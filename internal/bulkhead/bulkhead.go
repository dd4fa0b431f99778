package bulkhead

import (
	"context"
	"errors"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-resilience/resilience/internal/clock"
)

// Config is the normalized configuration of one Bulkhead.
type Config struct {
	// MaxConcurrent is the number of slots: attempts in flight at once;
	// in [1, 2147483647].
	MaxConcurrent int
	// MaxQueue is the number of attempts that may wait for a slot; in
	// [0, 2147483647]. 0 means none wait: Acquire fails at once when every
	// slot is taken.
	MaxQueue int
	// MaxQueueWait bounds each wait; ≥ 0. 0 means a wait is bounded by its
	// context alone.
	MaxQueueWait time.Duration
}

// Validate reports the first field of c that is out of range.
func (c Config) Validate() error {
	switch {
	case c.MaxConcurrent < 1 || c.MaxConcurrent > math.MaxInt32:
		return configError("MaxConcurrent", strconv.Itoa(c.MaxConcurrent), "must be in [1, 2147483647]")
	case c.MaxQueue < 0 || c.MaxQueue > math.MaxInt32:
		return configError("MaxQueue", strconv.Itoa(c.MaxQueue), "must be in [0, 2147483647]")
	case c.MaxQueueWait < 0:
		return configError("MaxQueueWait", c.MaxQueueWait.String(), "must not be negative")
	}
	return nil
}

func configError(field, value, msg string) error {
	return errors.New("bulkhead: Config." + field + " = " + value + ": " + msg)
}

// The rejections of Acquire. ErrQueueFull and ErrQueueTimeout wrap ErrFull;
// an error that is ErrContextDone is also the context's error
// (context.Canceled or context.DeadlineExceeded).
var (
	// ErrFull is the bulkhead turning an attempt away; the interceptor's
	// RESOURCE_EXHAUSTED.
	ErrFull = errors.New("bulkhead: full")
	// ErrQueueFull rejects an attempt at once: every slot is taken and the
	// queue is full (or MaxQueue is 0).
	ErrQueueFull = &wrapError{msg: "bulkhead: full: queue full", err: ErrFull}
	// ErrQueueTimeout rejects an attempt that waited MaxQueueWait in the
	// queue without getting a slot.
	ErrQueueTimeout = &wrapError{msg: "bulkhead: full: no slot within MaxQueueWait", err: ErrFull}
	// ErrContextDone rejects an attempt whose context was done before it got
	// a slot.
	ErrContextDone = errors.New("bulkhead: context done while waiting for a slot")
)

type wrapError struct {
	msg string
	err error
}

func (e *wrapError) Error() string { return e.msg }
func (e *wrapError) Unwrap() error { return e.err }

// contextError is ErrContextDone and the context's error at once.
type contextError struct{ cause error }

func (e *contextError) Error() string   { return ErrContextDone.Error() + ": " + e.cause.Error() }
func (e *contextError) Unwrap() []error { return []error{ErrContextDone, e.cause} }

// Bulkhead bounds the attempts of one method in flight and waiting. Create
// it with New; it is safe for concurrent use.
type Bulkhead struct {
	// state is waiting<<32 | inFlight. inFlight changes by CAS, with or
	// without mu; waiting changes only with mu held. While waiting > 0,
	// inFlight ≥ MaxConcurrent, and only holders of mu change state: a
	// freed slot goes to the first waiter, unless more than MaxConcurrent
	// are in flight (a Resize lowered it).
	state atomic.Uint64
	// The padding keeps state off the cache line of the fields below.
	_ [56]byte

	// The limits, set by New and changed by Resize with mu held; read
	// without a lock.
	max      atomic.Uint32 // MaxConcurrent
	maxQueue atomic.Uint32 // MaxQueue
	maxWait  atomic.Int64  // MaxQueueWait, in nanoseconds
	clk      clock.Clock   // fixed by New

	mu         sync.Mutex
	head, tail *waiter // the queue, oldest first; guarded by mu, as long as waiting
}

// A waiter is one Acquire in the queue.
type waiter struct {
	ready      chan struct{} // closed when granted
	granted    bool          // the waiter holds a slot; guarded by mu
	prev, next *waiter       // guarded by mu
}

// The state word counts waiters from bit 32: adding oneWaiting queues one,
// adding minusOneWaiting (two's complement) dequeues one.
const (
	oneWaiting      = 1 << 32
	minusOneWaiting = ^uint64(oneWaiting - 1)
)

// New returns a bulkhead with every slot free, or an error if cfg is out of
// range. Queue waits are timed with clk; nil means clock.Real.
func New(cfg Config, clk clock.Clock) (*Bulkhead, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if clk == nil {
		clk = clock.Real
	}
	b := &Bulkhead{clk: clk}
	b.setLimits(cfg)
	return b, nil
}

func (b *Bulkhead) setLimits(cfg Config) {
	b.max.Store(uint32(cfg.MaxConcurrent))
	b.maxQueue.Store(uint32(cfg.MaxQueue))
	b.maxWait.Store(int64(cfg.MaxQueueWait))
}

// Resize gives b the limits of cfg, or returns an error if cfg is out of
// range, keeping the slots taken and the queue, so that the new limits
// count the attempts already in flight and waiting:
//   - a raised MaxConcurrent hands its new slots to the waiters at once,
//     oldest first;
//   - a lowered MaxConcurrent takes no slot back: the holders keep theirs,
//     and no one gets a slot (nor does Release hand one to a waiter) until
//     fewer than the new MaxConcurrent are in flight;
//   - under a lowered MaxQueue, the attempts already waiting keep their
//     places; newcomers are refused with ErrQueueFull until fewer than the
//     new MaxQueue wait;
//   - a new MaxQueueWait bounds the waits that begin after Resize; a wait
//     under way keeps the bound it began with.
//
// Resize takes b's lock; Acquire and Release stay as cheap as they were.
// An Acquire under way while Resize runs may take a slot under either
// MaxConcurrent.
func (b *Bulkhead) Resize(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setLimits(cfg)
	// While someone waits, only holders of mu change state.
	for w := b.head; w != nil && uint32(b.state.Load()) < b.max.Load(); w = b.head {
		b.unlinkLocked(w)
		w.granted = true
		close(w.ready)
		b.state.Add(1 + minusOneWaiting) // one more in flight, one fewer waiting
	}
	return nil
}

// Acquire takes a slot, waiting in the queue if every slot is taken. It
// returns nil when the caller holds a slot, which it must give back with
// Release; otherwise it returns ErrQueueFull at once when the queue is full,
// ErrQueueTimeout after waiting MaxQueueWait, or an ErrContextDone error,
// which is also ctx.Err(), when ctx was done before a slot was free. A
// waiter leaves the queue as soon as it gives up.
//
// A free slot is taken without looking at ctx, taking no lock and allocating
// nothing. Waiters get slots in the order they came (FIFO), and no newcomer
// takes a slot while others wait.
func (b *Bulkhead) Acquire(ctx context.Context) error {
	if b.TryAcquire() {
		return nil
	}
	return b.acquireSlow(ctx)
}

// TryAcquire takes a free slot without waiting: it reports whether the
// caller now holds one, to give back with Release. Like Acquire, it never
// takes a slot while others wait, takes no lock and allocates nothing. A
// caller that must not block (it has other work to watch) tries first and
// queues with Acquire where the wait holds up nothing else.
func (b *Bulkhead) TryAcquire() bool {
	for {
		s := b.state.Load()
		if uint32(s) >= b.max.Load() || s >= oneWaiting {
			return false
		}
		if b.state.CompareAndSwap(s, s+1) {
			return true
		}
	}
}

// Full reports whether Acquire would return ErrQueueFull at once: every
// slot is taken and the queue is full (with MaxQueue 0, every slot is
// taken). It takes no lock and changes nothing; a slot may free up the
// moment after it answers, as it may after Acquire refuses.
func (b *Bulkhead) Full() bool {
	s := b.state.Load()
	return (uint32(s) >= b.max.Load() || s >= oneWaiting) && uint32(s>>32) >= b.maxQueue.Load()
}

func (b *Bulkhead) acquireSlow(ctx context.Context) error {
	if uint32(b.state.Load()>>32) >= b.maxQueue.Load() {
		return ErrQueueFull // needs no lock: the queue is at most as long
	}
	if err := ctx.Err(); err != nil {
		return &contextError{err}
	}
	b.mu.Lock()
	for {
		s := b.state.Load()
		inFlight, waiting := uint32(s), uint32(s>>32)
		if waiting == 0 && inFlight < b.max.Load() {
			if b.state.CompareAndSwap(s, s+1) {
				b.mu.Unlock()
				return nil // a slot was freed meanwhile
			}
			continue
		}
		if waiting >= b.maxQueue.Load() {
			b.mu.Unlock()
			return ErrQueueFull
		}
		// Conditional on inFlight, so that no Release frees a slot unseen.
		if b.state.CompareAndSwap(s, s+oneWaiting) {
			break
		}
	}
	w := &waiter{ready: make(chan struct{})}
	b.pushLocked(w)
	b.mu.Unlock()

	var timeout <-chan time.Time
	if d := time.Duration(b.maxWait.Load()); d > 0 {
		t := b.clk.NewTimer(d)
		defer t.Stop()
		timeout = t.C()
	}
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		return b.giveUp(w, &contextError{ctx.Err()})
	case <-timeout:
		return b.giveUp(w, ErrQueueTimeout)
	}
}

// giveUp takes w out of the queue, and returns err. If w was granted a slot
// before it could leave, it keeps the slot after a timeout (and returns nil)
// but gives it back when its context is done.
func (b *Bulkhead) giveUp(w *waiter, err error) error {
	b.mu.Lock()
	if !w.granted {
		b.unlinkLocked(w)
		b.state.Add(minusOneWaiting)
		b.mu.Unlock()
		return err
	}
	b.mu.Unlock()
	if err == ErrQueueTimeout {
		return nil
	}
	b.Release()
	return err
}

// Release gives back a slot taken by a successful Acquire, to the first
// waiter if any. It takes no lock and allocates nothing when no one waits.
// Release without a slot held panics.
func (b *Bulkhead) Release() {
	for {
		s := b.state.Load()
		if uint32(s) == 0 {
			panic("bulkhead: Release without a slot held")
		}
		if s >= oneWaiting {
			b.releaseSlow()
			return
		}
		if b.state.CompareAndSwap(s, s-1) {
			return
		}
	}
}

func (b *Bulkhead) releaseSlow() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w := b.head; w != nil && uint32(b.state.Load()) <= b.max.Load() {
		// Hand the slot over: inFlight stays, waiting drops.
		b.unlinkLocked(w)
		w.granted = true
		close(w.ready)
		b.state.Add(minusOneWaiting)
		return
	}
	// The waiters gave up since Release looked, or more than MaxConcurrent
	// are in flight (a Resize lowered it): the slot is not handed over.
	for {
		s := b.state.Load()
		if uint32(s) == 0 {
			panic("bulkhead: Release without a slot held")
		}
		if b.state.CompareAndSwap(s, s-1) {
			return
		}
	}
}

func (b *Bulkhead) pushLocked(w *waiter) {
	w.prev = b.tail
	if b.tail != nil {
		b.tail.next = w
	} else {
		b.head = w
	}
	b.tail = w
}

func (b *Bulkhead) unlinkLocked(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		b.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		b.tail = w.prev
	}
	w.prev, w.next = nil, nil
}

// Snapshot describes a Bulkhead at one instant.
type Snapshot struct {
	// InFlight is the number of slots taken, at most MaxConcurrent (more
	// after a Resize lowered it, until the holders release).
	InFlight int
	// Queued is the number of attempts waiting, at most MaxQueue (more after
	// a Resize lowered it, until the waiters leave).
	Queued int
}

// Snapshot describes the bulkhead now. It takes no lock.
func (b *Bulkhead) Snapshot() Snapshot {
	s := b.state.Load()
	return Snapshot{InFlight: int(uint32(s)), Queued: int(s >> 32)}
}
