package wire_test

import (
	"context"
	"fmt"

	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/wire"
)

// A batch job marks its calls SHEDDABLE, so that an overloaded server sheds
// them before anyone's interactive calls.
func ExampleContextWithCriticality() {
	ctx := wire.ContextWithCriticality(context.Background(), wire.Sheddable)
	md, _ := metadata.FromOutgoingContext(ctx)
	fmt.Println(md.Get(wire.CriticalityKey))

	c, ok := wire.ParseCriticality("sheddable_plus") // as a server reads it: case does not matter
	fmt.Println(c, ok)
	// Output:
	// [SHEDDABLE]
	// SHEDDABLE_PLUS true
}

// A caller learns from the response header whether the server ran its call
// or replayed the outcome of an earlier attempt with the same key.
func ExampleIdempotencyReplayed() {
	var header metadata.MD // as grpc.Header(&header) fills it
	fmt.Println(wire.IdempotencyReplayed(header))

	header = metadata.Pairs(wire.IdempotencyReplayedHeader, "true")
	fmt.Println(wire.IdempotencyReplayed(header))
	// Output:
	// false
	// true
}

func ExampleValidIdempotencyKey() {
	fmt.Println(wire.ValidIdempotencyKey("order-42"))
	fmt.Println(wire.ValidIdempotencyKey(""))
	// Output:
	// <nil>
	// idempotency-key is 0 bytes long; it must be 1 to 255 printable ASCII characters
}
