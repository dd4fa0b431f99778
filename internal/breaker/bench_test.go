package breaker

import (
	"testing"
	"time"
)

// benchConfig turns on every trip condition, so Record does all its work.
var benchConfig = Config{
	ConsecutiveFailures:  5,
	FailureRateThreshold: 0.5,
	SlowCallDuration:     time.Second,
	MinimumCalls:         20,
}

func BenchmarkAllowRecordClosed(b *testing.B) {
	br, err := New(benchConfig)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Unix(1000, 0)
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Microsecond) // the window rolls a bucket every 1e6 calls
		tok, _, err := br.Allow(now)
		if err != nil {
			b.Fatal(err)
		}
		br.Record(tok, now, Success, time.Millisecond)
	}
}

func BenchmarkAllowRecordClosedParallel(b *testing.B) {
	br, err := New(benchConfig)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Unix(1000, 0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		now := now
		for pb.Next() {
			now = now.Add(time.Microsecond)
			tok, _, err := br.Allow(now)
			if err != nil {
				b.Error(err)
				return
			}
			br.Record(tok, now, Success, time.Millisecond)
		}
	})
}

// BenchmarkAllowOpen is the rejection path: an open breaker failing fast.
func BenchmarkAllowOpen(b *testing.B) {
	br, err := New(benchConfig)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Unix(1000, 0)
	br.ForceOpen(now)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := br.Allow(now); err == nil {
			b.Fatal("Allow admitted an attempt while forced open")
		}
	}
}
