package interceptor

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// Regression tests from the adversarial review of issue 20 (r20), each
// named after what it pins.

// Hedges the bulkhead refused (it was full) must not keep later calls from
// being hedged: a rationed call's tail copy once took a token of a
// per-method allowance that a refused copy never gave back, so once the
// bulkhead had room again, a slow call went unhedged for the next five
// calls per token lost. The allowance is gone (hedge_delay.go: one rule);
// this pins that refused hedges cost the calls after them nothing.
func TestHedgesRefusedByTheBulkheadLeaveLaterCallsHedged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			switch a.Messages[0] {
			case "fast":
				return testserver.Outcome{Delay: 10 * time.Millisecond}
			case "blocker":
				return testserver.Outcome{Delay: time.Hour}
			case "slow":
				return testserver.Outcome{Delay: time.Minute}
			}
			return testserver.Outcome{Delay: time.Second}
		})
		stub, c := newEcho(t, srv, WithRetryBudget(nil), parsedConfig(t, hedgeDoc(
			`{"maxAttempts": 2, "hedgingDelayQuantile": 0.9, "hedgingDelay": "5s", "hedgingDelayMinSamples": 20,
			  "nonFatalStatusCodes": ["UNAVAILABLE"]}`,
			`, "bulkhead": {"maxConcurrent": 2}`)))
		call := func(msg string) {
			t.Helper()
			if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{Message: msg}); err != nil {
				t.Fatalf("Echo(%s) = %v", msg, err)
			}
		}
		for range 100 { // the window learns ~10ms
			call("fast")
		}
		if d, ok := c.HedgingDelay(echoMethod); !ok || d > 20*time.Millisecond {
			t.Fatalf("HedgingDelay = %v, %v after the warm-up, want ~10ms", d, ok)
		}
		blockCtx, unblock := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		wg.Go(func() { _, _ = stub.Echo(blockCtx, &echov1.EchoRequest{Message: "blocker"}, NoRetry()) })
		synctest.Wait()
		for range 10 { // each one's hedge finds the bulkhead full
			call("refused")
		}
		unblock()
		wg.Wait()
		if d, ok := c.HedgingDelay(echoMethod); !ok || d > 20*time.Millisecond {
			t.Fatalf("HedgingDelay = %v, %v before the slow calls, want ~10ms", d, ok)
		}
		for i := range 3 {
			before := srv.Count("Echo")
			call("slow")
			if n := srv.Count("Echo") - before; n != 2 {
				t.Errorf("slow call %d after the bulkhead emptied sent %d copies, want 2: its hedge was rationed away by hedges never sent", i, n)
			}
		}
	})
}

// HedgingDelay took its name as it came, where Status and the breaker
// controls accept a name without its leading slash (and refuse one that is
// not a full method): for "pkg.Service/Method" it resolved a policy of its
// own, with an empty window, and reported the configured warm-up delay
// (or nothing) instead of the delay the calls run with.
func TestHedgingDelayReadsTheCallsDelayWithoutTheLeadingSlash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: 10 * time.Millisecond} })
		stub, c := newEcho(t, srv, WithRetryBudget(nil), parsedConfig(t, hedgeDoc(
			`{"maxAttempts": 2, "hedgingDelayQuantile": 0.9, "hedgingDelay": "5s", "hedgingDelayMinSamples": 5,
			  "nonFatalStatusCodes": ["UNAVAILABLE"]}`, "")))
		for range 10 {
			if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
				t.Fatal(err)
			}
		}
		want, ok := c.HedgingDelay(echoMethod)
		if !ok || want > 20*time.Millisecond {
			t.Fatalf("HedgingDelay(%s) = %v, %v, want ~10ms", echoMethod, want, ok)
		}
		if got, ok := c.HedgingDelay(echoMethod[1:]); !ok || got != want {
			t.Errorf("HedgingDelay(%s) = %v, %v, want %v, true (the calls' delay)", echoMethod[1:], got, ok, want)
		}
		if got, ok := c.HedgingDelay("resilience.echo.v1.EchoService"); ok {
			t.Errorf("HedgingDelay of a service = %v, true, want false: not a full method", got)
		}
	})
}

// A copy waiting in the bulkhead's queue had not been sent, yet a sibling's
// outcome that ended the copies did not stop it: the sibling's slot went
// to the queued copy as the sibling finished, before the call took its
// outcome, and the copy was sent: after a server's pushback that said to
// stop (and the call then returned that copy's success), or after the
// winner's answer (a copy of pure waste). Such a copy is now not sent.
func TestQueuedCopyIsNotSentAfterASiblingEndedTheCopies(t *testing.T) {
	tests := []struct {
		name   string
		first  testserver.Outcome // the hedged call's first copy, at 100ms
		code   codes.Code
		reason StopReason
	}{
		{"a pushback that says stop", testserver.Outcome{Err: status.Error(codes.Unavailable, "busy"),
			Trailer: metadata.Pairs(pushbackKey, "-1")}, codes.Unavailable, StopPushback},
		{"the winner's answer", testserver.Outcome{}, codes.OK, StopNone},
		{"a fatal status", testserver.Outcome{Err: status.Error(codes.InvalidArgument, "bad")}, codes.InvalidArgument, StopNonRetryable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
					if a.Messages[0] == "blocker" {
						return testserver.Outcome{Delay: 2 * time.Second}
					}
					if a.Previous < 0 { // the hedged call's first copy
						o := tt.first
						o.Delay = 100 * time.Millisecond
						return o
					}
					return testserver.Outcome{}
				})
				stub, _ := newEcho(t, srv, WithRetryBudget(nil), parsedConfig(t, hedgeDoc(
					`{"maxAttempts": 2, "hedgingDelay": "0.01s", "nonFatalStatusCodes": ["UNAVAILABLE"]}`,
					`, "bulkhead": {"maxConcurrent": 2, "maxQueue": 1}`)))
				var wg sync.WaitGroup
				wg.Go(func() { _, _ = stub.Echo(t.Context(), &echov1.EchoRequest{Message: "blocker"}, NoRetry()) })
				synctest.Wait()
				start := time.Now()
				_, err := stub.Echo(t.Context(), &echov1.EchoRequest{Message: "hedged"})
				elapsed := time.Since(start)
				var re *RetryError
				if status.Code(err) != tt.code || elapsed != 100*time.Millisecond ||
					tt.reason != StopNone && (!errors.As(err, &re) || re.Reason != tt.reason) {
					t.Errorf("Echo() = %v after %v, want %v (stopped by %v) at 100ms", err, elapsed, tt.code, tt.reason)
				}
				wg.Wait()
				if n := srv.Count("Echo"); n != 2 {
					t.Errorf("server saw %d attempts, want 2 (the blocker and the first copy): the queued copy was sent", n)
				}
			})
		})
	}
}
