package throttle_test

import (
	"fmt"

	"github.com/grpc-resilience/resilience/internal/throttle"
)

func ExampleThrottle() {
	th, err := throttle.New(throttle.Config{MaxTokens: 10, TokenRatio: 0.1})
	if err != nil {
		panic(err)
	}
	for range 5 {
		retry := th.OnFailure() // an attempt failed with UNAVAILABLE
		fmt.Println(th.Tokens(), retry)
	}
	th.OnSuccess()
	fmt.Println(th.Tokens(), th.Allow())
	// Output:
	// 9 true
	// 8 true
	// 7 true
	// 6 true
	// 5 false
	// 5.1 true
}
