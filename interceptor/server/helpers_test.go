package server

import (
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Test helpers of the client side that the server's tests use too.

// nothingHeldWithin bounds the wait for releases that happen off the
// caller's goroutine (a stream's watch on its context, a hedged copy
// finishing after the call returned).
const nothingHeldWithin = 5 * time.Second

// checkNothingHeld makes t fail, once the test and its other cleanups are
// over, if any method of c still holds a bulkhead slot or queue place, or a
// breaker probe. Register it before the connections the test closes, so it
// runs after them: a stream abandoned on a closed connection must have given
// its guards back by then. newEcho and newTestClient call it; every test
// that builds a interceptor.Client does so through one of them.
func checkNothingHeld(t testing.TB, c *interceptor.Client) {
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
func heldGuards(c *interceptor.Client) string {
	var held string
	for _, s := range c.Statuses() {
		if h := heldBy(s); h != "" {
			held += s.FullMethod + ": " + h
		}
	}
	return held
}

// heldBy describes what one method's guards hold, or returns "".
func heldBy(s interceptor.MethodStatus) string {
	var held string
	if b := s.Bulkhead; b != nil && (b.InFlight != 0 || b.Queued != 0) {
		held += "bulkhead in flight " + strconv.Itoa(b.InFlight) + ", queued " + strconv.Itoa(b.Queued) + "; "
	}
	if b := s.Breaker; b != nil && b.Probes != 0 {
		held += "breaker " + b.State.String() + " with " + strconv.Itoa(b.Probes) + " probes out; "
	}
	return held
}

// newTestClient is interceptor.NewClient for tests: it fails t on a configuration error
// and checks, after the test, that nothing is held (checkNothingHeld).
func newTestClient(t testing.TB, opts ...interceptor.ClientOption) *interceptor.Client {
	t.Helper()
	c, err := interceptor.NewClient(opts...)
	if err != nil {
		t.Fatalf("interceptor.NewClient: %v", err)
	}
	checkNothingHeld(t, c)
	return c
}

// quantile returns the q-quantile of lat (the ⌈q·n⌉-th smallest).
func quantile(lat []time.Duration, q float64) time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[int(math.Ceil(q*float64(len(s))))-1]
}

const echoMethod = "/resilience.echo.v1.EchoService/Echo"

// failFirst fails the first n attempts of every method with code.
func failFirst(n int, code codes.Code) testserver.Script {
	return func(a testserver.Attempt) testserver.Outcome {
		if a.N <= n {
			return testserver.Outcome{Err: status.Errorf(code, "attempt %d fails", a.N)}
		}
		return testserver.Outcome{}
	}
}

func fastPolicy(maxAttempts int) *serviceconfig.RetryPolicy {
	return &serviceconfig.RetryPolicy{
		MaxAttempts:       maxAttempts,
		InitialBackoff:    10 * time.Millisecond,
		MaxBackoff:        100 * time.Millisecond,
		BackoffMultiplier: 2,
	}
}

// recovered runs f and returns what it panicked with, or nil: the caller
// above the interceptor that recovers.
func recovered(f func()) (p any) {
	defer func() { p = recover() }()
	f()
	return nil
}

// The metric readers of both packages' tests (see testserver.Collect).
type collected = testserver.Collected

func newMeterReader() (*sdkmetric.ManualReader, *sdkmetric.MeterProvider) {
	return testserver.NewMeterReader()
}

func collect(t *testing.T, r *sdkmetric.ManualReader) collected { return testserver.Collect(t, r) }
