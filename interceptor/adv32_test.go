package interceptor

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Adversarial review of issue 32 (adv32).

// ForceOpen made the method's row (or found it, idle, its reference bit
// cleared by its key's hand) and then forced its breaker with no lock held;
// meanwhile a call of another name of the same full key could let that row
// go to make room (T6b: it was idle, a closed breaker with nothing counted),
// and ForceOpen forced a breaker no call would use again: it returned nil
// and the method's next call made a new row, closed, and went through. Now
// an operator's control that finds its row let go meanwhile acts again on
// the method's row: a nil return means the method's calls are refused.
func TestForceOpenIsNeverLostToAnEvictionOfItsRow(t *testing.T) {
	c := newTestClient(t, WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: "shop.Orders"}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 3, OpenDuration: time.Hour},
	}), WithRetryBudget(nil))
	c.table.bound = 2
	cc := anyMethodServer(t, c.DialOptions()...)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var n atomic.Int64
	for range 3 { // a proxy forwarding ever new names of the service
		wg.Go(func() {
			for ctx.Err() == nil {
				m := fmt.Sprintf("/shop.Orders/Flood%d", n.Add(1))
				_ = cc.Invoke(ctx, m, &echov1.EchoRequest{}, &echov1.EchoResponse{})
			}
		})
	}
	lost := 0
	for i := 0; ctx.Err() == nil && lost == 0; i++ {
		m := fmt.Sprintf("/shop.Orders/Forced%d", i)
		if err := c.ForceOpen(m); err != nil {
			continue // no room: said so
		}
		if s := c.Status(m); s.Breaker == nil || s.Breaker.State != BreakerForcedOpen {
			lost++
			t.Errorf("ForceOpen(%s) = nil, then its breaker is %+v", m, s.Breaker)
		}
		// Let it go: a forced row is live, and would hold its room for ever.
		_ = c.ResetBreaker(m)
	}
	cancel()
	wg.Wait()
}

// A hedged copy that panicked below the interceptor (or called
// runtime.Goexit) settled its guards as errCopyAborted, a CANCELLED of
// its own, which adaptive throttling read as the backend's acceptance (the
// caller's context was live): every panicking copy pulled the rejection
// probability down, where a plain call's panic (abandon) counts nothing.
// The backend said nothing: in both paths, nothing is counted.
func TestAPanicBelowAHedgedCopyIsNoAnswerToAdaptiveThrottling(t *testing.T) {
	for _, hedged := range []bool{false, true} {
		t.Run(fmt.Sprint("hedged=", hedged), func(t *testing.T) {
			srv := &testserver.Server{}
			boom := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				panic("boom below")
			}
			mc := serviceconfig.MethodConfig{
				Name:           []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
				CircuitBreaker: &serviceconfig.CircuitBreaker{Mode: serviceconfig.ModeAdaptive},
			}
			if hedged {
				mc.HedgingPolicy = &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: time.Hour}
			}
			stub, c := newEchoBelow(t, srv, []grpc.UnaryClientInterceptor{boom}, WithMethodConfig(mc))
			for range 5 {
				func() {
					defer func() { _ = recover() }()
					_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{})
				}()
			}
			if a := c.Status(echoMethod).Adaptive; a == nil || a.Accepts != 0 || a.Requests != 0 {
				t.Errorf("after 5 calls that panicked below: adaptive %+v, want nothing counted", a)
			}
		})
	}
}

// A unary call that its own ClientConn's Close ended (grpc's CANCELLED
// "the client connection is closing": the caller's context live, nothing
// from the backend) was read by adaptive throttling as the backend's
// acceptance, where a stream's attempt ended the same way (errEndedHere)
// and a hedged copy's panic count nothing: a client shared by connections
// that a pool recycles during an outage pulled its rejection probability
// down with every call in flight on the closed one. A CANCELLED is no
// answer of the backend's.
func TestCallsEndedByTheirConnectionsCloseAreNoAnswerToAdaptiveThrottling(t *testing.T) {
	const calls = 8
	arrived := make(chan struct{}, calls)
	srv := &testserver.Server{}
	srv.SetScript(func(testserver.Attempt) testserver.Outcome {
		arrived <- struct{}{}
		return testserver.Outcome{Delay: time.Hour}
	})
	c := newTestClient(t, WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{Mode: serviceconfig.ModeAdaptive},
	}))
	cc := testserver.Start(t, srv, c.DialOptions()...)
	stub := echov1.NewEchoServiceClient(cc)
	errs := make(chan error, calls)
	for range calls {
		go func() {
			_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
			errs <- err
		}()
	}
	for range calls { // every call is at the server
		<-arrived
	}
	_ = cc.Close()
	for range calls {
		if err := <-errs; status.Code(err) != codes.Canceled {
			t.Errorf("a call ended by Close = %v, want CANCELLED", err)
		}
	}
	if a := c.Status(echoMethod).Adaptive; a == nil || a.Accepts != 0 || a.Requests != 0 {
		t.Errorf("after %d calls ended by their connection's Close: adaptive %+v, want nothing counted", calls, a)
	}
}

// Held (adv32): a WithOnRetry or WithOnStop hook that panics while copies
// of a hedged call are at the server: the panic reaches the caller, the
// copies are cancelled and give their bulkhead slots and breaker tokens
// back (newTestClient's check), and no copy's goroutine is left (goleak).
func TestAPanickingHookOfAHedgedCallLeavesNothingHeld(t *testing.T) {
	for _, hook := range []string{"OnRetry", "OnStop"} {
		t.Run(hook, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
					if a.N == 3 {
						return testserver.Outcome{Err: status.Error(codes.Internal, "fatal")}
					}
					return testserver.Outcome{Delay: time.Hour}
				})
				boom := func() { panic("boom in " + hook) }
				opt := WithOnRetry(func(context.Context, RetryEvent) {
					if hook == "OnRetry" {
						boom()
					}
				})
				if hook == "OnStop" {
					opt = WithOnStop(func(context.Context, StopEvent) { boom() })
				}
				stub, c := newEcho(t, srv, opt, guardedHedging(
					serviceconfig.HedgingPolicy{MaxAttempts: 3, HedgingDelay: 10 * time.Millisecond},
					&serviceconfig.CircuitBreaker{ConsecutiveFailures: 5, OpenDuration: time.Minute, HalfOpenProbes: 1},
					&serviceconfig.Bulkhead{MaxConcurrent: 3}))
				recovered := func() (r any) {
					defer func() { r = recover() }()
					_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{})
					return nil
				}()
				if fmt.Sprint(recovered) != "boom in "+hook {
					t.Errorf("the caller recovered %v, want the hook's panic", recovered)
				}
				synctest.Wait()
				if held := heldGuards(c); held != "" {
					t.Errorf("after the hook's panic: %s", held)
				}
			})
		})
	}
}

// Status and HedgingDelay of a method with state and no row (peek) built
// its state for the reading alone, but named the method in the metrics on
// the way (attach, as for a pinned method): with metrics on, every distinct
// name a caller asked about (an admin page's input, a proxy asking for the
// delay of each method it forwards) stayed in the metrics' names until the
// next config update: 1,000 names kept 1,000 attribute sets. Names
// hold only the config's exact names and the methods stubs called.
func TestStatusOfCallerChosenNamesNamesNothingInTheMetrics(t *testing.T) {
	_, mp := testserver.NewMeterReader()
	c := newTestClient(t, WithMeterProvider(mp), WithServiceConfig(mustParse(t, `{"methodConfig": [
		{"name": [{}], "circuitBreaker": {"consecutiveFailures": 3},
		 "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.05s"}}]}`)))
	for i := range 1000 {
		m := callerNamed(i)
		_ = c.Status(m)
		_, _ = c.HedgingDelay(m)
	}
	n := 0
	c.metrics.names.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Errorf("after Status and HedgingDelay of 1,000 names: %d names kept by the metrics, want 0", n)
	}
}
