// Package bulkhead is the bulkhead engine: one Bulkhead bounds how many
// attempts of one method are in flight and how many wait, so that a slow
// method cannot take all of a client. It knows nothing of gRPC.
//
// # Use
//
//	if err := b.Acquire(ctx); err != nil {
//		// ErrQueueFull or ErrQueueTimeout (both ErrFull), or ErrContextDone
//	}
//	defer b.Release()
//	... the attempt ...
//
// # Algorithm
//
// A Bulkhead has MaxConcurrent slots (≥ 1) and a queue of at most MaxQueue
// waiters (default 0: none). Acquire takes a free slot at once. With every
// slot taken it joins the queue, or fails with ErrQueueFull when MaxQueue
// waiters are already there. A waiter leaves the queue with a slot when a
// holder releases one to it, with ErrQueueTimeout after MaxQueueWait (0: no
// bound but the context), or with an ErrContextDone error, which is also
// ctx.Err(), as soon as ctx is done; it never waits past its context and
// never stays in the queue after it gives up. A context already done is
// not queued, but a free slot is taken without looking at the context.
//
// Waiters are served first in, first out: Release hands its slot straight
// to the oldest waiter, and no newcomer takes a slot while others wait. A
// waiter handed a slot just as its MaxQueueWait ran out keeps it; one whose
// context was done gives it to the next waiter and reports ErrContextDone.
//
// Time is read only to bound waits, with the clock.Clock given to New
// (clock.Real by default; a clock.Fake or testing/synctest in tests). No
// goroutine is started: a waiter waits in its own goroutine and stops its
// timer before it returns.
//
// # Concurrency
//
// A Bulkhead is safe for concurrent use. Slots and the queue length live in
// one atomic word. While no one waits, Acquire of a free slot and Release
// are compare-and-swap loops on that word, and a rejection by a full queue
// is one load of it: no lock, no allocation. Waiting and handing a slot to a waiter take a mutex;
// a waiter allocates its queue entry and a timer.
//
// Resize changes the limits of a bulkhead in use, keeping its slots taken
// and its queue: it takes the mutex, and the limits are atomics read on
// the fast paths, which stay as cheap. A raised MaxConcurrent admits
// waiters at once; a lowered one takes no slot back, and no one gets a
// slot until fewer than it are in flight.
//
// Every successful Acquire must be matched by exactly one Release; Release
// without a slot held panics.
package bulkhead
