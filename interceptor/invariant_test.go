package interceptor

import (
	"strconv"
	"testing"
	"time"
)

// nothingHeldWithin bounds the wait for releases that happen off the
// caller's goroutine (a stream's watch on its context, a hedged copy
// finishing after the call returned).
const nothingHeldWithin = 5 * time.Second

// checkNothingHeld makes t fail, once the test and its other cleanups are
// over, if any method of c still holds a bulkhead slot or queue place, or a
// breaker probe. Register it before the connections the test closes, so it
// runs after them: a stream abandoned on a closed connection must have given
// its guards back by then. newEcho and newTestClient call it; every test
// that builds a Client does so through one of them.
func checkNothingHeld(t testing.TB, c *Client) {
	t.Helper()
	t.Cleanup(func() {
		t.Helper()
		if held := heldGuards(c); held != "" {
			// Releases that run on other goroutines may still be under way:
			// wait for them, on the bubble's clock inside synctest.
			deadline := time.Now().Add(nothingHeldWithin)
			for held != "" && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
				held = heldGuards(c)
			}
			if held != "" {
				t.Errorf("after the test, guards still held: %s", held)
			}
		}
	})
}

// heldGuards describes what c's methods hold, or returns "".
func heldGuards(c *Client) string {
	var held string
	for _, s := range c.Statuses() {
		if h := heldBy(s); h != "" {
			held += s.FullMethod + ": " + h
		}
	}
	return held
}

// heldBy describes what one method's guards hold, or returns "".
func heldBy(s MethodStatus) string {
	var held string
	if b := s.Bulkhead; b != nil && (b.InFlight != 0 || b.Queued != 0) {
		held += "bulkhead in flight " + strconv.Itoa(b.InFlight) + ", queued " + strconv.Itoa(b.Queued) + "; "
	}
	if r := s.RateLimit; r != nil && r.Waiting != 0 {
		held += "rate limit waiting " + strconv.Itoa(r.Waiting) + "; "
	}
	if b := s.Breaker; b != nil && b.Probes != 0 {
		held += "breaker " + b.State.String() + " with " + strconv.Itoa(b.Probes) + " probes out; "
	}
	return held
}

// newTestClient is NewClient for tests: it fails t on a configuration error
// and checks, after the test, that nothing is held (checkNothingHeld).
func newTestClient(t testing.TB, opts ...ClientOption) *Client {
	t.Helper()
	c, err := NewClient(opts...)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	checkNothingHeld(t, c)
	return c
}
