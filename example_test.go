package resilience_test

import (
	"fmt"

	"github.com/grpc-resilience/resilience"
)

// A program can report which release of the module it was built with.
func ExampleVersion() {
	fmt.Println("grpc-resilience", resilience.Version)
	// Output: grpc-resilience v0.5.0
}
