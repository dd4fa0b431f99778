package latency

import (
	"cmp"
	"errors"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultWindowSize is the number of observations in one generation of a
// [Window]: the quantile is read over the last 256 to 512 observations.
const DefaultWindowSize = 256

// FixedDelayMinSamples is how many attempts of a method the client's window
// holds before a fixed hedging delay (one without hedgingDelayQuantile,
// where hedgingDelayMinSamples does not apply) may be raised under a retry
// budget (package interceptor, What a hedge may spend): fewer than an
// adaptive delay needs to place its quantile, since until then the delay,
// as configured, may hedge more calls than the budget pays for. Here, not
// in package interceptor, so that cmd/svcconfig's explain reads the same
// value without it being part of the API.
const FixedDelayMinSamples = 32

// The buckets of a Window. Bucket 0 holds durations below 2^minExp ns
// (1.024µs); bucket 1 + 8·(e − minExp) + s holds those in the s-th eighth
// of the octave [2^e, 2^(e+1)) ns, for e from minExp to maxExp; durations
// of 2^(maxExp+1) ns (about 37 minutes) and more fall in the last bucket.
const (
	subBits    = 3
	subBuckets = 1 << subBits
	minExp     = 10
	maxExp     = 40
	numBuckets = 1 + (maxExp-minExp+1)*subBuckets
)

// recomputeEvery is how often, in observations, a Window recomputes its
// quantile once it has warmRecompute observations; before, it recomputes
// on every observation, so that a caller waiting for a minimum number of
// samples reads a fresh quantile.
const (
	recomputeEvery = 16
	warmRecompute  = 256
)

// bucketOf returns the bucket of a duration of d nanoseconds.
func bucketOf(d time.Duration) int {
	x := uint64(max(d, 1))
	e := bits.Len64(x) - 1
	switch {
	case e < minExp:
		return 0
	case e > maxExp:
		return numBuckets - 1
	}
	s := int(x>>(e-subBits)) & (subBuckets - 1)
	return 1 + (e-minExp)*subBuckets + s
}

// upperEdge returns the least duration above every duration of bucket b.
func upperEdge(b int) time.Duration {
	if b == 0 {
		return 1 << minExp
	}
	e, s := (b-1)/subBuckets+minExp, (b-1)%subBuckets
	return time.Duration(subBuckets+s+1) << (e - subBits)
}

// A Window tracks quantiles of the durations observed last, by counting
// them in a histogram of logarithmic buckets over a sliding window: one, its
// primary quantile, or a few read in the same pass. Unlike
// the [Estimator], which wanders anywhere in a gap of the distribution and
// oscillates around a cluster (below it part of the time), a Window gives
// the lower quantile rounded up: for the 0.9 quantile of durations that are
// 2ms 95 % of the time and 40ms otherwise, it reads 2ms rounded up to its
// bucket (2.097152ms), never less, never a value in between. The client
// hedges at it: a hedging delay below the fast cluster would hedge fast
// calls too.
//
// # Algorithm
//
// Each observation is counted in its bucket: eight per octave from 1.024µs
// to about 37 minutes, so a bucket spans at most 1/8 of its lower edge.
// Counts go to one of two generations; after every Size observations the
// older generation is cleared and becomes the one written, so the quantile
// covers the last Size to 2·Size observations, and a drift of the latencies
// shows within a fraction 1 − Quantile of a generation.
//
// A quantile p is the upper edge of the first bucket at which the
// cumulative count reaches ⌈p · n⌉ over both generations: at least the true
// lower quantile of the window, and at most 12.5 % above it (less than one
// bucket). The quantiles are recomputed together, in one pass, on every
// observation until 256 were made, then every 16th, and each is read from
// one atomic word.
//
// # Concurrency
//
// A Window is safe for concurrent use and lock-free on the path of each
// observation: two atomic additions, and every 16th observation a scan of
// the 249 buckets of each generation. Every Size-th observation clears a
// generation under a mutex that only that observation takes (TryLock).
// Observations racing with a clear may be lost; they are samples among
// many.
type Window struct {
	// h holds the counts; windows made by WithQuantiles share it.
	h *windowCounts
	// p are the quantiles read, each in (0, 1), the primary first; set
	// once. order lists their indices by ascending quantile.
	p     []float64
	order []int
	// q[i] is the last value of p[i] computed, in nanoseconds; 0 before
	// the first observation.
	q []atomic.Int64
}

// windowCounts is the histogram of a Window, shared by the windows that
// read different quantiles of the same observations.
type windowCounts struct {
	// counts[cur] gets the observations; counts[1−cur] holds the
	// generation before.
	counts [2][numBuckets]atomic.Uint32
	cur    atomic.Uint32
	// n counts every observation ever made.
	n atomic.Uint64
	// size is the number of observations per generation; set once.
	size uint64
	// rotating is held by the observation that clears a generation, and
	// by Restart.
	rotating sync.Mutex
}

// NewWindow returns a Window with no observations over generations of size
// observations (> 0) that reads the given quantiles, each in (0, 1): at
// least one, the first its primary quantile (Quantile, ObserveAtLeast).
func NewWindow(size int, quantiles ...float64) (*Window, error) {
	if size < 1 {
		return nil, errors.New("latency: window size must be at least 1")
	}
	return newView(&windowCounts{size: uint64(size)}, quantiles)
}

// newView returns a Window over h that reads quantiles.
func newView(h *windowCounts, quantiles []float64) (*Window, error) {
	if len(quantiles) == 0 {
		return nil, errors.New("latency: a window reads at least one quantile")
	}
	for _, p := range quantiles {
		if !(p > 0 && p < 1) {
			return nil, errors.New("latency: window quantile must be between 0 and 1, exclusive")
		}
	}
	w := &Window{h: h, p: slices.Clone(quantiles), q: make([]atomic.Int64, len(quantiles))}
	w.order = make([]int, len(quantiles))
	for i := range w.order {
		w.order[i] = i
	}
	slices.SortFunc(w.order, func(a, b int) int { return cmp.Compare(w.p[a], w.p[b]) })
	return w, nil
}

// WithQuantiles returns a Window over the same observations as w (both see
// every observation made through either) that reads the given quantiles; w
// itself when they are w's.
func (w *Window) WithQuantiles(quantiles ...float64) (*Window, error) {
	if slices.Equal(quantiles, w.p) {
		return w, nil
	}
	v, err := newView(w.h, quantiles)
	if err != nil {
		return nil, err
	}
	v.recompute()
	return v, nil
}

// Observe records one duration and returns the number of observations
// recorded through w up to and including it (Samples as this observation
// made it: of concurrent observations, each gets its own count). A
// duration below one nanosecond counts as one nanosecond.
func (w *Window) Observe(d time.Duration) uint64 {
	h := w.h
	h.counts[h.cur.Load()][bucketOf(d)].Add(1)
	n := h.n.Add(1)
	if n%h.size == 0 {
		h.rotate()
	}
	if n <= warmRecompute || n%recomputeEvery == 0 {
		w.recompute()
	}
	return n
}

// ObserveAtLeast records a duration known only to exceed d: an attempt cut
// off after d. Such an observation is on the known side of the primary
// quantile only when d is at or above it, and is then recorded as d;
// otherwise it is dropped, since it may lie on either side. Before the
// first observation it is recorded as d.
func (w *Window) ObserveAtLeast(d time.Duration) {
	if q := w.q[0].Load(); d >= time.Duration(q) {
		w.Observe(d)
	}
}

// Quantile returns the primary quantile of the observations in the window,
// rounded up to its bucket's upper edge; 0 before the first observation.
func (w *Window) Quantile() time.Duration {
	return time.Duration(w.q[0].Load())
}

// QuantileAt returns the window's i-th quantile (in the order NewWindow or
// WithQuantiles got them; 0 is the primary), as Quantile does.
func (w *Window) QuantileAt(i int) time.Duration {
	return time.Duration(w.q[i].Load())
}

// QuantileOf returns the p-quantile (p in (0, 1)) of the observations in
// the window now, rounded up to its bucket's upper edge as Quantile is; 0
// before the first observation. Unlike Quantile it is not kept: it scans
// the histogram (two generations of 249 buckets) on each call.
func (w *Window) QuantileOf(p float64) time.Duration {
	h := w.h
	var total uint64
	var c [numBuckets]uint64
	for i := range c {
		c[i] = uint64(h.counts[0][i].Load()) + uint64(h.counts[1][i].Load())
		total += c[i]
	}
	if total == 0 {
		return 0
	}
	rank := max(uint64(math.Ceil(p*float64(total))), 1)
	var sum uint64
	last := 0
	for i, n := range c {
		if n == 0 {
			continue
		}
		last, sum = i, sum+n
		if sum >= rank {
			return upperEdge(i)
		}
	}
	return upperEdge(last)
}

// Samples returns the number of observations ever recorded through w or the
// windows sharing its observations.
func (w *Window) Samples() uint64 {
	return w.h.n.Load()
}

// Restart replaces every observation in the window (of w and of the
// windows sharing its observations) with ds, durations observed already:
// quantiles read after it cover ds and the observations made after it.
// Samples does not count ds again, so a caller acting every k
// observations keeps its pace. w's own quantiles are recomputed at once;
// another window's keep their last values until they next are.
// Observations racing with a Restart may be lost, as with a rotation.
func (w *Window) Restart(ds ...time.Duration) {
	h := w.h
	h.rotating.Lock()
	defer h.rotating.Unlock()
	for g := range h.counts {
		for i := range h.counts[g] {
			h.counts[g][i].Store(0)
		}
	}
	cur := h.cur.Load()
	for _, d := range ds {
		h.counts[cur][bucketOf(d)].Add(1)
	}
	w.recompute()
}

// rotate clears the older generation and makes it the one written. An
// observation that finds a clear under way leaves it alone.
func (h *windowCounts) rotate() {
	if !h.rotating.TryLock() {
		return
	}
	defer h.rotating.Unlock()
	next := 1 - h.cur.Load()
	for i := range h.counts[next] {
		h.counts[next][i].Store(0)
	}
	h.cur.Store(next)
}

// recompute sets q to the quantiles of the counts, in one pass.
func (w *Window) recompute() {
	h := w.h
	var total uint64
	for g := range h.counts {
		for i := range h.counts[g] {
			total += uint64(h.counts[g][i].Load())
		}
	}
	if total == 0 {
		return
	}
	next := 0 // the next quantile to place, in w.order
	rank := uint64(math.Ceil(w.p[w.order[0]] * float64(total)))
	var sum uint64
	last := 0
	for i := 0; i < numBuckets && next < len(w.order); i++ {
		c := uint64(h.counts[0][i].Load()) + uint64(h.counts[1][i].Load())
		if c == 0 {
			continue
		}
		last, sum = i, sum+c
		for next < len(w.order) && sum >= rank {
			w.q[w.order[next]].Store(int64(upperEdge(i)))
			if next++; next < len(w.order) {
				rank = uint64(math.Ceil(w.p[w.order[next]] * float64(total)))
			}
		}
	}
	// Counts that changed between the two passes may leave sum short of a
	// rank: the last bucket seen is then the answer.
	for ; next < len(w.order); next++ {
		w.q[w.order[next]].Store(int64(upperEdge(last)))
	}
}
