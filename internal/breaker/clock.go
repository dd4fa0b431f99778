package breaker

import (
	"sync/atomic"
	"time"
)

// clock reads the instants a Breaker is given as Unix nanoseconds measured
// from the first of them, on the monotonic clock when both carry a
// monotonic reading (time.Now's do; time.Unix's do not): Unix ns of the
// first instant plus now.Sub(first). An instant without a monotonic reading
// reads as its own UnixNano, exactly as before, so tables of instants built
// with time.Unix keep their meaning; instants from time.Now keep the
// breaker's open periods, probe deadlines and window on the monotonic
// clock, so that a step of the wall clock (NTP, an operator, a VM resumed)
// neither holds a breaker open for the length of a step back nor cuts its
// open period short by a step forward.
type clock struct {
	first atomic.Pointer[anchor] // set once, by the first instant read
}

// anchor is the first instant a breaker read, and its Unix ns.
type anchor struct {
	at time.Time
	ns int64
}

// ns returns now as the breaker counts it. It allocates once, on the first
// call.
func (c *clock) ns(now time.Time) int64 {
	a := c.first.Load()
	if a == nil {
		a = &anchor{at: now, ns: now.UnixNano()}
		if !c.first.CompareAndSwap(nil, a) {
			a = c.first.Load()
		}
	}
	return a.ns + int64(now.Sub(a.at))
}
