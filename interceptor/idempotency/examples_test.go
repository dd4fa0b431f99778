package idempotency_test

import (
	"context"
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
