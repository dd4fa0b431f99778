package outlier

import "time"

// window counts outcomes over a rolling window of numBuckets buckets of
// width ns each, indexed by epoch = floor(t / width): the newest bucket and
// the numBuckets−1 before it. An outcome at an earlier epoch than the newest
// (time never runs backwards here) is counted in the newest bucket.
type window struct {
	width int64 // ns per bucket, > 0
	head  int64 // epoch of the newest bucket
	b     [numBuckets]struct{ calls, failures int }
	// Sums over b.
	calls, failures int
}

// resize gives the window the span span (numBuckets buckets of a tenth),
// starting it empty when its bucket width changes (or was never set).
func (w *window) resize(span time.Duration) {
	if width := max(int64(span)/numBuckets, 1); width != w.width {
		*w = window{width: width}
	}
}

func (w *window) add(t int64, failed bool) {
	i := w.advance(t)
	w.b[i].calls++
	w.calls++
	if failed {
		w.b[i].failures++
		w.failures++
	}
}

// advance drops the buckets older than the window at t and returns the
// index of the newest.
func (w *window) advance(t int64) int {
	e := t / w.width
	if e > w.head {
		if e-w.head >= numBuckets {
			w.clear()
		} else {
			for i := w.head + 1; i <= e; i++ {
				bk := &w.b[i%numBuckets]
				w.calls -= bk.calls
				w.failures -= bk.failures
				bk.calls, bk.failures = 0, 0
			}
		}
		w.head = e
	}
	return int(w.head % numBuckets)
}

func (w *window) clear() {
	w.b = [numBuckets]struct{ calls, failures int }{}
	w.calls, w.failures = 0, 0
}

// at returns the sums the window would hold at t, without moving it: a
// read, for a snapshot at any instant, must not push head past the
// instants outcomes are still recorded at.
func (w *window) at(t int64) (calls, failures int) {
	e := t / w.width
	if e <= w.head {
		return w.calls, w.failures
	}
	// The buckets of epochs head−d, d < numBuckets, still inside the
	// window ending at epoch e.
	for d := int64(0); d < numBuckets && w.head-d > e-numBuckets; d++ {
		bk := &w.b[(w.head-d)%numBuckets]
		calls += bk.calls
		failures += bk.failures
	}
	return calls, failures
}
