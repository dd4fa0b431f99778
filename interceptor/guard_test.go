package interceptor

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

const echoService = "resilience.echo.v1.EchoService"

// breakerConfig gives every method of the echo service its own breaker
// (5 consecutive failures, open 1s) and a retry policy of 3 attempts.
func breakerConfig(extra ...serviceconfig.MethodConfig) ClientOption {
	return WithMethodConfig(append([]serviceconfig.MethodConfig{{
		Name:           []serviceconfig.Name{{Service: echoService}},
		RetryPolicy:    fastPolicy(3),
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5, OpenDuration: time.Second},
	}}, extra...)...)
}

// sickEcho fails Echo with UNAVAILABLE while sick is set; Lookup always works.
func sickEcho(sick *atomic.Bool) testserver.Script {
	return func(a testserver.Attempt) testserver.Outcome {
		if sick.Load() && a.Method == echoMethod {
			return testserver.Outcome{Err: status.Error(codes.Unavailable, "sick")}
		}
		return testserver.Outcome{}
	}
}

func TestBreakerTripsPerMethodAndClosesAfterHealing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sick atomic.Bool
		sick.Store(true)
		srv := &testserver.Server{}
		srv.SetScript(sickEcho(&sick))
		var changes []string
		var mu sync.Mutex
		stub, c := newEcho(t, srv, breakerConfig(), WithOnStateChange(func(m string, from, to BreakerState) {
			mu.Lock()
			defer mu.Unlock()
			changes = append(changes, from.String()+">"+to.String())
		}))
		ctx := t.Context()

		// Call 1: 3 failed attempts. Call 2: 2 more trip the breaker, and its
		// third attempt is rejected at once.
		_, _ = stub.Echo(ctx, &echov1.EchoRequest{})
		_, err := stub.Echo(ctx, &echov1.EchoRequest{})
		if got := srv.Count("Echo"); got != 5 {
			t.Fatalf("server saw %d Echo attempts, want 5 before the breaker opened", got)
		}
		var re *RetryError
		if !errors.Is(err, ErrCircuitOpen) || !errors.As(err, &re) || re.Reason != StopCircuitOpen || re.Attempts != 2 {
			t.Fatalf("second Echo() error = %#v, want ErrCircuitOpen after 2 attempts", err)
		}
		if status.Code(err) != codes.Unavailable {
			t.Errorf("status.Code(rejection) = %v, want Unavailable", status.Code(err))
		}
		if status.Code(re.LastAttemptErr) != codes.Unavailable {
			t.Errorf("LastAttemptErr = %v, want the server's UNAVAILABLE", re.LastAttemptErr)
		}

		// Open: Echo fails fast without reaching the server, with a RetryInfo
		// hint of the time until the next probe; Lookup works.
		start := time.Now()
		_, err = stub.Echo(ctx, &echov1.EchoRequest{})
		if !errors.Is(err, ErrCircuitOpen) || time.Since(start) != 0 || srv.Count("Echo") != 5 {
			t.Fatalf("Echo() while open = %v after %v, server saw %d; want a fast ErrCircuitOpen", err, time.Since(start), srv.Count("Echo"))
		}
		var hint time.Duration
		for _, d := range status.Convert(err).Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				hint = ri.GetRetryDelay().AsDuration()
			}
		}
		// The breaker opened one backoff (under 24ms) before this call; the
		// hint is the time until the next probe, rounded up to 10ms.
		left := time.Until(c.Status(echoMethod).Breaker.OpenUntil)
		if want := (left + retryAfterGranule - 1) / retryAfterGranule * retryAfterGranule; hint != want || hint <= 970*time.Millisecond {
			t.Errorf("RetryInfo hint = %v, want the %v until the next probe rounded up to 10ms", hint, left)
		}
		if _, err := stub.Lookup(ctx, &echov1.LookupRequest{}); err != nil {
			t.Errorf("Lookup() error = %v: a healthy method must keep working", err)
		}
		if st := c.Status(lookupMethod).Breaker; st == nil || st.State != BreakerClosed {
			t.Errorf("Lookup breaker = %+v, want closed", st)
		}

		// Heal: within one open period plus one probe the breaker closes.
		sick.Store(false)
		time.Sleep(time.Second) // fake time: one open period
		if _, err := stub.Echo(ctx, &echov1.EchoRequest{}); err != nil {
			t.Fatalf("Echo() probe after healing = %v, want success", err)
		}
		if st := c.Status(echoMethod).Breaker; st.State != BreakerClosed || st.Trips != 1 {
			t.Errorf("Echo breaker = %+v, want closed after one trip", st)
		}
		mu.Lock()
		defer mu.Unlock()
		if want := "closed>open open>half-open half-open>closed"; joinStrings(changes) != want {
			t.Errorf("state changes = %q, want %q", joinStrings(changes), want)
		}
	})
}

func joinStrings(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out
}

func TestBreakerIgnoresClientErrorsAndCancellation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.Messages[0] == "slow" {
				return testserver.Outcome{Delay: time.Hour}
			}
			return testserver.Outcome{Err: status.Error(codes.InvalidArgument, "bad request")}
		})
		stub, c := newEcho(t, srv, breakerConfig())
		for range 10 {
			_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{Message: "bad"})
		}
		for range 10 {
			ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
			_, _ = stub.Echo(ctx, &echov1.EchoRequest{Message: "slow"})
			cancel()
		}
		st := c.Status(echoMethod).Breaker
		if st.State != BreakerClosed || st.Failures != 0 || st.ConsecutiveFailures != 0 {
			t.Errorf("breaker after client errors and caller deadlines = %+v, want closed with no failures", st)
		}
	})
}

func TestFallbackAnswersRejectedCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		stub, c := newEcho(t, srv, breakerConfig(), WithFallback(func(_ context.Context, m string, _, reply any, rej error) error {
			if !errors.Is(rej, ErrCircuitOpen) {
				return rej
			}
			reply.(*echov1.EchoResponse).Message = "cached"
			return nil
		}, echoMethod))
		if err := c.ForceOpen(echoMethod); err != nil {
			t.Fatal(err)
		}
		resp, err := stub.Echo(t.Context(), &echov1.EchoRequest{Message: "live"})
		if err != nil || resp.GetMessage() != "cached" {
			t.Fatalf("Echo() = %v, %v, want the fallback's cached, nil", resp, err)
		}
		if srv.Count("Echo") != 0 {
			t.Error("a forced-open breaker let a call through")
		}
		if err := c.ResetBreaker(echoMethod); err != nil {
			t.Fatal(err)
		}
		if resp, err := stub.Echo(t.Context(), &echov1.EchoRequest{Message: "live"}); err != nil || resp.GetMessage() != "live" {
			t.Fatalf("Echo() after reset = %v, %v, want live", resp, err)
		}
	})
}

func TestManualControlNeedsABreaker(t *testing.T) {
	c := newTestClient(t)
	if err := c.ForceOpen(echoMethod); err == nil {
		t.Error("ForceOpen on a method without a breaker succeeded, want an error")
	}
}

func TestHealthAndReflectionAreExemptByDefault(t *testing.T) {
	cfg := serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{},
		Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 1},
	}
	c := newTestClient(t, WithMethodConfig(cfg))
	for _, m := range []string{"/grpc.health.v1.Health/Check", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"} {
		if st := c.Status(m); st.Breaker != nil || st.Bulkhead != nil {
			t.Errorf("Status(%s) = %+v, want no guards", m, st)
		}
	}
	if st := c.Status(echoMethod); st.Breaker == nil || st.Bulkhead == nil {
		t.Errorf("Status(%s) = %+v, want a breaker and a bulkhead", echoMethod, st)
	}
	c = newTestClient(t, WithMethodConfig(cfg), WithExemptMethods(echoService))
	if st := c.Status("/grpc.health.v1.Health/Check"); st.Breaker == nil {
		t.Error("WithExemptMethods did not replace the default exemptions")
	}
	if st := c.Status(echoMethod); st.Breaker != nil {
		t.Error("WithExemptMethods(service) left the service guarded")
	}
}

func TestBulkheadIsolatesASlowMethod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.Method == echoMethod {
				return testserver.Outcome{Delay: 10 * time.Second}
			}
			return testserver.Outcome{}
		})
		stub, c := newEcho(t, srv, WithMethodConfig(serviceconfig.MethodConfig{
			Name:     []serviceconfig.Name{{Service: echoService}},
			Bulkhead: &serviceconfig.Bulkhead{MaxConcurrent: 4, MaxQueue: 2, MaxQueueWait: 100 * time.Millisecond},
		}))
		// Saturate Echo: 4 in flight, 2 queued.
		var wg sync.WaitGroup
		for range 6 {
			wg.Go(func() { _, _ = stub.Echo(t.Context(), &echov1.EchoRequest{}) })
		}
		synctest.Wait()
		if st := c.Status(echoMethod).Bulkhead; st.InFlight != 4 || st.Queued != 2 {
			t.Fatalf("Echo bulkhead = %+v, want 4 in flight and 2 queued", st)
		}
		// A seventh Echo is rejected at once; Lookup is not delayed at all.
		start := time.Now()
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
		if !errors.Is(err, ErrBulkheadFull) || status.Code(err) != codes.ResourceExhausted || time.Since(start) != 0 {
			t.Errorf("seventh Echo() = %v after %v, want an immediate ErrBulkheadFull (RESOURCE_EXHAUSTED)", err, time.Since(start))
		}
		start = time.Now()
		if _, err := stub.Lookup(t.Context(), &echov1.LookupRequest{}); err != nil || time.Since(start) != 0 {
			t.Errorf("Lookup() = %v after %v, want success without delay", err, time.Since(start))
		}
		wg.Wait()
		// The queued two waited 100ms at most, then were rejected.
		if got := srv.Count("Echo"); got != 4 {
			t.Errorf("server saw %d Echo attempts, want 4", got)
		}
	})
}

func TestBulkheadRejectionIsNotRetriedAndBackoffHoldsNoSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.N == 1 {
				return testserver.Outcome{Err: status.Error(codes.Unavailable, "x")}
			}
			return testserver.Outcome{Delay: time.Second}
		})
		p := fastPolicy(3)
		p.InitialBackoff, p.MaxBackoff, p.Jitter = time.Second, time.Second, serviceconfig.JitterNone
		stub, c := newEcho(t, srv, WithMethodConfig(serviceconfig.MethodConfig{
			Name:        []serviceconfig.Name{{Service: echoService}},
			RetryPolicy: p,
			Bulkhead:    &serviceconfig.Bulkhead{MaxConcurrent: 1},
		}))
		done := make(chan error, 1)
		go func() {
			_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
			done <- err
		}()
		time.Sleep(500 * time.Millisecond) // the first call is in its backoff
		if st := c.Status(echoMethod).Bulkhead; st.InFlight != 0 {
			t.Errorf("in flight during a backoff = %d, want 0", st.InFlight)
		}
		time.Sleep(time.Second) // its retry now holds the only slot
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
		var re *RetryError
		if !errors.Is(err, ErrBulkheadFull) || !errors.As(err, &re) || re.Attempts != 0 || re.Reason != StopBulkheadFull {
			t.Errorf("Echo() against a full bulkhead = %#v, want ErrBulkheadFull with 0 attempts", err)
		}
		if err := <-done; err != nil {
			t.Errorf("first Echo() = %v, want success on its retry", err)
		}
	})
}

func TestConfigUpdateKeepsUnchangedBreakers(t *testing.T) {
	cb := &serviceconfig.CircuitBreaker{ConsecutiveFailures: 3}
	cfg := &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
		Name: []serviceconfig.Name{{Service: echoService}}, CircuitBreaker: cb,
	}}}
	c := newTestClient(t, WithServiceConfig(cfg))
	if err := c.ForceOpen(echoMethod); err != nil {
		t.Fatal(err)
	}
	same := &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
		Name: []serviceconfig.Name{{Service: echoService}}, Timeout: time.Second,
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 3},
	}}}
	if err := c.UpdateServiceConfig(same); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(echoMethod).Breaker; st.State != BreakerForcedOpen {
		t.Errorf("breaker after an update with the same block = %v, want forced-open kept", st.State)
	}
	changed := &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
		Name: []serviceconfig.Name{{Service: echoService}}, CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 4},
	}}}
	if err := c.UpdateServiceConfig(changed); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(echoMethod).Breaker; st.State != BreakerForcedOpen {
		t.Errorf("breaker after an update with a new block = %v, want a new breaker that kept the forced state", st.State)
	}
}

// TestGuardsUnderConcurrentStress runs many goroutines with mixed outcomes
// through a breaker and a bulkhead and checks the bulkhead bound held.
func TestGuardsUnderConcurrentStress(t *testing.T) {
	srv := &testserver.Server{}
	var inflight, peak atomic.Int64
	srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		switch a.N % 4 {
		case 0:
			return testserver.Outcome{Err: status.Error(codes.Unavailable, "x")}
		case 1:
			return testserver.Outcome{Err: status.Error(codes.NotFound, "x")}
		}
		return testserver.Outcome{}
	})
	stub, c := newEcho(t, srv, WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: echoService}},
		RetryPolicy:    &serviceconfig.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Microsecond, MaxBackoff: time.Microsecond},
		CircuitBreaker: &serviceconfig.CircuitBreaker{FailureRateThreshold: 0.9, MinimumCalls: 50, OpenDuration: time.Millisecond},
		Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 8, MaxQueue: 16, MaxQueueWait: 50 * time.Millisecond},
	}))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := range 40 {
				if g%2 == 0 {
					_, _ = stub.Echo(ctx, &echov1.EchoRequest{})
				} else {
					cctx, ccancel := context.WithCancel(ctx)
					if i%5 == 0 {
						ccancel()
					}
					_, _ = stub.Echo(cctx, &echov1.EchoRequest{})
					ccancel()
				}
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatal("stress test did not finish in time")
	}
	if p := peak.Load(); p > 8 {
		t.Errorf("peak attempts in the handler = %d, want at most the bulkhead's 8", p)
	}
	if st := c.Status(echoMethod).Bulkhead; st.InFlight != 0 || st.Queued != 0 {
		t.Errorf("bulkhead after the run = %+v, want empty", st)
	}
}

// TestConfigUpdatesCarryStateWithoutCallsInBetween pins that a method's
// breaker and bulkhead carry over however many updates come with no call in
// between: after ForceOpen and two identical updates, the breaker was a new,
// closed one, and a call in flight held a slot of a bulkhead no longer used.
// A block that changed in between starts afresh, even when a later update
// changes it back.
func TestConfigUpdatesCarryStateWithoutCallsInBetween(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		block := func(failures int) *serviceconfig.Config {
			return &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
				Name:           []serviceconfig.Name{{Service: echoService}},
				CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: failures},
				Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 2},
			}}}
		}
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: time.Second} })
		stub, c := newEcho(t, srv, WithServiceConfig(block(3)))
		if err := c.ForceOpen(echoMethod); err != nil {
			t.Fatal(err)
		}
		if err := c.ResetBreaker(echoMethod); err != nil {
			t.Fatal(err)
		}
		done := make(chan error)
		go func() {
			_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
			done <- err
		}()
		synctest.Wait() // the call holds a slot
		if err := c.ForceOpen(echoMethod); err != nil {
			t.Fatal(err)
		}
		for range 3 { // no call, and no Status, in between
			if err := c.UpdateServiceConfig(block(3)); err != nil {
				t.Fatal(err)
			}
		}
		if st := c.Status(echoMethod); st.Breaker.State != BreakerForcedOpen || st.Bulkhead.InFlight != 1 {
			t.Fatalf("after 3 identical updates: breaker %v, bulkhead in flight %d; want forced-open and 1 kept",
				st.Breaker.State, st.Bulkhead.InFlight)
		}
		if err := <-done; err != nil {
			t.Fatalf("Echo() in flight across the updates = %v", err)
		}
		if st := c.Status(echoMethod).Bulkhead; st.InFlight != 0 {
			t.Errorf("bulkhead in flight %d after the call ended, want its slot back in the carried bulkhead", st.InFlight)
		}

		// A change and a change back, with no call in between: the
		// breaker, reconfigured in place, keeps the forced state
		// (breaker.Reconfigure).
		if err := c.UpdateServiceConfig(block(4)); err != nil {
			t.Fatal(err)
		}
		if err := c.UpdateServiceConfig(block(3)); err != nil {
			t.Fatal(err)
		}
		if st := c.Status(echoMethod).Breaker; st.State != BreakerForcedOpen {
			t.Errorf("breaker after a change and a change back = %v, want forced-open kept", st.State)
		}
	})
}
