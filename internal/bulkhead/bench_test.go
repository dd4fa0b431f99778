package bulkhead

import (
	"context"
	"testing"
)

func BenchmarkAcquireRelease(b *testing.B) {
	bh, err := New(Config{MaxConcurrent: 64, MaxQueue: 128}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := bh.Acquire(ctx); err != nil {
			b.Fatal(err)
		}
		bh.Release()
	}
}

func BenchmarkAcquireReleaseParallel(b *testing.B) {
	bh, err := New(Config{MaxConcurrent: 64, MaxQueue: 128}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := bh.Acquire(ctx); err != nil {
				b.Error(err)
				return
			}
			bh.Release()
		}
	})
}

// BenchmarkAcquireReleaseQueued has one slot for all goroutines, so most
// acquisitions wait in the queue: the slow path, for comparison.
func BenchmarkAcquireReleaseQueued(b *testing.B) {
	bh, err := New(Config{MaxConcurrent: 1, MaxQueue: 1 << 20}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := bh.Acquire(ctx); err != nil {
				b.Error(err)
				return
			}
			bh.Release()
		}
	})
}

// BenchmarkAcquireFull is the rejection of a full bulkhead without a queue.
func BenchmarkAcquireFull(b *testing.B) {
	bh, err := New(Config{MaxConcurrent: 1}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := bh.Acquire(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := bh.Acquire(ctx); err != ErrQueueFull {
			b.Fatal(err)
		}
	}
}
