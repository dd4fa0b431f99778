package interceptor

import (
	"context"
	"io"
	"math"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/internal/breaker"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// A user's hook that panics, or calls runtime.Goexit, inside a call (an
// adversarial review of the OnRetry fix, 1faf708): the panic goes on to
// the caller, and whatever the call took for an attempt it will now never
// send goes back: the breaker's probe, the slot of the method's pace, the
// retry budget's token.

// hookAbort is how a hook ends the call it runs in.
type hookAbort string

const (
	hookPanics hookAbort = "panic"
	hookExits  hookAbort = "Goexit"
)

var hookAborts = []hookAbort{hookPanics, hookExits}

// do ends the hook's goroutine's call as h says.
func (h hookAbort) do() {
	if h == hookExits {
		runtime.Goexit()
	}
	panic("a hook's bug")
}

// endedBy runs call on a goroutine of its own, as a caller whose hook
// aborts would, and returns how it ended: "returned", "panic" or "Goexit".
func endedBy(call func()) string {
	how := make(chan string, 1)
	go func() {
		returned := false
		defer func() {
			switch {
			case returned:
				how <- "returned"
			case recover() != nil:
				how <- string(hookPanics)
			default:
				how <- string(hookExits)
			}
		}()
		call()
		returned = true
	}()
	return <-how
}

// callOf returns a call of stub's Echo, or of its ServerStream read to
// its end (stream), for the tests below.
func callOf(t *testing.T, stub echov1.EchoServiceClient, stream bool) func() error {
	return func() error {
		if !stream {
			_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
			return err
		}
		s, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Count: 1})
		if err != nil {
			return err
		}
		for {
			if _, err := s.Recv(); err == io.EOF {
				return nil
			} else if err != nil {
				return err
			}
		}
	}
}

// halfOpenHook is a WithOnStateChange hook that aborts as h says when a
// breaker turns half-open: in the Allow of the call that turns it, which
// takes the first probe.
func halfOpenHook(h hookAbort) ClientOption {
	return WithOnStateChange(func(_ string, _, to BreakerState) {
		if to == BreakerHalfOpen {
			h.do()
		}
	})
}

// TestABreakerHookThatPanicsAsItTurnsHalfOpenTakesNoProbe pins that the
// call whose admission turns an open breaker half-open, and whose
// WithOnStateChange hook panics (or calls runtime.Goexit) on that report,
// leaves the probe it took free: the panic goes on to the caller, and the
// method's next call is the probe. The breaker took the probe before it
// reported the change, and the hook's panic left its caller without the
// token: the probe stayed out for a whole open period, the method refused
// every call meanwhile ("circuit breaker open"), and newTestClient's
// check found it held. Unary, stream and hedged calls alike.
func TestABreakerHookThatPanicsAsItTurnsHalfOpenTakesNoProbe(t *testing.T) {
	for _, how := range hookAborts {
		for _, kind := range []string{"unary", "stream", "hedged"} {
			t.Run(string(how)+"/"+kind, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					srv := &testserver.Server{}
					srv.SetScript(failFirst(1, codes.Unavailable))
					mc := serviceconfig.MethodConfig{
						Name:           []serviceconfig.Name{{Service: echoService, Method: "Echo"}, {Service: echoService, Method: "ServerStream"}},
						CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 1, OpenDuration: 100 * time.Millisecond, HalfOpenProbes: 1},
					}
					if kind == "hedged" {
						mc.Name = mc.Name[:1]
						mc.HedgingPolicy = &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: time.Hour}
					}
					stub, c := newEcho(t, srv, WithMethodConfig(mc), WithRetryBudget(nil), halfOpenHook(how))
					call := callOf(t, stub, kind == "stream")
					if err := call(); status.Code(err) != codes.Unavailable {
						t.Fatalf("the call that opens the breaker: %v, want UNAVAILABLE", err)
					}
					time.Sleep(150 * time.Millisecond) // past the open time
					if got := endedBy(func() { _ = call() }); got != string(how) {
						t.Fatalf("the call whose hook aborts ended by %s, want %s", got, how)
					}
					synctest.Wait()
					if held := heldGuards(c); held != "" {
						t.Errorf("after the hook's %s: %s", how, held)
					}
					if err := call(); err != nil {
						t.Errorf("the next call: %v, want the probe, answered", err)
					}
				})
			})
		}
	}
}

// TestAnAttemptWhoseBreakerHookPanicsGivesItsPaceSlotBack pins that an
// attempt whose admission runs a panicking WithOnStateChange hook (its
// breaker turning half-open) gives back the slot of the method's pace it
// held: a retry's, taken when it decided to wait for the server's
// pushback, or the one a first attempt took at the gate. The attempt is
// never sent. The slot stayed taken: the method's next attempt waited a
// whole pushback period (100ms) for it.
func TestAnAttemptWhoseBreakerHookPanicsGivesItsPaceSlotBack(t *testing.T) {
	refused := status.Error(codes.ResourceExhausted, "over quota")
	pushback := metadata.Pairs(pushbackKey, "100")
	for _, how := range hookAborts {
		for _, tc := range []struct {
			name   string
			stream bool
			retry  bool // the aborted attempt is a retry; else a first attempt of a second call
			hedged bool
		}{
			{name: "retry", retry: true},
			{name: "stream retry", stream: true, retry: true},
			{name: "first attempt"},
			{name: "hedged first copy", hedged: true},
		} {
			t.Run(string(how)+"/"+tc.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					srv := &testserver.Server{}
					srv.SetScript(func(testserver.Attempt) testserver.Outcome {
						return testserver.Outcome{Err: refused, Trailer: pushback}
					})
					method := echoMethod
					name := serviceconfig.Name{Service: echoService, Method: "Echo"}
					if tc.stream {
						method, name.Method = "/"+echoService+"/ServerStream", "ServerStream"
					}
					mc := serviceconfig.MethodConfig{
						Name: []serviceconfig.Name{name},
						// The pushback opens the breaker for 50ms: the
						// attempt that follows turns it half-open.
						CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 1, OpenDuration: 50 * time.Millisecond, HalfOpenProbes: 1},
						RateLimit:      &serviceconfig.ClientRateLimit{},
					}
					if tc.retry {
						mc.RetryPolicy = &serviceconfig.RetryPolicy{MaxAttempts: 3,
							InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, BackoffMultiplier: 1,
							RetryableStatusCodes: []codes.Code{codes.ResourceExhausted}}
					}
					if tc.hedged {
						mc.HedgingPolicy = &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: time.Hour}
					}
					stub, c := newEcho(t, srv, WithMethodConfig(mc), WithRetryBudget(nil), halfOpenHook(how))
					call := callOf(t, stub, tc.stream)
					if !tc.retry {
						if err := call(); status.Code(err) != codes.ResourceExhausted {
							t.Fatalf("the first call: %v, want RESOURCE_EXHAUSTED", err)
						}
						time.Sleep(100 * time.Millisecond) // to its slot of the pace
					}
					if got := endedBy(func() { _ = call() }); got != string(how) {
						t.Fatalf("the call whose hook aborts ended by %s, want %s", got, how)
					}
					if n := srv.Count(""); n != 1 {
						t.Fatalf("the server saw %d attempts, want 1: the aborted one is never sent", n)
					}
					// The aborted attempt's slot was due now: given back,
					// the next free slot is now.
					next, period := policyOf(c, method).g.rate.pace.Snapshot()
					if in := next.Sub(time.Now()); period != 100*time.Millisecond || in != 0 {
						t.Errorf("pace: next free slot in %v (period %v), want now: the unsent attempt's slot given back", in, period)
					}
				})
			})
		}
	}
}

// TestAnUnsentRetryWhoseHookPanicsGivesItsBudgetTokenBack pins that a
// retry the call decided on, and took from the retry budget for, gives its
// token back when a hook panics (or calls runtime.Goexit) before it is
// sent: the OnRetry hook of a unary call or a stream, or, for a hedged
// copy, the WithOnStateChange hook as its admission turns the breaker
// half-open. A unary call's and a hedged copy's token stayed spent: every
// such panic cost the client a retry for the budget's window, as a retry
// the server failed does. (A stream's went back already: its end settles
// its retries.)
func TestAnUnsentRetryWhoseHookPanicsGivesItsBudgetTokenBack(t *testing.T) {
	const ratio = 0.5
	for _, how := range hookAborts {
		for _, kind := range []string{"unary", "stream", "hedged"} {
			t.Run(string(how)+"/"+kind, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					srv := &testserver.Server{}
					mc := serviceconfig.MethodConfig{
						Name: []serviceconfig.Name{{Service: echoService}},
					}
					hook := WithOnRetry(func(context.Context, RetryEvent) { how.do() })
					calls := 1.0
					if kind == "hedged" {
						// The hedged call's first copy waits at the server
						// for an hour; the next call of the method fails,
						// which opens the breaker for 50ms; the hedged
						// call's timed copy, 100ms after its first, turns
						// it half-open as it is admitted.
						srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
							if a.N == 1 {
								return testserver.Outcome{Delay: time.Hour}
							}
							return testserver.Outcome{Err: status.Error(codes.Unavailable, "down")}
						})
						mc.HedgingPolicy = &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 100 * time.Millisecond}
						mc.CircuitBreaker = &serviceconfig.CircuitBreaker{ConsecutiveFailures: 1, OpenDuration: 50 * time.Millisecond, HalfOpenProbes: 1}
						hook = halfOpenHook(how)
						calls = 2
					} else {
						srv.SetScript(failFirst(1, codes.Unavailable))
						mc.RetryPolicy = fastPolicy(3)
					}
					stub, c := newEcho(t, srv, WithMethodConfig(mc), hook,
						WithRetryBudget(&serviceconfig.RetryBudget{Ratio: ratio, MinRetriesPerSecond: 1, TTL: 10 * time.Second}))
					call := callOf(t, stub, kind == "stream")
					before := c.RetryStatus().Budget.Available
					aborted := make(chan string, 1)
					go func() { aborted <- endedBy(func() { _ = call() }) }()
					if kind == "hedged" {
						synctest.Wait() // the first copy is at the server
						if err := call(); status.Code(err) != codes.Unavailable {
							t.Fatalf("the call that opens the breaker: %v, want UNAVAILABLE", err)
						}
					}
					if got := <-aborted; got != string(how) {
						t.Fatalf("the call whose hook aborts ended by %s, want %s", got, how)
					}
					// Each call deposited its ratio; the retry never sent
					// cost nothing.
					want := before + calls*ratio
					if after := c.RetryStatus().Budget.Available; after != want {
						t.Errorf("retry budget: %v retries before, %v after, want %v: the deposits, and the unsent retry's token back", before, after, want)
					}
				})
			})
		}
	}
}

// TestAStreamHookPanicOffTheCallersGoroutineReachesItsNextCall pins where
// a hook's panic goes when it runs on no goroutine of the caller's: a
// stream attempt whose per-attempt timeout fires while the caller is in no
// call on the stream is released by the watch on its context, on a
// goroutine of its own, and the breaker's verdict on it (a failure that
// trips the breaker) runs the WithOnStateChange hook there. A panic there
// ended the process. It now reaches the stream's caller at its next call
// on the stream, which ends the stream, as a panic below the interceptor
// does; nothing stays held.
func TestAStreamHookPanicOffTheCallersGoroutineReachesItsNextCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: time.Hour} })
		stub, _ := newEcho(t, srv, WithRetryBudget(nil),
			WithOnStateChange(func(_ string, _, to BreakerState) {
				if to == BreakerOpen {
					panic("a hook's bug")
				}
			}),
			WithMethodConfig(serviceconfig.MethodConfig{
				Name:           []serviceconfig.Name{{Service: echoService, Method: "ServerStream"}},
				CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 1, OpenDuration: time.Second},
				RetryPolicy: &serviceconfig.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
					BackoffMultiplier: 1, PerAttemptRecvTimeout: 50 * time.Millisecond},
			}))
		s, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Count: 1})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // the attempt's timeout fires, no call at work on it
		synctest.Wait()
		recovered := func() (v any) {
			defer func() { v = recover() }()
			_, err := s.Recv()
			t.Errorf("Recv after the hook's panic returned %v, want the panic", err)
			return nil
		}()
		if recovered != "a hook's bug" {
			t.Errorf("the next call on the stream recovered %v, want the hook's panic", recovered)
		}
		if _, err := s.Recv(); status.Code(err) != codes.Canceled {
			t.Errorf("Recv once the panic ended the stream: %v, want CANCELLED", err)
		}
	})
}

// TestRateLimitStreamRetryWhoseOnRetryHookPanicsGivesItsSlotBack is
// TestRateLimitRetryWhoseOnRetryHookPanicsGivesItsSlotBack for a stream,
// whose driver calls the same OnRetry after its retry took its slot of the
// pace: the panic (or runtime.Goexit) ends the stream, and the slot goes
// back: the method's next free slot is one pushback period away, not two.
func TestRateLimitStreamRetryWhoseOnRetryHookPanicsGivesItsSlotBack(t *testing.T) {
	const method = "/" + echoService + "/ServerStream"
	for _, how := range hookAborts {
		t.Run(string(how), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(func(testserver.Attempt) testserver.Outcome {
					return testserver.Outcome{Err: status.Error(codes.ResourceExhausted, "over quota"), Trailer: metadata.Pairs(pushbackKey, "100")}
				})
				stub, c := newEcho(t, srv, WithRetryBudget(nil), WithOnRetry(func(context.Context, RetryEvent) { how.do() }),
					WithMethodConfig(serviceconfig.MethodConfig{
						Name:      []serviceconfig.Name{{Service: echoService, Method: "ServerStream"}},
						RateLimit: &serviceconfig.ClientRateLimit{},
						RetryPolicy: &serviceconfig.RetryPolicy{MaxAttempts: 3,
							InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, BackoffMultiplier: 1,
							RetryableStatusCodes: []codes.Code{codes.ResourceExhausted}},
					}))
				if got := endedBy(func() { _ = callOf(t, stub, true)() }); got != string(how) {
					t.Fatalf("the stream whose hook aborts ended by %s, want %s", got, how)
				}
				if n := srv.Count(""); n != 1 {
					t.Fatalf("the server saw %d attempts, want 1", n)
				}
				next, period := policyOf(c, method).g.rate.pace.Snapshot()
				if in := next.Sub(time.Now()); period != 100*time.Millisecond || in != period {
					t.Errorf("pace: next free slot in %v (period %v), want in one period: the unsent retry's slot given back", in, period)
				}
			})
		})
	}
}

// retriesPanicMeterProvider is a meter provider whose retries counter
// (metricRetries) aborts as how says: the user's meter implementation is
// user code, and runs on the call's goroutine after the OnRetry hook.
type retriesPanicMeterProvider struct {
	noop.MeterProvider
	how hookAbort
}

type retriesPanicMeter struct {
	noop.Meter
	how hookAbort
}

type retriesPanicCounter struct {
	noop.Int64Counter
	how hookAbort
}

func (p retriesPanicMeterProvider) Meter(string, ...metric.MeterOption) metric.Meter {
	return retriesPanicMeter{how: p.how}
}

func (m retriesPanicMeter) Int64Counter(name string, _ ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	if name == metricRetries {
		return retriesPanicCounter{how: m.how}, nil
	}
	return noop.Int64Counter{}, nil
}

func (c retriesPanicCounter) Add(context.Context, int64, ...metric.AddOption) { c.how.do() }

// TestAnUnsentRetryWhoseMeterPanicsGivesItsSlotAndBudgetTokenBack pins
// that a retry whose metrics abort (the user's meter provider panics, or
// calls runtime.Goexit, as the retry is counted, just after the OnRetry
// hook ran) gives back its slot of the pace and its retry budget
// token, as it does when the OnRetry hook aborts: the retry is never sent.
// Both stayed taken: the method's next attempt waited a whole pushback
// period more, and the budget was charged a retry.
func TestAnUnsentRetryWhoseMeterPanicsGivesItsSlotAndBudgetTokenBack(t *testing.T) {
	const ratio = 0.5
	for _, how := range hookAborts {
		t.Run(string(how), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := newQuotaServer(0)
				srv.next, srv.hint = srv.start.Add(time.Hour), 100*time.Millisecond
				stub, c := quotaEcho(t, srv, WithMeterProvider(retriesPanicMeterProvider{how: how}),
					WithRetryBudget(&serviceconfig.RetryBudget{Ratio: ratio, MinRetriesPerSecond: 1, TTL: 10 * time.Second}),
					rateConfig(&serviceconfig.ClientRateLimit{}, &serviceconfig.RetryPolicy{MaxAttempts: 3,
						InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, BackoffMultiplier: 1,
						RetryableStatusCodes: []codes.Code{codes.ResourceExhausted}}))
				before := c.RetryStatus().Budget.Available
				if got := endedBy(func() { _, _ = stub.Echo(t.Context(), &echov1.EchoRequest{}) }); got != string(how) {
					t.Fatalf("the call whose meter aborts ended by %s, want %s", got, how)
				}
				if _, refused := srv.counts(); len(refused) != 1 {
					t.Fatalf("the server saw %d attempts, want 1", len(refused))
				}
				next, period := policyOf(c, echoMethod).g.rate.pace.Snapshot()
				if in := next.Sub(time.Now()); period != 100*time.Millisecond || in != period {
					t.Errorf("pace: next free slot in %v (period %v), want in one period: the unsent retry's slot given back", in, period)
				}
				if after := c.RetryStatus().Budget.Available; after != before+ratio {
					t.Errorf("retry budget: %v retries before, %v after, want %v: the deposit, and the unsent retry's token back", before, after, before+ratio)
				}
			})
		})
	}
}

// TestASentRetryWhoseBreakerHookPanicsAsItClosesSettlesAsASuccess pins
// that a retry that was sent and succeeded, and whose success closes the
// half-open breaker it probed, is settled as a success when the
// WithOnStateChange hook panics (or calls runtime.Goexit) on that
// HalfOpen -> Closed report: its retry budget token goes back and gRFC A6
// throttling counts the success, and the panic goes on to the caller. The
// breaker frees its probe and the bulkhead its slot before the report; the
// call's accounts were settled after it, so the panic skipped them: the
// token stayed spent (the budget charged a retry the server answered) and
// the throttle missed the success. Unary calls and streams alike.
func TestASentRetryWhoseBreakerHookPanicsAsItClosesSettlesAsASuccess(t *testing.T) {
	const ratio = probeRatio
	for _, how := range hookAborts {
		for _, kind := range []string{"unary", "stream"} {
			t.Run(string(how)+"/"+kind, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					srv := &testserver.Server{}
					srv.SetScript(failFirst(1, codes.Unavailable))
					// The first attempt opens the breaker for 50ms; the
					// retry, 100ms later, is its half-open probe, and its
					// success closes it.
					c, before := probeAbortedByHook(t, srv, how, 2, kind == "stream", func(_, to BreakerState) bool { return to == BreakerClosed })
					// The call deposited its ratio; the retry, answered,
					// cost nothing.
					rs := c.RetryStatus()
					if after := rs.Budget.Available; after != before+ratio {
						t.Errorf("retry budget: %v retries before, %v after, want %v: the deposit, and the answered retry's token back", before, after, before+ratio)
					}
					// A6: 10, the failure -1, the success +0.1.
					if got := rs.Throttling.Tokens; math.Abs(got-9.1) > 1e-9 {
						t.Errorf("A6 throttling: %v tokens, want 9.1: the failure and the success counted", got)
					}
					method := echoMethod
					if kind == "stream" {
						method = "/" + echoService + "/ServerStream"
					}
					if s := policyOf(c, method).g.breaker.Snapshot(time.Now()); s.State != breaker.StateClosed {
						t.Errorf("breaker %v, want closed by the retry's success", s.State)
					}
				})
			})
		}
	}
}

// TestAHedgedCopyWhoseBreakerHookPanicsAsItClosesCountsItsSuccess is
// TestASentRetryWhoseBreakerHookPanicsAsItClosesSettlesAsASuccess for a
// hedged call: its copy's success closes the half-open breaker it probed,
// and the WithOnStateChange hook panics on that report, on the copy's
// goroutine; the panic goes on to the caller, and gRFC A6 throttling
// counts the call's success, which the panic skipped (9 tokens for 9.1).
// (A hedged copy that was sent keeps its budget token, won or lost: see
// hedgeCopy.settle.) A hook that calls runtime.Goexit there ends the
// copy's goroutine only: the call returns the copy's answer.
func TestAHedgedCopyWhoseBreakerHookPanicsAsItClosesCountsItsSuccess(t *testing.T) {
	for _, how := range hookAborts {
		t.Run(string(how), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(failFirst(1, codes.Unavailable))
				stub, c := newEcho(t, srv, WithRetryBudget(nil),
					WithOnStateChange(func(_ string, _, to BreakerState) {
						if to == BreakerClosed {
							how.do()
						}
					}),
					WithServiceConfig(&serviceconfig.Config{
						MethodConfig: []serviceconfig.MethodConfig{{
							Name: []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
							HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: time.Hour,
								NonFatalStatusCodes: []codes.Code{codes.Unavailable}},
							CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 1, OpenDuration: 50 * time.Millisecond, HalfOpenProbes: 1},
							Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 1},
						}},
						RetryThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 0.1},
					}))
				// The first call's copy fails (A6: 10 -> 9) and opens the
				// breaker; its second copy is refused.
				if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); status.Code(err) != codes.Unavailable {
					t.Fatalf("the call that opens the breaker: %v, want UNAVAILABLE", err)
				}
				time.Sleep(100 * time.Millisecond) // past the open time
				want := "returned"
				if how == hookPanics {
					want = string(hookPanics)
				}
				if got := endedBy(func() { _ = callOf(t, stub, false)() }); got != want {
					t.Fatalf("the call whose hook aborts on its copy's goroutine ended by %s, want %s", got, want)
				}
				synctest.Wait()
				if held := heldGuards(c); held != "" {
					t.Errorf("after the hook's %s: %s", how, held)
				}
				if got := c.RetryStatus().Throttling.Tokens; math.Abs(got-9.1) > 1e-9 {
					t.Errorf("A6 throttling: %v tokens, want 9.1: the failure and the success counted", got)
				}
				if s := policyOf(c, echoMethod).g.breaker.Snapshot(time.Now()); s.State != breaker.StateClosed {
					t.Errorf("breaker %v, want closed by the copy's success", s.State)
				}
			})
		})
	}
}

// TestAnUnsentRetryWhoseOnRetryHookPanicsIsNotCounted pins that
// resilience.client.retries, which counts retries sent, does not count a
// retry whose OnRetry hook panics (or calls runtime.Goexit): the call ends
// there and the retry is never sent. The retry was counted before the hook
// ran (1 for 0). The next call's retry, whose hook returns, is sent and
// counted. Unary calls and streams alike.
func TestAnUnsentRetryWhoseOnRetryHookPanicsIsNotCounted(t *testing.T) {
	for _, how := range hookAborts {
		for _, kind := range []string{"unary", "stream"} {
			t.Run(string(how)+"/"+kind, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					reader, mp := newMeterReader()
					srv := &testserver.Server{}
					srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
						if a.N <= 2 { // each call's first attempt: the first call sends no other
							return testserver.Outcome{Err: status.Error(codes.Unavailable, "down")}
						}
						return testserver.Outcome{}
					})
					var abort atomic.Bool
					abort.Store(true)
					stub, _ := newEcho(t, srv, WithMeterProvider(mp), WithRetryBudget(nil), WithRetryPolicy(fastPolicy(3)),
						WithOnRetry(func(context.Context, RetryEvent) {
							if abort.Load() {
								how.do()
							}
						}))
					call := callOf(t, stub, kind == "stream")
					retries := func() (n float64) {
						got := collect(t, reader)
						if _, ok := got[metricRetries]; !ok {
							return 0
						}
						_, pts := got.Points(t, metricRetries)
						for _, v := range pts {
							n += v
						}
						return n
					}
					if got := endedBy(func() { _ = call() }); got != string(how) {
						t.Fatalf("the call whose hook aborts ended by %s, want %s", got, how)
					}
					if n := srv.Count(""); n != 1 {
						t.Fatalf("the server saw %d attempts, want 1: the retry is never sent", n)
					}
					if n := retries(); n != 0 {
						t.Errorf("%s = %v after the aborted call, want 0: its retry was never sent", metricRetries, n)
					}
					abort.Store(false)
					if err := call(); err != nil {
						t.Fatalf("the next call: %v, want its retry's answer", err)
					}
					if n := retries(); n != 1 {
						t.Errorf("%s = %v after the next call, want 1: its retry, sent", metricRetries, n)
					}
				})
			})
		}
	}
}

// TestAQueuedHedgedCopyRefusedAsAHookPanicsRecordsItsProbeOnce pins that
// a hedged copy that waited in the bulkhead's queue holding a half-open
// probe, and whose refusal there runs a panicking WithOnStateChange hook,
// gives its probe back exactly once. The hook runs there because a change
// of state was left unreported: the hook of the call that tripped the
// breaker blocked (as one that calls out, to the client or elsewhere,
// would) while the breaker turned half-open, then panicked, and the
// Open -> HalfOpen report waited for the next record, the queued copy's.
// The copy's token was recorded by the queue and again as the copy's
// panic was settled, which freed a second probe for the one still out: 2
// probes taken, 3 given back, the breaker left with -1 probes out and one
// more probe than HalfOpenProbes admitted for the rest of the half-open
// period. The copy was never sent, so its retry budget token goes back too.
func TestAQueuedHedgedCopyRefusedAsAHookPanicsRecordsItsProbeOnce(t *testing.T) {
	const ratio = 0.5
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.N == 1 {
				return testserver.Outcome{Err: status.Error(codes.Unavailable, "down")}
			}
			return testserver.Outcome{Delay: time.Hour} // the hedged call's first copy, a probe
		})
		stub, c := newEcho(t, srv,
			WithRetryBudget(&serviceconfig.RetryBudget{Ratio: ratio, MinRetriesPerSecond: 1, TTL: 10 * time.Second}),
			WithOnStateChange(func(_ string, _, to BreakerState) {
				switch to {
				case BreakerOpen:
					time.Sleep(100 * time.Millisecond)
					panic("a hook's bug")
				case BreakerHalfOpen:
					panic("a hook's bug")
				}
			}),
			WithMethodConfig(serviceconfig.MethodConfig{
				Name:           []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
				CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 1, OpenDuration: 50 * time.Millisecond, HalfOpenProbes: 2},
				Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 1, MaxQueue: 1, MaxQueueWait: 100 * time.Millisecond},
				HedgingPolicy:  &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 10 * time.Millisecond},
			}))
		call := callOf(t, stub, false)
		// t=0: the first call fails and trips the breaker; its hook blocks
		// until t=100ms, then panics.
		tripped := make(chan string, 1)
		go func() { tripped <- endedBy(func() { _ = call() }) }()
		time.Sleep(60 * time.Millisecond) // past the open time
		before := c.RetryStatus().Budget.Available
		// t=60ms: the hedged call's first copy turns the breaker half-open
		// (its report waits for the blocked hook) and is sent; its second
		// copy, at 70ms, takes the second probe and queues for the
		// bulkhead's one slot until 170ms, when the queue refuses it.
		if got := endedBy(func() { _ = call() }); got != string(hookPanics) {
			t.Fatalf("the hedged call ended by %s, want the panic of the hook its queued copy ran", got)
		}
		if got := <-tripped; got != string(hookPanics) {
			t.Fatalf("the call that tripped the breaker ended by %s, want its hook's panic", got)
		}
		synctest.Wait()
		if held := heldGuards(c); held != "" {
			t.Errorf("after the hooks' panics: %s", held)
		}
		if s := policyOf(c, echoMethod).g.breaker.Snapshot(time.Now()); s.State != breaker.StateHalfOpen || s.Probes != 0 {
			t.Errorf("breaker %v with %d probes out, want half-open with none: each probe given back once", s.State, s.Probes)
		}
		// The hedged call deposited its ratio; its second copy, never
		// sent, cost nothing (its first copy, sent, keeps its token: it
		// took none).
		if after := c.RetryStatus().Budget.Available; after != before+ratio {
			t.Errorf("retry budget: %v retries before, %v after, want %v: the unsent copy's token back", before, after, before+ratio)
		}
	})
}

// TestASentRetryWhoseBreakerHookPanicsAsItReopensSettlesAsAFailure is
// TestASentRetryWhoseBreakerHookPanicsAsItClosesSettlesAsASuccess for a
// retry that failed: its failure opens the half-open breaker again, and
// the WithOnStateChange hook panics on that HalfOpen -> Open report. The
// call is settled as the retry loop would have settled that failure before
// deciding: a code the policy does not retry (INTERNAL) gives the retry's
// budget token back (it stayed spent: budget 9.5 for 10.5); a code it
// retries (UNAVAILABLE) keeps it, and gRFC A6 throttling counts the failure
// (it missed it: 9 tokens for 8).
func TestASentRetryWhoseBreakerHookPanicsAsItReopensSettlesAsAFailure(t *testing.T) {
	const ratio = probeRatio
	for _, how := range hookAborts {
		for _, tc := range []struct {
			code   codes.Code
			budget float64 // after the call, less before
			tokens float64 // A6
		}{
			{code: codes.Internal, budget: ratio, tokens: 9},        // UNAVAILABLE -1; INTERNAL is no retryable failure
			{code: codes.Unavailable, budget: ratio - 1, tokens: 8}, // -1 each
		} {
			t.Run(string(how)+"/"+tc.code.String(), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					srv := &testserver.Server{}
					srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
						if a.N == 1 {
							return testserver.Outcome{Err: status.Error(codes.Unavailable, "down")}
						}
						return testserver.Outcome{Err: status.Error(tc.code, "the retry fails")}
					})
					// The first attempt opens the breaker for 50ms; the
					// retry, 100ms later, is its half-open probe, and its
					// failure opens it again.
					c, before := probeAbortedByHook(t, srv, how, 3, false, func(from, to BreakerState) bool {
						return from == BreakerHalfOpen && to == BreakerOpen
					})
					rs := c.RetryStatus()
					if after := rs.Budget.Available; after != before+tc.budget {
						t.Errorf("retry budget: %v retries before, %v after, want %v", before, after, before+tc.budget)
					}
					if got := rs.Throttling.Tokens; math.Abs(got-tc.tokens) > 1e-9 {
						t.Errorf("A6 throttling: %v tokens, want %v", got, tc.tokens)
					}
				})
			})
		}
	}
}

// probeRatio is the retry budget's ratio in probeAbortedByHook's client.
const probeRatio = 0.5

// probeAbortedByHook makes one call (a stream's when stream) to srv through
// a client whose Echo service retries up to maxAttempts after 100ms, behind
// a breaker that one failure opens for 50ms (one half-open probe), whose
// WithOnStateChange hook aborts (how) on the reports abortOn picks. It
// checks that the call ended by the hook's abort after the server saw two
// attempts (the retry was sent, as the breaker's probe) and that nothing is
// held, and returns the client with its retry budget before the call.
func probeAbortedByHook(t *testing.T, srv *testserver.Server, how hookAbort, maxAttempts int, stream bool,
	abortOn func(from, to BreakerState) bool) (c *Client, before float64) {
	t.Helper()
	stub, c := newEcho(t, srv,
		WithRetryBudget(&serviceconfig.RetryBudget{Ratio: probeRatio, MinRetriesPerSecond: 1, TTL: 10 * time.Second}),
		WithOnStateChange(func(_ string, from, to BreakerState) {
			if abortOn(from, to) {
				how.do()
			}
		}),
		WithServiceConfig(&serviceconfig.Config{
			MethodConfig: []serviceconfig.MethodConfig{{
				Name: []serviceconfig.Name{{Service: echoService}},
				RetryPolicy: &serviceconfig.RetryPolicy{MaxAttempts: maxAttempts, InitialBackoff: 100 * time.Millisecond,
					MaxBackoff: 100 * time.Millisecond, BackoffMultiplier: 1},
				CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 1, OpenDuration: 50 * time.Millisecond, HalfOpenProbes: 1},
				Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 1},
			}},
			RetryThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 0.1},
		}))
	before = c.RetryStatus().Budget.Available
	if got := endedBy(func() { _ = callOf(t, stub, stream)() }); got != string(how) {
		t.Fatalf("the call whose hook aborts ended by %s, want %s", got, how)
	}
	if n := srv.Count(""); n != 2 {
		t.Fatalf("the server saw %d attempts, want 2: the retry was sent", n)
	}
	synctest.Wait()
	if held := heldGuards(c); held != "" {
		t.Errorf("after the hook's %s: %s", how, held)
	}
	return c, before
}
