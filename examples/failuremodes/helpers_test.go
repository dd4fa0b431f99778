package failuremodes_test

import (
	"strconv"
	"testing"
	"time"

	. "github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/server"
)

// The helpers below are the interceptor package's test helpers of the same
// names (invariant_test.go, idempotency_helpers_test.go), over its
// exported API: these tests moved here from that package.

// nothingHeldWithin bounds the wait for releases that happen off the
// caller's goroutine.
const nothingHeldWithin = 5 * time.Second

// newTestClient is NewClient for tests: it fails t on a configuration error
// and checks, after the test, that no guard is held.
func newTestClient(t testing.TB, opts ...ClientOption) *Client {
	t.Helper()
	c, err := NewClient(opts...)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() {
		t.Helper()
		held := heldGuards(c)
		for deadline := time.Now().Add(nothingHeldWithin); held != "" && time.Now().Before(deadline); held = heldGuards(c) {
			time.Sleep(time.Millisecond) // releases on other goroutines may still be under way
		}
		if held != "" {
			t.Errorf("after the test, guards still held: %s", held)
		}
	})
	return c
}

// heldGuards describes what c's methods hold, or returns "".
func heldGuards(c *Client) string {
	var held string
	for _, s := range c.Statuses() {
		if b := s.Bulkhead; b != nil && (b.InFlight != 0 || b.Queued != 0) {
			held += s.FullMethod + ": bulkhead in flight " + strconv.Itoa(b.InFlight) + ", queued " + strconv.Itoa(b.Queued) + "; "
		}
		if b := s.Breaker; b != nil && b.Probes != 0 {
			held += s.FullMethod + ": breaker " + b.State.String() + " with " + strconv.Itoa(b.Probes) + " probes out; "
		}
	}
	return held
}

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
