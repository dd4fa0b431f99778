// Package codes holds sets of gRPC status codes and the rules that say which
// codes are worth retrying or count against a circuit breaker.
//
// A [Set] is a bitmask over the 17 codes of google.golang.org/grpc/codes, so
// membership is one AND and a Set costs four bytes and no allocation. Sets are
// written as names, as gRFC A6 writes them in a service config:
//
//	s, err := codes.ParseSet([]string{"UNAVAILABLE", "resource_exhausted", "10"})
//
// Names are matched case-insensitively (gRFC A6) and decimal numbers 0 to 16
// are accepted; anything else is an error that says which element is wrong.
//
// # Default rules
//
// Retried by default ([DefaultRetryable]): UNAVAILABLE and RESOURCE_EXHAUSTED.
// DEADLINE_EXCEEDED is retried only when it is an attempt's own timeout that
// fired, never when the caller's deadline passed; ABORTED only for methods
// known to be idempotent. Never retried by default: OK, CANCELLED,
// INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
// UNAUTHENTICATED, FAILED_PRECONDITION, OUT_OF_RANGE and UNIMPLEMENTED. An
// explicit list of retryable codes replaces these rules and is honoured exactly
// as written.
//
// Counted as a circuit-breaker failure by default ([DefaultBreakerFailures]):
// UNAVAILABLE, DEADLINE_EXCEEDED of an attempt, INTERNAL, UNKNOWN, DATA_LOSS and
// RESOURCE_EXHAUSTED.
//
// The package imports only the standard library and grpc's codes and status
// packages. A file that needs both this package and grpc's imports this one
// as rescodes.
//
// See https://github.com/grpc/proposal/blob/master/A6-client-retries.md.
package codes
