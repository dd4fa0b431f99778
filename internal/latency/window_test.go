package latency

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func mustWindow(t testing.TB, q float64, size int) *Window {
	t.Helper()
	w, err := NewWindow(size, q)
	if err != nil {
		t.Fatalf("NewWindow(%v, %d) = %v", q, size, err)
	}
	return w
}

func TestNewWindowValidates(t *testing.T) {
	tests := []struct {
		name    string
		q       float64
		size    int
		wantErr bool
	}{
		{"p95", 0.95, DefaultWindowSize, false},
		{"size 1", 0.5, 1, false},
		{"quantile 0", 0, 10, true},
		{"quantile 1", 1, 10, true},
		{"size 0", 0.9, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewWindow(tt.size, tt.q)
			if (err != nil) != tt.wantErr {
				t.Errorf("NewWindow(%v, %d) error = %v, want error %v", tt.q, tt.size, err, tt.wantErr)
			}
		})
	}
}

// TestBuckets pins the bucket layout of the doc comment: eight per octave
// from 1.024µs, a duration's bucket's upper edge is above it and at most
// 1/8 of the octave's lower edge away.
func TestBuckets(t *testing.T) {
	tests := []struct {
		d    time.Duration
		edge time.Duration
	}{
		{-1, 1024},
		{0, 1024},
		{1023, 1024},
		{1024, 1152},
		{1151, 1152},
		{1152, 1280},
		{2 * ms, 2097152},
		{4 * ms, 4194304},
		{40 * ms, 41943040},
		{time.Hour, 1 << 41},
		{1<<63 - 1, 1 << 41},
	}
	for _, tt := range tests {
		if got := upperEdge(bucketOf(tt.d)); got != tt.edge {
			t.Errorf("upperEdge(bucketOf(%d)) = %d, want %d", tt.d, got, tt.edge)
		}
	}
	prev := time.Duration(0)
	for b := range numBuckets {
		e := upperEdge(b)
		if e <= prev {
			t.Fatalf("upperEdge(%d) = %v, not above upperEdge(%d) = %v", b, e, b-1, prev)
		}
		if b > 0 && bucketOf(prev) != b {
			t.Fatalf("bucketOf(%v) = %d, want %d (the lower edge of bucket %d)", prev, bucketOf(prev), b, b)
		}
		if b > 1 && float64(e-prev) > float64(prev)/8+1 {
			t.Fatalf("bucket %d spans %v from %v: more than 1/8", b, e-prev, prev)
		}
		prev = e
	}
}

// TestWindowLowerQuantile pins the lower quantile of the doc comment: on
// latencies that are 2ms 95 % of the time and 40ms otherwise, the 0.9
// quantile reads 2ms rounded up to its bucket, and the 0.99 quantile 40ms.
func TestWindowLowerQuantile(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	p90 := mustWindow(t, 0.9, DefaultWindowSize)
	p99, _ := p90.WithQuantiles(0.99)
	if same, _ := p90.WithQuantiles(0.9); same != p90 {
		t.Errorf("WithQuantiles of the window's own quantile returned a new window")
	}
	for i := range 5000 {
		d := 2 * ms
		if r.Float64() < 0.05 {
			d = 40 * ms
		}
		if i%2 == 0 {
			p90.Observe(d)
		} else {
			p99.Observe(d)
		}
		if i < 100 {
			continue
		}
		if got := p90.Quantile(); got != 2097152 {
			t.Fatalf("after %d observations, p90 Quantile() = %v, want 2.097152ms", i+1, got)
		}
	}
	if got := p99.Quantile(); got != 41943040 {
		t.Errorf("p99 Quantile() = %v, want 41.94304ms", got)
	}
	if got := p90.Samples(); got != 5000 {
		t.Errorf("Samples() = %d, want 5000", got)
	}
}

// TestWindowFollowsDrift pins the sliding window: once the latencies
// double, the quantile follows within a share of a generation, and the old
// observations are forgotten after two generations.
func TestWindowFollowsDrift(t *testing.T) {
	const size = 100
	w := mustWindow(t, 0.5, size)
	if got := w.Quantile(); got != 0 {
		t.Errorf("Quantile() with no observations = %v, want 0", got)
	}
	for range 3 * size {
		w.Observe(2 * ms)
	}
	n := 0
	for w.Quantile() < 4*ms {
		w.Observe(4 * ms)
		n++
	}
	// Right after a rotation the window holds one generation of 2ms; the
	// median moves past it with 101 observations at 4ms, and the
	// recomputation every 16th observation reads it by the 112th.
	if n < 100 || n > 112 {
		t.Errorf("the median moved to 4ms after %d observations, want 100 to 112", n)
	}
	w2 := mustWindow(t, 0.01, size)
	for range size {
		w2.Observe(ms)
	}
	for range 2 * size {
		w2.Observe(8 * ms)
	}
	w2.Observe(8 * ms)
	if got := w2.Quantile(); got < 8*ms {
		t.Errorf("p1 Quantile() two generations after the last 1ms = %v, want at least 8ms", got)
	}
}

func TestWindowObserveAtLeast(t *testing.T) {
	w := mustWindow(t, 0.5, DefaultWindowSize)
	w.ObserveAtLeast(3 * ms) // the first observation: recorded
	if got := w.Samples(); got != 1 {
		t.Fatalf("Samples() after the first ObserveAtLeast = %d, want 1", got)
	}
	for range 10 {
		w.Observe(ms)
	}
	q := w.Quantile()
	w.ObserveAtLeast(q / 2) // below the quantile: its side is unknown
	if got := w.Samples(); got != 11 {
		t.Errorf("Samples() after ObserveAtLeast(%v) below the quantile %v = %d, want 11 (dropped)", q/2, q, got)
	}
	w.ObserveAtLeast(q) // at the quantile: above it for sure
	if got := w.Samples(); got != 12 {
		t.Errorf("Samples() after ObserveAtLeast(%v) at the quantile = %d, want 12", q, got)
	}
}

func TestWindowConcurrent(t *testing.T) {
	w := mustWindow(t, 0.9, 64)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 2000 {
				w.Observe(time.Duration(r.IntN(10)+1) * ms)
				_ = w.Quantile()
			}
		})
	}
	wg.Wait()
	if got := w.Samples(); got != 16000 {
		t.Errorf("Samples() = %d, want 16000", got)
	}
	if q := w.Quantile(); q < 9*ms || q > 11*ms {
		t.Errorf("p90 of uniform 1..10ms = %v, want about 10ms", q)
	}
}

func TestWindowDoesNotAllocate(t *testing.T) {
	w := mustWindow(t, 0.9, DefaultWindowSize)
	i := 0
	if n := testing.AllocsPerRun(1000, func() {
		w.Observe(time.Duration(i%7+1) * ms)
		w.ObserveAtLeast(5 * ms)
		_ = w.Quantile()
		i++
	}); n != 0 {
		t.Errorf("Observe, ObserveAtLeast and Quantile allocate %v times, want 0", n)
	}
}

// TestWindowStaysAboveAClusterTheEstimatorDipsBelow pins why hedging reads
// a Window rather than an Estimator: on latencies of 2ms (95 %) or 40ms,
// the Estimator's p90 oscillates around 2ms and spends about 5 % of the
// time below it, where a hedging delay would hedge fast calls too (about
// twice the intended share); the Window's p90 stays just above 2ms.
func TestWindowStaysAboveAClusterTheEstimatorDipsBelow(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	e := mustNew(t, Config{Quantile: 0.9, Gain: 0.1})
	w := mustWindow(t, 0.9, DefaultWindowSize)
	const n = 20000
	eBelow, wBelow := 0, 0
	for i := range n {
		d := 2 * ms
		if r.Float64() < 0.05 {
			d = 40 * ms
		}
		if i >= 1000 {
			if e.Estimate() < 2*ms {
				eBelow++
			}
			if w.Quantile() < 2*ms {
				wBelow++
			}
		}
		e.Observe(d)
		w.Observe(d)
	}
	share := float64(eBelow) / (n - 1000)
	if share < 0.02 || wBelow != 0 {
		t.Errorf("below the 2ms cluster: Estimator %.1f%% of the time, Window %d times; want the Estimator at least 2%%, the Window never", 100*share, wBelow)
	}
	t.Logf("Estimator below 2ms %.1f%% of the time; Window never", 100*share)
}

// TestWindowReadsSeveralQuantilesInOnePass pins NewWindow with several
// quantiles, in any order: each reads what a window of that quantile alone
// reads, the first is the primary.
func TestWindowReadsSeveralQuantilesInOnePass(t *testing.T) {
	qs := []float64{0.9, 0.5, 0.99, 0.95}
	multi, err := NewWindow(DefaultWindowSize, qs...)
	if err != nil {
		t.Fatal(err)
	}
	var single []*Window
	for _, q := range qs {
		single = append(single, mustWindow(t, q, DefaultWindowSize))
	}
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 3000 {
		d := time.Duration(1+r.IntN(10)) * ms
		if r.Float64() < 0.07 {
			d *= 20
		}
		multi.Observe(d)
		for _, w := range single {
			w.Observe(d)
		}
		if i%97 != 0 {
			continue
		}
		for k, w := range single {
			if got, want := multi.QuantileAt(k), w.Quantile(); got != want {
				t.Fatalf("after %d observations, QuantileAt(%d) (p%v) = %v, want %v", i+1, k, qs[k], got, want)
			}
		}
	}
	if multi.Quantile() != multi.QuantileAt(0) {
		t.Errorf("Quantile() = %v, want the primary, QuantileAt(0) = %v", multi.Quantile(), multi.QuantileAt(0))
	}
	if _, err := NewWindow(10); err == nil {
		t.Errorf("NewWindow with no quantile: no error")
	}
}

// TestQuantileOfReadsAnyQuantile: QuantileOf gives what a window reading
// that quantile would keep, for quantiles it was not built with.
func TestQuantileOfReadsAnyQuantile(t *testing.T) {
	w, err := NewWindow(DefaultWindowSize, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if d := w.QuantileOf(0.9); d != 0 {
		t.Errorf("QuantileOf(0.9) of an empty window = %v, want 0", d)
	}
	for i := range 200 {
		d := 2 * time.Millisecond
		if i%10 == 0 {
			d = 40 * time.Millisecond
		}
		w.Observe(d)
	}
	for _, p := range []float64{0.5, 0.85, 0.9, 0.95, 0.99} {
		ref, _ := NewWindow(DefaultWindowSize, p)
		for i := range 200 {
			d := 2 * time.Millisecond
			if i%10 == 0 {
				d = 40 * time.Millisecond
			}
			ref.Observe(d)
		}
		if got, want := w.QuantileOf(p), ref.Quantile(); got != want {
			t.Errorf("QuantileOf(%v) = %v, want %v", p, got, want)
		}
	}
}

// TestObserveCountsEachObservationOnce: of observations made at once, each
// gets its own count, so that a caller acting every k observations (the
// client's hedging delay) acts at each multiple of k exactly once; Samples
// read after Observe could give two of them the same count past a multiple.
func TestObserveCountsEachObservationOnce(t *testing.T) {
	w := mustWindow(t, 0.5, DefaultWindowSize)
	const goroutines, each = 16, 500
	seen := make([]atomic.Int32, goroutines*each+1)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				n := w.Observe(time.Duration(g*each+i+1) * time.Microsecond)
				if n == 0 || n > goroutines*each {
					t.Errorf("Observe returned %d, want 1 to %d", n, goroutines*each)
					return
				}
				seen[n].Add(1)
			}
		})
	}
	wg.Wait()
	for n := 1; n < len(seen); n++ {
		if c := seen[n].Load(); c != 1 {
			t.Fatalf("count %d returned %d times, want once", n, c)
		}
	}
	if got := w.Samples(); got != goroutines*each {
		t.Errorf("Samples = %d, want %d", got, goroutines*each)
	}
}

// TestRestartReplacesEveryObservation: after Restart the window reads only
// the durations it was given and the observations made after it, in both
// generations; its own quantile is recomputed at once, and Samples does
// not count the given durations again.
func TestRestartReplacesEveryObservation(t *testing.T) {
	w := mustWindow(t, 0.9, 64)
	for range 100 { // both generations hold 2ms
		w.Observe(2 * time.Millisecond)
	}
	eight := upperEdge(bucketOf(8 * time.Millisecond))
	w.Restart(8*time.Millisecond, 8*time.Millisecond)
	if got := w.QuantileOf(0.1); got != eight {
		t.Errorf("QuantileOf(0.1) after Restart(8ms, 8ms) = %v, want %v (no 2ms left)", got, eight)
	}
	if got := w.Quantile(); got != eight {
		t.Errorf("Quantile after Restart(8ms, 8ms) = %v, want %v at once", got, eight)
	}
	if got := w.Samples(); got != 100 {
		t.Errorf("Samples after Restart = %d, want 100: the given durations were observed already", got)
	}
	for range 6 {
		w.Observe(time.Millisecond)
	}
	if got, want := w.QuantileOf(0.5), upperEdge(bucketOf(time.Millisecond)); got != want {
		t.Errorf("QuantileOf(0.5) of 2 × 8ms and 6 × 1ms = %v, want %v", got, want)
	}
	if got := w.Samples(); got != 106 {
		t.Errorf("Samples = %d, want 106", got)
	}
}
