package breaker

// window counts outcomes over a rolling window of numBuckets buckets of
// width ns each, indexed by epoch = floor(t / width). The counts cover the
// newest bucket and the numBuckets−1 before it: between Window − width and
// Window of history. Time never runs backwards in a window: an outcome at an
// earlier epoch than the newest is counted in the newest bucket.
type window struct {
	width int64 // ns per bucket, > 0; set by New and Reconfigure
	head  int64 // epoch of the newest bucket
	end   int64 // (head+1) × width: the instant the newest bucket ends
	idx   int   // index in b of the newest bucket: head mod numBuckets
	b     [numBuckets]bucket
	// Sums over b.
	calls, failures, slow int
}

type bucket struct{ calls, failures, slow int }

// add counts one outcome at t.
func (w *window) add(t int64, failed, slow bool) {
	bk := w.advance(t)
	bk.calls++
	w.calls++
	if failed {
		bk.failures++
		w.failures++
	}
	if slow {
		bk.slow++
		w.slow++
	}
}

// advance drops the buckets that are older than the window at t and returns
// the newest bucket.
func (w *window) advance(t int64) *bucket {
	if t < w.end {
		return &w.b[w.idx] // the newest bucket, or an earlier instant
	}
	e := floorDiv(t, w.width)
	if e-w.head >= numBuckets {
		w.clear()
	} else {
		for i := w.head + 1; i <= e; i++ {
			bk := &w.b[mod(i)]
			w.calls -= bk.calls
			w.failures -= bk.failures
			w.slow -= bk.slow
			*bk = bucket{}
		}
	}
	w.setHead(e)
	return &w.b[w.idx]
}

// countsAt returns the sums of the window as they are at t, without
// moving it: the buckets older than the window at t are left out.
func (w *window) countsAt(t int64) (calls, failures, slow int) {
	if t < w.end {
		return w.calls, w.failures, w.slow
	}
	e := floorDiv(t, w.width)
	if e-w.head >= numBuckets {
		return 0, 0, 0
	}
	calls, failures, slow = w.calls, w.failures, w.slow
	for i := w.head + 1; i <= e; i++ {
		bk := &w.b[mod(i)]
		calls, failures, slow = calls-bk.calls, failures-bk.failures, slow-bk.slow
	}
	return calls, failures, slow
}

// reset empties the window and starts it at t.
func (w *window) reset(t int64) {
	w.clear()
	w.setHead(floorDiv(t, w.width))
}

func (w *window) setHead(e int64) {
	w.head = e
	w.end = (e + 1) * w.width
	w.idx = mod(e)
}

func (w *window) clear() {
	w.b = [numBuckets]bucket{}
	w.calls, w.failures, w.slow = 0, 0, 0
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

func mod(e int64) int {
	m := e % numBuckets
	if m < 0 {
		m += numBuckets
	}
	return int(m)
}
