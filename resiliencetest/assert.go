package resiliencetest

import (
	"slices"
	"testing"
)

// RequireAttempts fails the test now unless the server saw exactly want
// attempts of fullMethod: every attempt that arrived, those a server
// interceptor such as faultinject's ended before the handler included
// (when the Server was started by Start or Serve).
func RequireAttempts(t testing.TB, s *Server, fullMethod string, want int) {
	t.Helper()
	if got := len(s.Attempts(fullMethod)); got != want {
		t.Fatalf("server saw %d attempts of %s, want %d", got, fullMethod, want)
	}
}

// RequirePreviousAttempts fails the test now unless the attempts of
// fullMethod carried these grpc-previous-rpc-attempts values, in order (-1
// for an attempt without the header). A retrying client sends none on the
// first attempt, then 1, 2, ... (gRFC A6).
func RequirePreviousAttempts(t testing.TB, s *Server, fullMethod string, want ...int) {
	t.Helper()
	var got []int
	for _, a := range s.Attempts(fullMethod) {
		got = append(got, a.Previous)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("grpc-previous-rpc-attempts of %s = %v, want %v", fullMethod, got, want)
	}
}
