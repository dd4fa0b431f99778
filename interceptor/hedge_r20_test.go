package interceptor

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// Regression tests from the adversarial review of issue 20 (r20), each
// named after what it pins.

// A rationed call's tail copy takes a token of the method's allowance
// before the guards see it; when the bulkhead refused the copy (or no time
// was left for it), the budget's token went back but the allowance's did
// not, so hedges refused while the bulkhead was full drained the allowance
// for the calls after: once the bulkhead had room again, a slow call went
// unhedged for the next five calls per token lost.
func TestRefusedHedgeGivesBackItsAllowance(t *testing.T) {
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
