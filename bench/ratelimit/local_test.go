package ratelimit

import (
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go/ratelimiter"
	"golang.org/x/time/rate"

	ours "github.com/grpc-resilience/resilience/internal/ratelimit"
)

// A rate high enough that every decision is admitted (the common case,
// and the one that writes), with a burst that never runs out.
const (
	benchRate  = 1e9 / 10 // a token every 10ns: more than any loop here takes
	benchBurst = 1 << 20
	numKeys    = 10_000
)

// cpuNS runs f and reports the process's CPU time per iteration.
func cpuNS(b *testing.B, f func()) {
	var r0, r1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	f()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	cpu := r1.Utime.Nano() + r1.Stime.Nano() - r0.Utime.Nano() - r0.Stime.Nano()
	b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
}

func keyNames() []string {
	keys := make([]string, numKeys)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa((i*7919)%numKeys)
	}
	return keys
}

// instants are instants 10ns apart from one read of time.Now (so with a
// monotonic reading): the peers that take the time as a parameter (ours,
// x/time/rate) are given the same instants, so that the loop times their
// decisions, not the clock; failsafe-go reads its own clock (time.Since),
// whose cost the "clock" rows show.
type instants struct {
	start time.Time
	i     time.Duration
}

func newInstants() *instants { return &instants{start: time.Now()} }

func (in *instants) next() time.Time {
	in.i += 10 * time.Nanosecond
	return in.start.Add(in.i)
}

func newOurs(b *testing.B, start time.Time) *ours.Limiter {
	l, err := ours.New(ours.Config{Rate: benchRate, Burst: benchBurst, MaxKeys: numKeys}, start)
	if err != nil {
		b.Fatal(err)
	}
	return l
}

var sinkTime time.Time
var sinkDuration time.Duration

// BenchmarkClock is what reading the clock costs on this machine: a
// server reads it once per call in any case; failsafe-go's decision
// includes a time.Since.
func BenchmarkClock(b *testing.B) {
	b.Run("time.Now", func(b *testing.B) {
		cpuNS(b, func() {
			for b.Loop() {
				sinkTime = time.Now()
			}
		})
	})
	b.Run("time.Since", func(b *testing.B) {
		start := time.Now()
		cpuNS(b, func() {
			for b.Loop() {
				sinkDuration = time.Since(start)
			}
		})
	})
}

func BenchmarkOneKey(b *testing.B) {
	b.Run("ours", func(b *testing.B) {
		in := newInstants()
		l := newOurs(b, in.start)
		b.ReportAllocs()
		cpuNS(b, func() {
			for b.Loop() {
				if ok, _ := l.Allow(in.next(), "tenant", ours.Critical); !ok {
					b.Fatal("refused")
				}
			}
		})
	})
	b.Run("x-time-rate", func(b *testing.B) {
		in := newInstants()
		l := rate.NewLimiter(benchRate, benchBurst)
		b.ReportAllocs()
		cpuNS(b, func() {
			for b.Loop() {
				if !l.AllowN(in.next(), 1) {
					b.Fatal("refused")
				}
			}
		})
	})
	b.Run("failsafe-go", func(b *testing.B) {
		l := ratelimiter.NewSmoothWithMaxRate[any](time.Nanosecond)
		b.ReportAllocs()
		cpuNS(b, func() {
			for b.Loop() {
				l.TryAcquirePermit() // reads the clock itself
			}
		})
	})
}

func BenchmarkTenThousandKeys(b *testing.B) {
	keys := keyNames()
	b.Run("ours", func(b *testing.B) {
		in := newInstants()
		l := newOurs(b, in.start)
		for _, k := range keys {
			l.Allow(in.start, k, ours.Critical)
		}
		i := 0
		b.ReportAllocs()
		cpuNS(b, func() {
			for b.Loop() {
				if ok, _ := l.Allow(in.next(), keys[i], ours.Critical); !ok {
					b.Fatal("refused")
				}
				if i++; i == len(keys) {
					i = 0
				}
			}
		})
	})
	b.Run("x-time-rate", func(b *testing.B) {
		var m sync.Map
		get := func(k string) *rate.Limiter {
			if l, ok := m.Load(k); ok {
				return l.(*rate.Limiter)
			}
			l, _ := m.LoadOrStore(k, rate.NewLimiter(benchRate, benchBurst))
			return l.(*rate.Limiter)
		}
		for _, k := range keys {
			get(k)
		}
		in := newInstants()
		i := 0
		b.ReportAllocs()
		cpuNS(b, func() {
			for b.Loop() {
				if !get(keys[i]).AllowN(in.next(), 1) {
					b.Fatal("refused")
				}
				if i++; i == len(keys) {
					i = 0
				}
			}
		})
	})
	b.Run("failsafe-go", func(b *testing.B) {
		var m sync.Map
		get := func(k string) ratelimiter.RateLimiter[any] {
			if l, ok := m.Load(k); ok {
				return l.(ratelimiter.RateLimiter[any])
			}
			l, _ := m.LoadOrStore(k, ratelimiter.NewSmoothWithMaxRate[any](time.Nanosecond))
			return l.(ratelimiter.RateLimiter[any])
		}
		for _, k := range keys {
			get(k)
		}
		i := 0
		b.ReportAllocs()
		cpuNS(b, func() {
			for b.Loop() {
				get(keys[i]).TryAcquirePermit()
				if i++; i == len(keys) {
					i = 0
				}
			}
		})
	})
}
