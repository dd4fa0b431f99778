package interceptor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestNoAttemptStartsThatCannotFinish runs a 100ms call against a server
// whose attempts fail fast (5ms) and slowly (40ms) in turn.
func TestNoAttemptStartsThatCannotFinish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			d := 5 * time.Millisecond
			if a.N%2 == 0 {
				d = 40 * time.Millisecond
			}
			return testserver.Outcome{Delay: d, Err: status.Error(codes.Unavailable, "x")}
		})
		p := &serviceconfig.RetryPolicy{MaxAttempts: 5, InitialBackoff: 10 * time.Millisecond,
			MaxBackoff: 10 * time.Millisecond, Jitter: serviceconfig.JitterNone}
		stub, _ := newEcho(t, srv, WithRetryPolicy(p), WithRetryBudget(nil))
		// Warm the method's latency estimate (a running p90) with 30
		// attempts, fast and slow in turn.
		for range 15 {
			_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{}, MaxAttempts(2))
		}

		t0 := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		before := srv.Count("Echo")
		_, err := stub.Echo(ctx, &echov1.EchoRequest{})
		elapsed := time.Since(t0)
		var re *RetryError
		if !errors.As(err, &re) || re.Reason != StopDeadline || status.Code(err) != codes.Unavailable {
			t.Fatalf("Echo() error = %#v, want the last UNAVAILABLE, stopped by the deadline", err)
		}
		// With a running p90 near 40ms, attempts run 0–5ms (fast) and
		// 15–55ms (slow); a third could start at 65ms but not surely finish
		// by 100ms, so the call ends at 55ms with the last attempt's
		// UNAVAILABLE: it never idles to the deadline, and no attempt was cut
		// short by it (that would have ended in DEADLINE_EXCEEDED).
		if elapsed >= 100*time.Millisecond || elapsed != 55*time.Millisecond {
			t.Errorf("call took %v, want 55ms, well before the 100ms deadline", elapsed)
		}
		if got := srv.Count("Echo") - before; got != re.Attempts || got != 2 {
			t.Errorf("server saw %d attempts, the error says %d, want 2", got, re.Attempts)
		}
	})
}

func TestFirstAttemptWithNoTimeLeftIsNotStarted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(3)), WithDeadlineHeadroom(50*time.Millisecond))
		ctx, cancel := context.WithTimeout(t.Context(), 40*time.Millisecond)
		defer cancel()
		_, err := stub.Echo(ctx, &echov1.EchoRequest{})
		var re *RetryError
		if status.Code(err) != codes.DeadlineExceeded || !errors.As(err, &re) || re.Attempts != 0 {
			t.Fatalf("Echo() with 40ms left and 50ms headroom = %#v, want DEADLINE_EXCEEDED with no attempt", err)
		}
		if srv.Count("") != 0 {
			t.Errorf("server saw %d attempts, want 0", srv.Count(""))
		}
	})
}

// amplification runs calls concurrent callers of perCaller calls each
// against a server failing attempts as fail says, and returns attempts per
// call and the share of calls that succeeded.
func amplification(t *testing.T, opts []ClientOption, fail func(n int) bool) (perCall, success float64) {
	t.Helper()
	const callers, perCaller = 32, 63
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		var mu sync.Mutex
		n := 0
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			mu.Lock()
			defer mu.Unlock()
			n++
			if fail(n) {
				return testserver.Outcome{Err: status.Error(codes.Unavailable, "x")}
			}
			return testserver.Outcome{}
		})
		stub, _ := newEcho(t, srv, opts...)
		var wg sync.WaitGroup
		var ok sync.Map
		for g := range callers {
			wg.Go(func() {
				for i := range perCaller {
					if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err == nil {
						ok.Store(fmt.Sprint(g, i), true)
					}
				}
			})
		}
		wg.Wait()
		succeeded := 0
		ok.Range(func(any, any) bool { succeeded++; return true })
		calls := float64(callers * perCaller)
		perCall, success = float64(srv.Count("Echo"))/calls, float64(succeeded)/calls
	})
	return perCall, success
}

func amplificationPolicy() *serviceconfig.RetryPolicy {
	return &serviceconfig.RetryPolicy{MaxAttempts: 4, InitialBackoff: 50 * time.Millisecond, MaxBackoff: time.Second}
}

func TestRetryBudgetStopsAnOutageButNotRandomFailures(t *testing.T) {
	outage := func(int) bool { return true }
	rng := rand.New(rand.NewPCG(20, 26))
	random := func(int) bool { return rng.Float64() < 0.2 }

	plain, _ := amplification(t, []ClientOption{WithRetryPolicy(amplificationPolicy()), WithRetryBudget(nil)}, outage)
	budgeted, _ := amplification(t, []ClientOption{WithRetryPolicy(amplificationPolicy())}, outage)
	_, success := amplification(t, []ClientOption{WithRetryPolicy(amplificationPolicy())}, random)
	t.Logf("full outage: %.4f attempts per call with plain retry, %.4f with the default budget", plain, budgeted)
	t.Logf("20%% random UNAVAILABLE: %.2f%% of calls succeed with the default budget", success*100)
	if plain != 4 {
		t.Errorf("plain retry in an outage: %.4f attempts per call, want 4", plain)
	}
	if budgeted > 1.25 {
		t.Errorf("default budget in an outage: %.4f attempts per call, want at most 1.25", budgeted)
	}
	if success < 0.995 {
		t.Errorf("default budget under 20%% random failures: %.2f%% success, want at least 99.5%%", success*100)
	}
}

// TestA6ThrottlingTrace follows gRFC A6's token arithmetic with maxTokens 10
// and tokenRatio 0.1: every retryable failure takes a token, every success
// gives 0.1 back, and retries stop while tokens ≤ 5.
func TestA6ThrottlingTrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		var mu sync.Mutex
		failing := true
		srv.SetScript(func(testserver.Attempt) testserver.Outcome {
			mu.Lock()
			defer mu.Unlock()
			if failing {
				return testserver.Outcome{Err: status.Error(codes.Unavailable, "x")}
			}
			return testserver.Outcome{}
		})
		setFailing := func(f bool) { mu.Lock(); failing = f; mu.Unlock() }
		stub, _ := newEcho(t, srv, WithRetryBudget(nil), WithServiceConfig(&serviceconfig.Config{
			MethodConfig:    []serviceconfig.MethodConfig{{Name: []serviceconfig.Name{{}}, RetryPolicy: fastPolicy(3)}},
			RetryThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 0.1},
		}))
		call := func() (int, StopReason) {
			before := srv.Count("Echo")
			_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
			var re *RetryError
			if errors.As(err, &re) {
				return srv.Count("Echo") - before, re.Reason
			}
			return srv.Count("Echo") - before, StopNone
		}
		type step struct {
			attempts int
			reason   StopReason
			tokens   string // after the call
		}
		var got []step
		// Tokens 10 → 9 → 8 → 7 (3 attempts, exhausted); 7 → 6 → 5 (5 is not
		// above 5: throttled after 2); 5 → 4 (throttled after 1).
		for range 3 {
			n, r := call()
			got = append(got, step{n, r, ""})
		}
		// 11 successes: 4 + 1.1 = 5.1 > 5, so one retry is allowed again.
		setFailing(false)
		for range 11 {
			call()
		}
		setFailing(true)
		// 5.1 → 4.1 (retry allowed after the failure? 4.1 ≤ 5: no).
		n, r := call()
		got = append(got, step{n, r, ""})
		want := []step{{3, StopExhausted, ""}, {2, StopThrottled, ""}, {1, StopThrottled, ""}, {1, StopThrottled, ""}}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("trace = %v, want %v", got, want)
		}
	})
}

// TestA6ThrottlingCountsSuccessesOfMethodsWithoutAPolicy pins that every
// successful call on the channel refills the A6 token bucket, as grpc-go
// counts them, not only those of methods with a retry policy: successes of
// a policy-less Lookup never refilled it, so Echo stayed throttled.
func TestA6ThrottlingCountsSuccessesOfMethodsWithoutAPolicy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.Method == echoMethod {
				return testserver.Outcome{Err: status.Error(codes.Unavailable, "x")}
			}
			return testserver.Outcome{}
		})
		stub, _ := newEcho(t, srv, WithRetryBudget(nil), WithServiceConfig(&serviceconfig.Config{
			MethodConfig: []serviceconfig.MethodConfig{{
				Name: []serviceconfig.Name{{Service: echoService, Method: "Echo"}}, RetryPolicy: fastPolicy(3),
			}},
			RetryThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 1},
		}))
		echo := func() int {
			before := srv.Count("Echo")
			_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{})
			return srv.Count("Echo") - before
		}
		// Tokens 10 → 7 (3 attempts); 7 → 5 (throttled after 2); 5 → 4.
		for range 2 {
			echo()
		}
		if n := echo(); n != 1 {
			t.Fatalf("Echo made %d attempts once throttled, want 1", n)
		}
		// 5 successes of Lookup, which has no policy: 4 → 9.
		for range 5 {
			if _, err := stub.Lookup(t.Context(), &echov1.LookupRequest{}); err != nil {
				t.Fatal(err)
			}
		}
		if n := echo(); n != 3 {
			t.Errorf("Echo made %d attempts after 5 successes elsewhere on the channel, want 3 (9 → 6: not throttled)", n)
		}
	})
}

// Issue 32, finding 6: an explicit "retryBudget": {"ratio": 0,
// "minRetriesPerSecond": 0}, an incident's kill switch, was read as the
// default budget (20% of requests plus 10 a second): a failing server saw
// 4 attempts per call under maxAttempts 4 where the operator asked for 1.
// Both zeros written out now make a zero budget: one attempt per call, and
// a hedged call sends its first copy alone; with the block absent the
// default budget retries. Over real gRPC.
func TestExplicitZeroBudgetTurnsRetriesOff(t *testing.T) {
	const entries = `"methodConfig": [
		{"name": [{"service": "resilience.echo.v1.EchoService", "method": "Echo"}], "retryPolicy": {"maxAttempts": 4,
			"initialBackoff": "0.001s", "maxBackoff": "0.001s", "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}},
		{"name": [{"service": "resilience.echo.v1.EchoService", "method": "Lookup"}], "hedgingPolicy": {"maxAttempts": 3,
			"hedgingDelay": "0.001s", "nonFatalStatusCodes": ["UNAVAILABLE"]}}]`
	for _, tt := range []struct {
		name             string
		doc              string
		echoes, lookups  int // attempts the server sees per call
		budgetStopReason bool
	}{
		{"explicit zero budget", `{` + entries + `, "retryBudget": {"ratio": 0, "minRetriesPerSecond": 0}}`, 1, 1, true},
		{"no budget block: the default", `{` + entries + `}`, 4, 3, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(func(testserver.Attempt) testserver.Outcome {
					return testserver.Outcome{Delay: 10 * time.Millisecond, Err: status.Error(codes.Unavailable, "down")}
				})
				stub, _ := newEcho(t, srv, parsedConfig(t, tt.doc))
				_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
				if re, ok := errors.AsType[*RetryError](err); !ok || (re.Reason == StopBudget) != tt.budgetStopReason {
					t.Errorf("Echo = %v, want a RetryError stopped by the budget: %v", err, tt.budgetStopReason)
				}
				_, _ = stub.Lookup(t.Context(), &echov1.LookupRequest{})
				synctest.Wait()
				if e, l := srv.Count("Echo"), srv.Count("Lookup"); e != tt.echoes || l != tt.lookups {
					t.Errorf("the server saw %d attempts of Echo and %d copies of Lookup, want %d and %d", e, l, tt.echoes, tt.lookups)
				}
			})
		})
	}
}
