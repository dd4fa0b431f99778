package ratelimit

import (
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The decision's cost: admitted calls on one key, and on 10,000 keys in
// turn (each remembered), with time moving so that tokens keep coming;
// and in parallel, contended on one key and spread over many. The
// instants carry a monotonic reading, as time.Now's do, and are made
// before the loop, so the loop times the decision alone.

// instants returns n instants 1µs apart, from time.Now.
func instants(n int) (start time.Time, at []time.Time) {
	start = time.Now()
	at = make([]time.Time, n)
	for i := range at {
		at[i] = start.Add(time.Duration(i+1) * time.Microsecond)
	}
	return start, at
}

func newBench(b *testing.B, cfg Config, start time.Time) *Limiter {
	l, err := New(cfg, start)
	if err != nil {
		b.Fatal(err)
	}
	return l
}

func BenchmarkAllowOneKey(b *testing.B) {
	start, at := instants(1 << 16)
	l := newBench(b, Config{Rate: 1e6, Burst: 1000}, start)
	i := 0
	b.ReportAllocs()
	cpuNS(b, func() {
		for b.Loop() {
			l.Allow(at[i&(1<<16-1)], "tenant", Critical)
			i++
		}
	})
}

func BenchmarkAllow10kKeys(b *testing.B) {
	start, at := instants(1 << 16)
	l := newBench(b, Config{Rate: 1e6, Burst: 1000, MaxKeys: 10_000}, start)
	keys := tenKeys(l, start)
	i, k := 0, 0
	b.ReportAllocs()
	cpuNS(b, func() {
		for b.Loop() {
			l.Allow(at[i&(1<<16-1)], keys[k], Critical)
			i++
			if k++; k == len(keys) {
				k = 0
			}
		}
	})
}

func BenchmarkAllowRefused(b *testing.B) {
	start := time.Now()
	l := newBench(b, Config{Rate: 1, Burst: 1}, start)
	l.Allow(start, "tenant", Critical)
	b.ReportAllocs()
	for b.Loop() {
		l.Allow(start, "tenant", Critical)
	}
}

// tenKeys remembers 10,000 keys in l and returns them, shuffled so that
// turns through them do not follow the table's order.
func tenKeys(l *Limiter, now time.Time) []string {
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa((i*7919)%len(keys))
		l.Allow(now, keys[i], Critical)
	}
	return keys
}

func BenchmarkAllowOneKeyParallel(b *testing.B) {
	start, at := instants(1 << 16)
	l := newBench(b, Config{Rate: 1e6, Burst: 1000}, start)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			l.Allow(at[i&(1<<16-1)], "tenant", Critical)
			i++
		}
	})
}

func BenchmarkAllow10kKeysParallel(b *testing.B) {
	start, at := instants(1 << 16)
	l := newBench(b, Config{Rate: 1e6, Burst: 1000, MaxKeys: 10_000}, start)
	keys := tenKeys(l, start)
	var seq atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		k := int(seq.Add(1)) * 5003 % len(keys)
		i := 0
		for pb.Next() {
			l.Allow(at[i&(1<<16-1)], keys[k], Critical)
			i++
			if k++; k == len(keys) {
				k = 0
			}
		}
	})
}

// cpuNS reports the process's CPU time per iteration as "cpu-ns/op": on a
// machine whose cores other work shares, a single goroutine's wall time per
// operation includes the time it waited for a core, its CPU time does not.
func cpuNS(b *testing.B, f func()) {
	var r0, r1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	f()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	cpu := time.Duration(r1.Utime.Nano() + r1.Stime.Nano() - r0.Utime.Nano() - r0.Stime.Nano())
	b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
}
