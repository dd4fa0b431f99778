package limit

import "time"

// waiterState is where a Waiter is; guarded by the Limiter's mutex.
type waiterState uint8

const (
	waiting waiterState = iota // in the queue
	granted                    // handed a slot: w.slot holds it
	evicted                    // displaced by a more critical (or fairer) request
)

// A Waiter is a request waiting in a Limiter's queue for a slot, from
// Enqueue to the one Leave that ends its wait.
type Waiter struct {
	ready chan struct{} // receives once when the waiter is granted or evicted; buffered
	// Set by Enqueue, immutable until Leave:
	crit  Criticality
	class int // cost class
	t     *tenant
	left  time.Duration // of its deadline when it arrived
	at    time.Time     // when it arrived
	seq   uint64        // arrival order
	// Guarded by the Limiter's mutex:
	state waiterState
	idx   int  // position in queue.w while waiting
	slot  Slot // when granted
}

// Ready returns a channel that receives when the wait is over: a slot was
// handed to the waiter, or it lost its place. Then, or when the caller
// stops waiting for a reason of its own, call Leave.
func (w *Waiter) Ready() <-chan struct{} { return w.ready }

// queue holds the waiters of a Limiter, in no order; guarded by its mutex.
// Every operation scans it, so it is meant to be short (MaxQueue).
type queue struct {
	max  int      // immutable; 0: no queue
	ten  *tenants // the Limiter's; immutable
	w    []*Waiter
	seq  uint64
	free []*Waiter // waiters done with, for reuse: a queued call allocates nothing once the queue has been as long
}

// get returns a waiter, reused when one is free.
func (q *queue) get() *Waiter {
	if n := len(q.free); n > 0 {
		w := q.free[n-1]
		q.free[n-1] = nil
		q.free = q.free[:n-1]
		return w
	}
	return &Waiter{ready: make(chan struct{}, 1)}
}

// put keeps w for reuse, its signal drained. The free waiters are at most
// as many as have waited at once, MaxQueue and those that left a full
// queue.
func (q *queue) put(w *Waiter) {
	select {
	case <-w.ready:
	default:
	}
	w.t, w.slot = nil, Slot{}
	if len(q.free) < q.max {
		q.free = append(q.free, w)
	}
}

// rank orders criticalities from the least critical (0) up.
var rank = [NumCriticalities]int{Sheddable: 0, SheddablePlus: 1, Critical: 2, CriticalPlus: 3}

// load is how much of the limit a waiter's tenant holds or waits for.
func (w *Waiter) load() int { return w.t.load() }

// before reports whether a is served before b: the more critical first,
// then the one whose tenant has fewer requests in flight, then the older.
func before(a, b *Waiter) bool {
	if ra, rb := rank[a.crit], rank[b.crit]; ra != rb {
		return ra > rb
	}
	if a.t.inflight != b.t.inflight {
		return a.t.inflight < b.t.inflight
	}
	return a.seq < b.seq
}

// worst returns the index of the waiter that loses its place first: the
// least critical, then the one whose tenant holds and waits for the most,
// then the newest.
func (q *queue) worst() int {
	k := 0
	for i, w := range q.w[1:] {
		o := q.w[k]
		switch ri, ro := rank[w.crit], rank[o.crit]; {
		case ri != ro:
			if ri < ro {
				k = i + 1
			}
		case w.load() != o.load():
			if w.load() > o.load() {
				k = i + 1
			}
		case w.seq > o.seq:
			k = i + 1
		}
	}
	return k
}

// displaces reports whether a newcomer takes the place of w, the worst
// waiter of a full queue: it is more critical, or as critical with a
// tenant that would still hold and wait for less than w's.
func displaces(newcomer, w *Waiter) bool {
	if rn, rw := rank[newcomer.crit], rank[w.crit]; rn != rw {
		return rn > rw
	}
	return newcomer.load()+1 < w.load()
}

func (q *queue) add(w *Waiter) {
	w.idx = len(q.w)
	q.w = append(q.w, w)
	q.ten.queue(w.t, 1)
}

func (q *queue) remove(w *Waiter) {
	last := q.w[len(q.w)-1]
	q.w[w.idx], last.idx = last, w.idx
	q.w[len(q.w)-1] = nil
	q.w = q.w[:len(q.w)-1]
	q.ten.queue(w.t, -1)
}

// Enqueue puts a request that Acquire shed over the limit (ShedLimit) in
// the queue, to wait for a slot, and returns its Waiter; ok is false when
// it may not wait: the Limiter has no queue, or the queue is full of
// requests it does not displace (see the package doc, "Queue"). A request
// it displaces is told through its Waiter. Every Waiter returned must be
// ended by one Leave.
func (l *Limiter) Enqueue(now time.Time, r Request) (w *Waiter, ok bool) {
	if l.q.max == 0 {
		return nil, false
	}
	c := r.Crit.valid()
	l.mu.Lock()
	defer l.mu.Unlock()
	w = l.q.get()
	l.q.seq++
	w.crit, w.class, w.t, w.left, w.at, w.seq, w.state = c, r.Class, l.ten.get(now, r.Tenant), r.Left, now, l.q.seq, waiting
	if len(l.q.w) >= l.q.max {
		out := l.q.w[l.q.worst()]
		if !displaces(w, out) {
			l.q.put(w)
			return nil, false
		}
		l.q.remove(out)
		out.state = evicted
		out.ready <- struct{}{}
	}
	l.q.add(w)
	l.handoffLocked(now) // a slot may have freed since Acquire
	return w, true
}

// Leave ends the wait of w, which the caller must not use after: it
// returns the slot that was handed to it (ok true: the request runs and is
// ended by one Release or Abandon), or takes it out of the queue.
func (l *Limiter) Leave(w *Waiter) (s Slot, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch w.state {
	case granted:
		s, ok = w.slot, true
	case waiting:
		l.q.remove(w)
	}
	l.q.put(w) // the signals are sent under l.mu: none comes after
	return s, ok
}

// handoffLocked hands free slots to the waiters, the first served first
// (before), as long as one of them may take a slot.
func (l *Limiter) handoffLocked(now time.Time) {
	for len(l.q.w) > 0 {
		var next *Waiter
		for _, w := range l.q.w {
			if (next == nil || before(w, next)) && l.mayAdmitLocked(now, w.crit, w.t) {
				next = w
			}
		}
		if next == nil {
			return
		}
		l.q.remove(next)
		left := next.left // what its wait left of it: a deadline the queue ate is no drop
		if left != NoDeadline {
			left -= now.Sub(next.at)
		}
		next.slot = l.admitLocked(next.crit, next.t, left, next.class)
		next.state = granted
		next.ready <- struct{}{}
	}
}

// Queued returns the number of requests waiting in the queue.
func (l *Limiter) Queued() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.q.w)
}
