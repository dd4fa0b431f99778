package throttle

import "testing"

// BenchmarkSuccess is the hot path: a call that succeeds on its first
// attempt, with a full bucket.
func BenchmarkSuccess(b *testing.B) {
	th := mustNew(b, Config{MaxTokens: 10, TokenRatio: 0.1})
	b.ReportAllocs()
	for b.Loop() {
		th.OnSuccess()
	}
}

// BenchmarkFailureAndSuccess moves the count every time: a failed attempt,
// the throttle check, and a success that refills.
func BenchmarkFailureAndSuccess(b *testing.B) {
	th := mustNew(b, Config{MaxTokens: 10, TokenRatio: 1})
	b.ReportAllocs()
	for b.Loop() {
		_ = th.OnFailure()
		th.OnSuccess()
	}
}

func BenchmarkSuccessParallel(b *testing.B) {
	th := mustNew(b, Config{MaxTokens: 10, TokenRatio: 0.1})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			th.OnSuccess()
		}
	})
}

func BenchmarkFailureAndSuccessParallel(b *testing.B) {
	th := mustNew(b, Config{MaxTokens: 10, TokenRatio: 1})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = th.OnFailure()
			th.OnSuccess()
		}
	})
}
