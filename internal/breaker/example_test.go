package breaker_test

import (
	"fmt"
	"time"

	"github.com/grpc-resilience/resilience/internal/breaker"
)

func Example() {
	b, err := breaker.New(breaker.Config{
		ConsecutiveFailures: 2,
		OpenDuration:        time.Second,
		OnStateChange: func(from, to breaker.State) {
			fmt.Printf("%v → %v\n", from, to)
		},
	})
	if err != nil {
		panic(err)
	}
	now := time.Unix(0, 0)
	for range 2 {
		tok, _, _ := b.Allow(now)
		b.Record(tok, now, breaker.Failure, 10*time.Millisecond)
	}
	_, retryAfter, err := b.Allow(now.Add(200 * time.Millisecond))
	fmt.Println(err, retryAfter)

	now = now.Add(time.Second)
	tok, _, _ := b.Allow(now)
	fmt.Println("probe:", tok.Probe())
	b.Record(tok, now, breaker.Success, 10*time.Millisecond)
	// Output:
	// closed → open
	// breaker: circuit open 800ms
	// open → half-open
	// probe: true
	// half-open → closed
}
