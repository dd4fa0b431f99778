package redisstore

import (
	"context"
	"sync"
)

// bounded runs f, one operation of the store's on Redis, so that it returns
// once ctx is done, whatever the client does with ctx. go-redis reads a
// reply until its own ReadTimeout (5s by default, or never with -1) unless
// the client was made with ContextTimeoutEnabled, and even then only a
// deadline, not a cancellation, cuts the read short: a store that passed
// its context on and waited would hold a server's call, and a lease's
// cutoff, for seconds against a Redis that stopped answering (issue 33,
// finding 2). So when ctx can end, f runs on a goroutine of its own; when
// ctx ends first, bounded returns at once with an error wrapping ctx.Err(),
// and late, when not nil, runs on f's goroutine with f's result once f
// returns, to undo what the abandoned operation may have done (a claim
// taken). The goroutine ends with f, at the latest at the client's own
// timeouts. A ctx that cannot end (Done nil) runs f on the caller's
// goroutine.
func bounded[T any](ctx context.Context, f func() (T, error), late func(T, error)) (T, error) {
	if ctx.Done() == nil {
		return f()
	}
	c := &boundedCall[T]{done: make(chan struct{})}
	go c.run(f, late)
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.finished { // f returned as ctx ended: its result stands
		return c.res, c.err
	}
	c.abandoned = true
	var zero T
	return zero, &abandonedError{err: ctx.Err()}
}

// abandonedError is the error of an operation that bounded returned from
// when its context ended first: late, if any, deals with its result. The
// caller's wrapping names the operation.
type abandonedError struct {
	err error // the context's
}

func (e *abandonedError) Error() string {
	return e.err.Error() + " before Redis answered"
}

func (e *abandonedError) Unwrap() error { return e.err }

// boundedCall is one operation run by bounded.
type boundedCall[T any] struct {
	done chan struct{} // closed when res and err are set, unless abandoned

	mu        sync.Mutex
	finished  bool  // f returned, and res and err are set; guarded by mu
	abandoned bool  // the caller returned without the result; guarded by mu
	res       T     // written before finished is set
	err       error // written before finished is set
}

func (c *boundedCall[T]) run(f func() (T, error), late func(T, error)) {
	res, err := f()
	c.mu.Lock()
	if c.abandoned {
		c.mu.Unlock()
		if late != nil {
			late(res, err)
		}
		return
	}
	c.res, c.err, c.finished = res, err, true
	c.mu.Unlock()
	close(c.done)
}
