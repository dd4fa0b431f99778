package budget

import (
	"testing"
	"time"
)

// Instants in the benchmarks come from time.Now, so they carry a monotonic
// reading as the interceptor's will, and advance by 1µs per call so that the
// window rotates as it does under load.

func newBench(b *testing.B) (*Budget, time.Time) {
	b.Helper()
	start := time.Now()
	bu, err := New(DefaultConfig(), start)
	if err != nil {
		b.Fatal(err)
	}
	return bu, start
}

// BenchmarkSuccessfulCall is the hot path: a call that succeeds on its first
// attempt deposits its share and refunds nothing.
func BenchmarkSuccessfulCall(b *testing.B) {
	bu, now := newBench(b)
	var none Retry
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Microsecond)
		bu.OnRequest(now)
		bu.Refund(none)
	}
}

// BenchmarkRetryThatSucceeds is a call whose first attempt fails and whose
// retry succeeds: deposit, withdrawal, refund.
func BenchmarkRetryThatSucceeds(b *testing.B) {
	bu, now := newBench(b)
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Microsecond)
		bu.OnRequest(now)
		r, _ := bu.TryRetry(now)
		bu.Refund(r)
	}
}

// BenchmarkRetryDenied is an outage in steady state: the budget is spent and
// every retry is refused without a write.
func BenchmarkRetryDenied(b *testing.B) {
	bu, now := newBench(b)
	for {
		if _, ok := bu.TryRetry(now); !ok {
			break
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := bu.TryRetry(now); ok {
			b.Fatal("TryRetry on a spent budget = true")
		}
	}
}

func BenchmarkSuccessfulCallParallel(b *testing.B) {
	bu, start := newBench(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		now := start
		var none Retry
		for pb.Next() {
			now = now.Add(time.Microsecond)
			bu.OnRequest(now)
			bu.Refund(none)
		}
	})
}

func BenchmarkRetryThatSucceedsParallel(b *testing.B) {
	bu, start := newBench(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		now := start
		for pb.Next() {
			now = now.Add(time.Microsecond)
			bu.OnRequest(now)
			r, _ := bu.TryRetry(now)
			bu.Refund(r)
		}
	})
}
