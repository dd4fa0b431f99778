package interceptor

import (
	"testing"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/server"
)

// The client tests below run against the server side through its public
// API (package server), as a user's client and server would meet.

// memoryIdemServer is a server.Server with idempotency on a fresh memory
// store and one scope for every caller.
func memoryIdemServer(tb testing.TB) *server.Server {
	tb.Helper()
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		tb.Fatal(err)
	}
	s, err := server.New(server.WithIdempotency(server.Idempotency{Store: store, Scope: server.SharedScope}))
	if err != nil {
		tb.Fatal(err)
	}
	return s
}
