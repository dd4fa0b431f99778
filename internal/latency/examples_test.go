package latency_test

import (
	"fmt"
	"time"

	"github.com/grpc-resilience/resilience/internal/latency"
)

func ExampleEstimator() {
	cfg := latency.DefaultConfig()
	cfg.Floor = 5 * time.Millisecond
	e, err := latency.New(cfg)
	if err != nil {
		panic(err)
	}
	fmt.Println(e.Estimate()) // no observations yet: the floor
	e.Observe(20 * time.Millisecond)
	fmt.Println(e.Estimate()) // the first observation
	e.Observe(40 * time.Millisecond)
	fmt.Println(e.Estimate().Round(time.Microsecond)) // one step up: ×e^0.09
	// Output:
	// 5ms
	// 20ms
	// 21.883ms
}
