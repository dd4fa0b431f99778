package bench

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"
)

// pairBlock is the number of calls per side in one block of a paired
// measurement: blocks alternate bare and peer (and which goes first), and
// the ratio is the median of the blocks' ratios, so a burst of load from
// elsewhere on the machine spoils a few blocks, not the result.
const pairBlock = 20

// pairedRatio times bare and peer over n calls each, in alternating blocks,
// and returns the median of the per-block time ratios peer/bare.
func pairedRatio(n int, bareCall, peerCall func() error) (float64, error) {
	blocks := max(n/pairBlock, 1)
	ratios := make([]float64, 0, blocks)
	timeBlock := func(call func() error) (time.Duration, error) {
		start := time.Now()
		for range pairBlock {
			if err := call(); err != nil {
				return 0, err
			}
		}
		return time.Since(start), nil
	}
	for b := range blocks {
		first, second := bareCall, peerCall
		if b%2 == 1 {
			first, second = peerCall, bareCall
		}
		t1, err := timeBlock(first)
		if err != nil {
			return 0, err
		}
		t2, err := timeBlock(second)
		if err != nil {
			return 0, err
		}
		if b%2 == 1 {
			t1, t2 = t2, t1
		}
		ratios = append(ratios, float64(t2)/float64(t1))
	}
	return median(ratios), nil
}

// allocsPerCall returns the heap allocations per call of n sequential calls,
// counted by runtime.MemStats over the whole process (client and server
// both: the server's share is the same for every peer, so differences
// between peers are the clients').
func allocsPerCall(n int, call func() error) (float64, error) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		if err := call(); err != nil {
			return 0, err
		}
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(n), nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return math.NaN()
	}
	return s[len(s)/2]
}

// quantile returns the q quantile of ds (nearest rank); ds is sorted in place.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// chance returns a deterministic number in [0, 1) for (seed, msg, attempt):
// the scenarios' "random" server behaviour, the same for every peer and run.
func chance(seed uint64, msg string, attempt int) float64 {
	h := fnv.New64a()
	var b [16]byte
	for i := range 8 {
		b[i] = byte(seed >> (8 * i))
		b[8+i] = byte(uint64(attempt) >> (8 * i))
	}
	h.Write(b[:])
	h.Write([]byte(msg))
	// FNV's high bits barely move for short inputs that differ in one
	// byte: finish with splitmix64's mixer.
	x := h.Sum64()
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}

// outcome is one logical call's result in a load run.
type outcome struct {
	start, end time.Time
	err        error
}

// load runs calls and records their outcomes. call gets a unique index.
type load struct {
	mu       sync.Mutex
	outcomes []outcome // guarded by mu
}

func (l *load) record(o outcome) {
	l.mu.Lock()
	l.outcomes = append(l.outcomes, o)
	l.mu.Unlock()
}

// closedLoop runs callers goroutines, each calling call back to back, until
// total calls have started (total > 0) or until the deadline passes.
func (l *load) closedLoop(ctx context.Context, callers, total int, until time.Time, call func(ctx context.Context, i int) error) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		next int
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if (total > 0 && next >= total) || (total == 0 && !time.Now().Before(until)) || ctx.Err() != nil {
			return 0, false
		}
		next++
		return next - 1, true
	}
	for range callers {
		wg.Go(func() {
			for {
				i, ok := take()
				if !ok {
					return
				}
				start := time.Now()
				err := call(ctx, i)
				l.record(outcome{start: start, end: time.Now(), err: err})
			}
		})
	}
	wg.Wait()
}

// openLoop starts one call every 1/rate seconds, each in its own goroutine,
// until the deadline passes, then waits for the calls to end.
func (l *load) openLoop(ctx context.Context, rate float64, until time.Time, call func(ctx context.Context, i int) error) {
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / rate)
	t := time.NewTicker(interval)
	defer t.Stop()
	for i := 0; time.Now().Before(until) && ctx.Err() == nil; i++ {
		wg.Go(func() {
			start := time.Now()
			err := call(ctx, i)
			l.record(outcome{start: start, end: time.Now(), err: err})
		})
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	wg.Wait()
}

// successRate is the share of outcomes that started in [from, to) and succeeded.
func (l *load) successRate(from, to time.Time) (rate float64, n int) {
	ok := 0
	for _, o := range l.outcomes {
		if o.start.Before(from) || !o.start.Before(to) {
			continue
		}
		n++
		if o.err == nil {
			ok++
		}
	}
	if n == 0 {
		return math.NaN(), 0
	}
	return float64(ok) / float64(n), n
}

// recoveryTime is how long after healthyAt the calls succeed again: the end
// of the last failed call that started after healthyAt, minus healthyAt
// (0 when none failed). It returns ok false when calls were still failing
// in the run's last bucket, i.e. never recovered within the run.
func (l *load) recoveryTime(healthyAt time.Time) (d time.Duration, ok bool) {
	var last time.Time
	lastOK := false
	var lastStart time.Time
	for _, o := range l.outcomes {
		if o.start.Before(healthyAt) {
			continue
		}
		if o.err != nil && o.end.After(last) {
			last = o.end
		}
		if o.start.After(lastStart) {
			lastStart, lastOK = o.start, o.err == nil
		}
	}
	if last.IsZero() {
		return 0, true
	}
	return last.Sub(healthyAt), lastOK
}

func (l *load) latencies() []time.Duration {
	ds := make([]time.Duration, 0, len(l.outcomes))
	for _, o := range l.outcomes {
		ds = append(ds, o.end.Sub(o.start))
	}
	return ds
}

func (l *load) successes() int {
	n := 0
	for _, o := range l.outcomes {
		if o.err == nil {
			n++
		}
	}
	return n
}

// Cell formats.
func ratio(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) { // nothing to compare with
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", x)
}
func pct(x float64) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", 100*x)
}
func perCall(x float64) string { return fmt.Sprintf("%.2f", x) }
func signed(x float64) string {
	r := math.Round(x*10) / 10
	if r == 0 {
		r = 0 // no "-0.0"
	}
	return fmt.Sprintf("%+.1f", r)
}
