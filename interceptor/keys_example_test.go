package interceptor_test

import (
	"context"
	"fmt"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

func ExampleWithIdempotencyKeys() {
	c, err := interceptor.NewClient(
		interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{MaxAttempts: 3}),
		// CreateOrder has side effects: every call gets one key, kept on
		// every attempt, so a server with server.WithIdempotency places the
		// order once even when an attempt times out and is retried.
		interceptor.WithIdempotencyKeys("/shop.Orders/CreateOrder"),
	)
	fmt.Println(c != nil, err)

	// A caller with a natural key of its own uses it instead.
	ctx := interceptor.ContextWithIdempotencyKey(context.Background(), "order-2026-0042")
	key, _ := interceptor.IdempotencyKeyFromContext(ctx)
	fmt.Println(key)
	// Output:
	// true <nil>
	// order-2026-0042
}
