package interceptor

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// Regression tests for hedged unary calls (issue 20, items 3, 6, 7 and 9),
// each named after what it pins.

// hedgeDoc returns a service config hedging EchoService with hedgingPolicy
// and, when not empty, the extra blocks (a JSON fragment starting with a
// comma).
func hedgeDoc(hedgingPolicy, extra string) string {
	return `{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService"}],
		"hedgingPolicy": ` + hedgingPolicy + extra + `}]}`
}

// Item 3: a hedged method's call with messages that are not proto went
// straight to the invoker, past the breaker, the bulkhead and the metrics:
// six failures never tripped a breaker of two consecutive failures.
func TestHedgedCallWithNonProtoMessagesGoesThroughTheGuards(t *testing.T) {
	srv := &testserver.Server{}
	srv.SetScript(func(testserver.Attempt) testserver.Outcome {
		return testserver.Outcome{Err: status.Error(codes.Unavailable, "down")}
	})
	cc, c := newRawEcho(t, srv, parsedConfig(t, hedgeDoc(
		`{"maxAttempts": 3, "hedgingDelay": "0.01s", "nonFatalStatusCodes": ["UNAVAILABLE"]}`,
		`, "circuitBreaker": {"consecutiveFailures": 2, "openDuration": "60s"}`)))
	var rejected int
	for range 6 {
		err := cc.Invoke(t.Context(), echoMethod, rawOf(t, &echov1.EchoRequest{Message: "x"}), &rawMessage{},
			grpc.CallContentSubtype(rawCodecName))
		switch {
		case errors.Is(err, ErrCircuitOpen):
			rejected++
		case status.Code(err) != codes.Unavailable:
			t.Fatalf("Invoke = %v, want UNAVAILABLE or ErrCircuitOpen", err)
		}
	}
	if n := srv.Count("Echo"); n != 2 || rejected != 4 {
		t.Errorf("server saw %d attempts and the breaker rejected %d calls, want 2 and 4 (one attempt per call until it opened)", n, rejected)
	}
	if st := c.Status(echoMethod); st.Breaker == nil || st.Breaker.State != BreakerOpen {
		t.Errorf("Status(Echo) = %+v, want an open breaker", st)
	}
}

// Item 6: a pushback after which no copy could follow (all sent, or the
// wait past the deadline) was waited out all the same: 3 s idle, or until
// the deadline and then DEADLINE_EXCEEDED instead of the server's
// UNAVAILABLE.
func TestHedgingEndsAtOnceWhenAPushbackLeavesNoCopyToSend(t *testing.T) {
	tests := []struct {
		name     string
		policy   string
		delay    time.Duration // the server's, before each copy fails
		deadline time.Duration
		elapsed  time.Duration
		reason   StopReason
	}{
		{"every copy sent", `{"maxAttempts": 2, "hedgingDelay": "0.01s", "nonFatalStatusCodes": ["UNAVAILABLE"]}`,
			20 * time.Millisecond, 0, 30 * time.Millisecond, StopExhausted},
		{"the wait past the deadline", `{"maxAttempts": 3, "hedgingDelay": "1s", "nonFatalStatusCodes": ["UNAVAILABLE"]}`,
			0, time.Second, 0, StopDeadline},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(func(testserver.Attempt) testserver.Outcome {
					return testserver.Outcome{Delay: tt.delay, Err: status.Error(codes.Unavailable, "busy"),
						Trailer: metadata.Pairs(pushbackKey, "3000")}
				})
				stub, _ := newEcho(t, srv, WithRetryBudget(nil), parsedConfig(t, hedgeDoc(tt.policy, "")))
				ctx := t.Context()
				if tt.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.deadline)
					defer cancel()
				}
				start := time.Now()
				_, err := stub.Echo(ctx, &echov1.EchoRequest{})
				var re *RetryError
				if !errors.As(err, &re) || status.Code(err) != codes.Unavailable || re.Reason != tt.reason {
					t.Errorf("Echo() = %v, want the server's UNAVAILABLE, stopped by %v", err, tt.reason)
				}
				if elapsed := time.Since(start); elapsed != tt.elapsed {
					t.Errorf("call took %v, want %v: no copy could follow the pushback", elapsed, tt.elapsed)
				}
			})
		})
	}
}

// Item 7: PerAttemptTimeout was ignored on hedged calls: with copies that
// hang, a 100ms per-attempt timeout and a hedging delay of 1s, the call ran
// to its 3s deadline. It bounds every copy, and a copy cut by it is a
// non-fatal failure: the next copy goes out at once.
func TestPerAttemptTimeoutBoundsEveryHedgedCopy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: time.Hour} })
		stub, _ := newEcho(t, srv, WithRetryBudget(nil), parsedConfig(t, hedgeDoc(
			`{"maxAttempts": 3, "hedgingDelay": "1s", "nonFatalStatusCodes": ["UNAVAILABLE"]}`, "")))
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		start := time.Now()
		_, err := stub.Echo(ctx, &echov1.EchoRequest{}, PerAttemptTimeout(100*time.Millisecond))
		var re *RetryError
		if !errors.As(err, &re) || status.Code(err) != codes.DeadlineExceeded || re.Reason != StopExhausted || re.Attempts != 3 {
			t.Errorf("Echo() = %#v, want DEADLINE_EXCEEDED after 3 copies, exhausted", err)
		}
		if elapsed, n := time.Since(start), srv.Count("Echo"); elapsed != 300*time.Millisecond || n != 3 {
			t.Errorf("call took %v over %d copies, want 300ms over 3 (each cut at 100ms, the next sent at once)", elapsed, n)
		}
	})
}

// Item 9: a hedged copy that had to wait in the bulkhead's queue waited on
// the call's own loop, so the first copy's answer, which came at 600ms,
// reached the caller only when the queued copy got a slot (2.5s), or, with
// a deadline before that, the call failed although a copy had succeeded.
func TestQueuedHedgedCopyDoesNotHoldUpTheAnswer(t *testing.T) {
	for _, deadline := range []time.Duration{0, 2 * time.Second} {
		t.Run("deadline "+deadline.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
					switch a.Messages[0] {
					case "blocker": // holds a slot until 2.5s
						return testserver.Outcome{Delay: 2500 * time.Millisecond}
					case "queued": // queued before the hedge, served next
						return testserver.Outcome{Delay: 3 * time.Second}
					}
					if a.Previous < 0 { // the hedged call's first copy
						return testserver.Outcome{Delay: 600 * time.Millisecond}
					}
					return testserver.Outcome{}
				})
				stub, _ := newEcho(t, srv, WithRetryBudget(nil), parsedConfig(t, hedgeDoc(
					`{"maxAttempts": 2, "hedgingDelay": "0.1s", "nonFatalStatusCodes": ["UNAVAILABLE"]}`,
					`, "bulkhead": {"maxConcurrent": 2, "maxQueue": 2}`)))
				var wg sync.WaitGroup
				other := func(msg string) {
					wg.Go(func() {
						if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{Message: msg}, NoRetry()); err != nil {
							t.Errorf("Echo(%s) = %v", msg, err)
						}
					})
					synctest.Wait()
				}
				other("blocker")
				ctx := t.Context()
				if deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, deadline)
					defer cancel()
				}
				start := time.Now()
				var (
					elapsed time.Duration
					err     error
				)
				wg.Go(func() {
					_, err = stub.Echo(ctx, &echov1.EchoRequest{Message: "hedged"})
					elapsed = time.Since(start)
				})
				synctest.Wait() // the first copy holds the second slot
				other("queued") // waits in the queue, ahead of the hedge
				wg.Wait()
				if err != nil || elapsed != 600*time.Millisecond {
					t.Errorf("hedged Echo() = %v after %v, want success after 600ms (the first copy's answer)", err, elapsed)
				}
			})
		})
	}
}
