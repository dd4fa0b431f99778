package codes_test

import (
	"fmt"

	"google.golang.org/grpc/codes"

	rescodes "github.com/grpc-resilience/resilience/codes"
)

func ExampleParseSet() {
	s, err := rescodes.ParseSet([]string{"unavailable", "RESOURCE_EXHAUSTED", "10"})
	if err != nil {
		panic(err)
	}
	fmt.Println(s, s.Has(codes.Aborted), s.Has(codes.NotFound))
	_, err = rescodes.ParseSet([]string{"UNAVAILABLE", "TEAPOT"})
	fmt.Println(err)
	// Output:
	// RESOURCE_EXHAUSTED|ABORTED|UNAVAILABLE true false
	// [1]: unknown status code "TEAPOT"
}

func ExampleFromHTTPStatus() {
	for _, s := range []int{200, 429, 503, 401, 404} {
		fmt.Println(s, rescodes.FromHTTPStatus(s))
	}
	// Output:
	// 200 OK
	// 429 Unavailable
	// 503 Unavailable
	// 401 Unauthenticated
	// 404 Unimplemented
}
