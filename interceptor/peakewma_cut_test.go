package interceptor

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
)

// TestPeakEWMABringsBackABlackHoledEndpointAsSoonAsItsTimeoutSays pins how
// soon peak_ewma tries again an endpoint that it knows only by attempts the
// Client's per-attempt timeout T cut: once per about τ·ln(T / the others'
// latency), as the endpoint package documents. One backend of three
// black-holed for 30 s (the others answer in 5 ms), perAttemptRecvTimeout
// 500 ms, 16 callers: the first calls land on the unmeasured backend
// together and are all cut at T. Counted as its bare time (ObservePeak),
// the estimate was T and the healed backend got a call again 7.0–10.8 s
// after it healed. The first ObserveCut (stop 43's adversary) made each
// cut build on the estimate the one before it raised, though they were
// sent together: 2T at once, and the healed backend waited τ·ln 2 ≈ 7 s
// more (15.9–17.5 s). Each cut now weighs the estimate its attempt was
// sent under, so attempts sent together count once: 7.0–10.3 s.
func TestPeakEWMABringsBackABlackHoledEndpointAsSoonAsItsTimeoutSays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := fastPolicy(3)
		p.PerAttemptRecvTimeout = 500 * time.Millisecond
		p.RetryableStatusCodes = []codes.Code{codes.Unavailable, codes.DeadlineExceeded}
		c := newTestClient(t, WithRetryPolicy(p), WithRetryBudget(nil))
		rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"childPolicy": [{"peak_ewma": {}}], `+noEjection[1:]))...)
		rg.waitReady(3)
		var healed atomic.Bool
		var back atomic.Int64 // when the healed backend first got an attempt
		for i, b := range rg.backends {
			b.OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
				if i == 1 {
					if !healed.Load() {
						return resiliencetest.Step{Delay: time.Hour}
					}
					back.CompareAndSwap(0, time.Now().UnixNano())
				}
				return resiliencetest.Step{Delay: 5 * time.Millisecond}
			})
		}
		start := time.Now()
		stop := start.Add(90 * time.Second)
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					_, _ = rg.echo().Echo(t.Context(), &echov1.EchoRequest{Message: "x"})
					time.Sleep(800 * time.Millisecond)
				}
			})
		}
		time.Sleep(30 * time.Second)
		healedAt := time.Now()
		healed.Store(true)
		wg.Wait()
		synctest.Wait()
		if back.Load() == 0 {
			t.Fatalf("the healed backend got no call in the %v after it healed", stop.Sub(healedAt))
		}
		after := time.Duration(back.Load() - healedAt.UnixNano())
		t.Logf("the healed backend got a call again %v after it healed", after)
		if after > 12500*time.Millisecond {
			t.Fatalf("the healed backend got a call again %v after it healed, want within 12.5s (7.0–10.8s when a cut counted its bare time): cuts of attempts sent together counted more than once", after)
		}
	})
}
