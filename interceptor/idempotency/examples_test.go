package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

func ExampleNewMemoryStore() {
	store, err := idempotency.NewMemoryStore(
		idempotency.WithMaxEntries(10_000),
		idempotency.WithMaxBytes(16<<20),       // 1 MiB in each of the 16 shards
		idempotency.WithMaxRecordBytes(64<<10), // so that a shard holds a record
	)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	key := idempotency.RecordKey{Scope: "tenant-1", FullMethod: "/shop.Orders/Create", Key: "7f3c9a"}
	fp := []byte("request fingerprint")

	first, _ := store.Claim(ctx, key, fp, 30*time.Second)
	fmt.Println("first:", first.State)
	dup, _ := store.Claim(ctx, key, fp, 30*time.Second)
	fmt.Println("duplicate while running:", dup.State)

	rec := &idempotency.Record{Fingerprint: fp, ReplyType: "shop.Order", Reply: []byte{0x0a, 0x01, 'x'}}
	if err := store.Complete(ctx, key, first.Token, rec, 24*time.Hour); err != nil {
		panic(err)
	}
	dup, _ = store.Claim(ctx, key, fp, 30*time.Second)
	fmt.Println("duplicate after completion:", dup.State, dup.Record.ReplyType)
	other, _ := store.Claim(ctx, key, []byte("another request"), 30*time.Second)
	fmt.Println("same key, other request:", other.State)
	// Output:
	// first: Owned
	// duplicate while running: InProgress
	// duplicate after completion: Completed shop.Order
	// same key, other request: Mismatch
}

// A store shared by tenants: each holds at most 2 keys here (thousands in
// practice), and a record is kept at least 10 minutes. A tenant over its quota is refused, with a hint;
// no other tenant's record goes.
func ExampleWithScopeQuota() {
	store, err := idempotency.NewMemoryStore(
		idempotency.WithShards(1), // one shard, so that the quota below is exact
		idempotency.WithScopeQuota(2, 0),
		idempotency.WithMinRetention(10*time.Minute),
	)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	fp := []byte("request fingerprint")
	for _, k := range []string{"1", "2", "3"} {
		key := idempotency.RecordKey{Scope: "tenant-b", FullMethod: "/shop.Orders/Create", Key: k}
		c, err := store.Claim(ctx, key, fp, 30*time.Second)
		if err != nil {
			var full *idempotency.FullError
			if errors.As(err, &full) {
				fmt.Println(k, "refused:", full.Scope, full.RetryAfter.Round(time.Minute))
			}
			continue
		}
		_ = store.Complete(ctx, key, c.Token, &idempotency.Record{Fingerprint: fp}, 24*time.Hour)
		fmt.Println(k, c.State)
	}
	a, _ := store.Claim(ctx, idempotency.RecordKey{Scope: "tenant-a", FullMethod: "/shop.Orders/Create", Key: "1"}, fp, 30*time.Second)
	fmt.Println("tenant-a:", a.State)
	st := store.Stats()
	fmt.Println("entries", st.Entries, "evicted", st.Evicted, "refused", st.Refused)
	// Output:
	// 1 Owned
	// 2 Owned
	// 3 refused: true 10m0s
	// tenant-a: Owned
	// entries 3 evicted 0 refused 1
}
