package latency

import (
	"testing"
	"time"
)

func BenchmarkObserve(b *testing.B) {
	e := mustNew(b, DefaultConfig())
	b.ReportAllocs()
	// Alternate above and below the estimate, so both steps are measured.
	d := [2]time.Duration{5 * time.Millisecond, 50 * time.Millisecond}
	i := 0
	for b.Loop() {
		e.Observe(d[i&1])
		i++
	}
}

func BenchmarkEstimate(b *testing.B) {
	e := mustNew(b, DefaultConfig())
	e.Observe(10 * time.Millisecond)
	b.ReportAllocs()
	for b.Loop() {
		_ = e.Estimate()
	}
}

func BenchmarkObserveParallel(b *testing.B) {
	e := mustNew(b, DefaultConfig())
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		d := [2]time.Duration{5 * time.Millisecond, 50 * time.Millisecond}
		i := 0
		for pb.Next() {
			e.Observe(d[i&1])
			_ = e.Estimate()
			i++
		}
	})
}

func BenchmarkWindowObserve(b *testing.B) {
	w, _ := NewWindow(DefaultWindowSize, 0.95)
	b.ReportAllocs()
	d := [2]time.Duration{2 * time.Millisecond, 40 * time.Millisecond}
	i := 0
	for b.Loop() {
		w.Observe(d[i&1])
		i++
	}
}
