package budget_test

import (
	"fmt"
	"time"

	"github.com/grpc-resilience/resilience/internal/budget"
)

func ExampleBudget() {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	b, err := budget.New(budget.DefaultConfig(), start)
	if err != nil {
		panic(err)
	}
	fmt.Println(b.Available(start)) // the reserve: 10/s × 10s

	// A call whose first attempt fails and whose retry succeeds.
	now := start.Add(time.Millisecond)
	b.OnRequest(now) // deposits 0.2
	r, ok := b.TryRetry(now)
	fmt.Println(ok, b.Available(now))
	b.Refund(r) // the retry succeeded: it costs nothing
	fmt.Println(b.Available(now))
	// Output:
	// 100
	// true 99.2
	// 100.2
}
