package limit

import "time"

// keep is how many of a window's smallest latencies a span keeps: the
// estimate of windowed is at most the keep-th smallest.
const keep = 5

// span gathers the latencies of one window: how many there were, and the
// smallest keep of them, ascending.
type span struct {
	n   int
	low [keep]time.Duration // low[:min(n, keep)] ascending
}

// add folds rtt into s.
func (s *span) add(rtt time.Duration) {
	m := min(s.n, keep) // kept so far
	s.n++
	if m == keep {
		if rtt >= s.low[keep-1] {
			return
		}
		m = keep - 1 // the largest kept one falls out
	}
	i := m
	for i > 0 && s.low[i-1] > rtt {
		s.low[i] = s.low[i-1]
		i--
	}
	s.low[i] = rtt
}

// windowed is a low estimate of the latencies of the last one or two
// windows of a width: their minimum, less outliers. A latency is an outlier
// when it is under a tenth of the 5th smallest (the largest, with fewer
// than 5), so up to 4 calls that were much faster than the service for a
// reason of their own (a cached answer in microseconds) do not become the
// estimate, even right after a probe restarted it, while latencies a queue
// spreads over a few times the service time all count, while under overload, where every
// latency is a queued one, the estimate is the least of them, the one that
// saw the shortest queue. The windows rotate with time, on every read and
// write, so an estimate that no latency confirms ages out: after a whole
// window without one, the previous window is forgotten, and after two, the
// estimate is 0.
type windowed struct {
	w   [2]span   // the previous window, the current one
	end time.Time // end of the current window; zero before the first latency
}

// rotate moves the windows to now: from the end of the current window on,
// it becomes the previous one, and after a whole empty window both are
// forgotten.
func (e *windowed) rotate(now time.Time, width time.Duration) {
	if e.end.IsZero() || now.Before(e.end) {
		return
	}
	if now.Sub(e.end) >= width {
		e.w = [2]span{}
	} else {
		e.w[0], e.w[1] = e.w[1], span{}
	}
	e.end = now.Add(width)
}

// add folds rtt, measured at now, into the current window.
func (e *windowed) add(now time.Time, width, rtt time.Duration) {
	if e.end.IsZero() {
		e.end = now.Add(width)
	}
	e.w[1].add(rtt)
}

// reset forgets both windows and starts a new one at now with rtt.
func (e *windowed) reset(now time.Time, width, rtt time.Duration) {
	e.w = [2]span{}
	e.end = now.Add(width)
	e.w[1].add(rtt)
}

// value is the estimate (see windowed); 0 when both windows are empty.
func (e *windowed) value() time.Duration {
	a, b := &e.w[0], &e.w[1]
	ka, kb := min(a.n, keep), min(b.n, keep)
	var low [keep]time.Duration // the smallest of both, ascending
	k := 0
	for i, j := 0, 0; k < keep && (i < ka || j < kb); k++ {
		if j >= kb || i < ka && a.low[i] <= b.low[j] {
			low[k], i = a.low[i], i+1
		} else {
			low[k], j = b.low[j], j+1
		}
	}
	if k == 0 {
		return 0
	}
	ref := low[k-1] // the 5th smallest, or the largest of fewer
	for _, v := range low[:k] {
		if 10*v >= ref {
			return v
		}
	}
	return ref
}

// block is the number of latencies in a block of the door.
const block = 32

// door is the door's service time: the smallest of the last block to
// 2·block latencies, while the newest of them is fresh. A fast latency
// lowers it at once (the door errs towards letting calls in), a slow one
// raises it only once block to 2·block later ones are all slower, and it
// does not move at a Vegas probe.
type door struct {
	low  [2]time.Duration // the least of the previous block and of the current one; 0: none
	n    int              // latencies in the current block
	last time.Time        // when the newest came; zero: none yet
}

func (d *door) add(now time.Time, rtt time.Duration) {
	if d.low[1] == 0 || rtt < d.low[1] {
		d.low[1] = rtt
	}
	if d.n++; d.n == block {
		d.low[0], d.low[1], d.n = d.low[1], 0, 0
	}
	d.last = now
}

// value is the door's service time at now: 0 (the door is open) once the
// newest latency is stale old, or before the first.
func (d *door) value(now time.Time, stale time.Duration) time.Duration {
	if d.last.IsZero() || now.Sub(d.last) >= stale {
		return 0
	}
	a, b := d.low[0], d.low[1]
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}
