package wire_test

import (
	"context"
	"fmt"

	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/wire"
)

func ExampleContextWithCriticality() {
	ctx := wire.ContextWithCriticality(context.Background(), wire.Sheddable)
	md, _ := metadata.FromOutgoingContext(ctx)
	fmt.Println(wire.CriticalityKey, md.Get(wire.CriticalityKey))
	c, ok := wire.ParseCriticality("critical_plus")
	fmt.Println(c, ok)
	// Output:
	// resilience-criticality [SHEDDABLE]
	// CRITICAL_PLUS true
}
