package server

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// srvDetached is the context of an owned keyed call's handler (lease
// mode). Detached from its caller (the default; Idempotency.DetachedMax),
// it has the values of the caller's context and none of its cancellation,
// a deadline of its own (the server's maximum from the handler's claim);
// attached (Idempotency.AttachedHandler), it is the caller's context with
// the caller's deadline and cancellation. Either way it ends at its
// deadline (DeadlineExceeded), when the key's lease is lost or may end
// before a renewal reaches the store (Canceled, see srvRenewal), when the
// Server shuts down (Canceled), or when the handler returns (Canceled, as
// grpc ends a call's context). No timer of its own: the call's lease
// renewal fires at the deadline and the cutoff.
//
// Detached, it is one allocation, where context.WithTimeout over
// context.WithoutCancel takes five and a timer. Contexts derived from it
// attach through its AfterFunc method, as they do to any context that has
// one, so they start no goroutine; context.Cause of it is its Err, since
// its values come through context.WithoutCancel (attached: the caller's
// cause, when the caller's end ended it).
type srvDetached struct {
	values      context.Context // the caller's, through context.WithoutCancel when detached; immutable
	deadline    time.Time       // immutable; zero when hasDeadline is false
	hasDeadline bool            // immutable; false only for an attached handler whose caller has no deadline
	stopCaller  func() bool     // attached: stops the watch of the caller's end; nil when detached; immutable
	prev, next  *srvDetached    // the running handlers' list (srvHandlers); guarded by srvHandlers.mu

	done  atomic.Value // of chan struct{}: made by Done or end, closed by end; stored under mu, loaded without
	mu    sync.Mutex
	err   error                      // set once, by end; guarded by mu
	after map[*srvAfterFunc]struct{} // functions to run at the end; guarded by mu
}

// srvAfterFunc is one function registered by AfterFunc.
type srvAfterFunc struct{ f func() }

// srvClosed is a closed channel, the Done of a context that ended before
// anyone asked for it.
var srvClosed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// newSrvDetached returns the context of a handler detached from its
// caller: values is the caller's context through context.WithoutCancel.
func newSrvDetached(values context.Context, deadline time.Time) *srvDetached {
	return &srvDetached{values: values, deadline: deadline, hasDeadline: true}
}

// newSrvAttached returns the context of a handler attached to its caller:
// it ends when caller does, with caller's error, as well as at the
// lease's cutoff. The caller must call release when the handler has
// returned.
func newSrvAttached(caller context.Context) *srvDetached {
	d := &srvDetached{values: caller}
	d.deadline, d.hasDeadline = caller.Deadline()
	d.stopCaller = context.AfterFunc(caller, func() { d.end(caller.Err()) })
	return d
}

// release ends d once its handler has returned (as grpc ends a call's
// context) and stops the watch of an attached caller.
func (d *srvDetached) release() {
	if d.stopCaller != nil {
		d.stopCaller()
	}
	d.end(context.Canceled)
}

func (d *srvDetached) Deadline() (time.Time, bool) { return d.deadline, d.hasDeadline }

// Done takes no lock once the channel is made, as context's own contexts
// do: handlers select on it in loops.
func (d *srvDetached) Done() <-chan struct{} {
	if c := d.done.Load(); c != nil {
		return c.(chan struct{})
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.done.Load()
	if c == nil {
		c = make(chan struct{})
		d.done.Store(c)
	}
	return c.(chan struct{})
}

func (d *srvDetached) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

func (d *srvDetached) Value(key any) any { return d.values.Value(key) }

// AfterFunc arranges for f to run in its own goroutine once d ends, as
// context.AfterFunc documents for such a method; stop unregisters it and
// reports whether it did. A context derived from d is ended by such a
// function, so, as with any context, it ends shortly after d does, not at
// the same instant.
func (d *srvDetached) AfterFunc(f func()) (stop func() bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil {
		go f()
		return func() bool { return false }
	}
	a := &srvAfterFunc{f: f}
	if d.after == nil {
		d.after = make(map[*srvAfterFunc]struct{})
	}
	d.after[a] = struct{}{}
	return func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		_, ok := d.after[a]
		delete(d.after, a)
		return ok
	}
}

// end ends d with err, once: later calls do nothing.
func (d *srvDetached) end(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil {
		return
	}
	d.err = err
	if c := d.done.Load(); c == nil {
		d.done.Store(srvClosed)
	} else {
		close(c.(chan struct{}))
	}
	for a := range d.after {
		go a.f()
	}
	d.after = nil
}

// ended reports whether d has ended.
func (d *srvDetached) ended() bool { return d.Err() != nil }
