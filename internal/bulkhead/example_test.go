package bulkhead_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/grpc-resilience/resilience/internal/bulkhead"
)

func Example() {
	b, err := bulkhead.New(bulkhead.Config{MaxConcurrent: 1}, nil)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	fmt.Println(b.Acquire(ctx))
	err = b.Acquire(ctx)
	fmt.Println(err, errors.Is(err, bulkhead.ErrFull))
	fmt.Printf("%+v\n", b.Snapshot())
	b.Release()
	// Output:
	// <nil>
	// bulkhead: full: queue full true
	// {InFlight:1 Queued:0}
}
