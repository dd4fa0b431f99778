package idempotency_test

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// BenchmarkMemoryStore measures the store alone: a claim and completion of a
// new key in a full store of the default size, where each evicts the oldest
// record, and the claim of a completed key.
func BenchmarkMemoryStore(b *testing.B) {
	s, err := idempotency.NewMemoryStore()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	fp := bytes.Repeat([]byte{7}, 32)
	rec := &idempotency.Record{Fingerprint: fp, ReplyType: "x.Y", Reply: []byte("reply")}
	// Keys are made up front, and reused once they have been evicted.
	keys := make([]idempotency.RecordKey, 2*idempotency.DefaultMaxEntries)
	for i := range keys {
		keys[i] = idempotency.RecordKey{FullMethod: "/pkg.Service/Method", Key: "key-" + strconv.Itoa(i)}
	}
	i := 0
	first := func() {
		k := keys[i%len(keys)]
		i++
		c, err := s.Claim(ctx, k, fp, time.Minute)
		if err != nil || c.State != idempotency.Owned {
			b.Fatalf("Claim() = %v, %v", c.State, err)
		}
		if err := s.Complete(ctx, k, c.Token, rec, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	for range idempotency.DefaultMaxEntries {
		first()
	}
	b.Run("first execution, store full", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			first()
		}
	})
	b.Run("replay", func(b *testing.B) {
		k := keys[(i-1)%len(keys)]
		b.ReportAllocs()
		for b.Loop() {
			if c, _ := s.Claim(ctx, k, fp, time.Minute); c.State != idempotency.Completed {
				b.Fatal(c.State)
			}
		}
	})
}
