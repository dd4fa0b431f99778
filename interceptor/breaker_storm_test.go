package interceptor

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// stormRun is what one storm of closed-loop callers saw.
type stormRun struct {
	outageEnd      time.Time
	firstHalfOpen  time.Time // the first half-open moment at or after outageEnd
	closed         time.Time // when the breaker closed after outageEnd; zero: never
	after, okAfter int64     // calls started after outageEnd, and those that succeeded
}

// runBreakerStorm drives callers closed-loop goroutines through one client
// whose Echo has a breaker {consecutiveFailures: 5, openDuration}, against
// a server that answers UNAVAILABLE for outage and then recovers, and goes
// on for window after the outage (real time: what is measured is how the
// callers share two cores with the probe).
func runBreakerStorm(t *testing.T, callers int, openDuration, outage, window time.Duration) stormRun {
	t.Helper()
	var sick atomic.Bool
	sick.Store(true)
	srv := &testserver.Server{}
	srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
		if sick.Load() {
			return testserver.Outcome{Err: status.Error(codes.Unavailable, "outage")}
		}
		return testserver.Outcome{}
	})

	var mu sync.Mutex
	var run stormRun
	var halfOpenSince time.Time // when the breaker last turned half-open; zero when it is not
	hook := WithOnStateChange(func(_ string, from, to BreakerState) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		switch {
		case to == BreakerHalfOpen:
			halfOpenSince = now
			if !run.outageEnd.IsZero() && run.firstHalfOpen.IsZero() {
				run.firstHalfOpen = now
			}
		case from == BreakerHalfOpen:
			halfOpenSince = time.Time{}
		}
		if to == BreakerClosed && !run.outageEnd.IsZero() && run.closed.IsZero() {
			run.closed = now
		}
	})
	stub, _ := newEcho(t, srv, hook, WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: echoService}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5, OpenDuration: openDuration},
	}))

	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var after, okAfter atomic.Int64
	var ended atomic.Bool
	for range callers {
		wg.Go(func() {
			req := &echov1.EchoRequest{Message: "storm"}
			for ctx.Err() == nil {
				late := ended.Load()
				_, err := stub.Echo(ctx, req)
				if late {
					after.Add(1)
					if err == nil {
						okAfter.Add(1)
					}
				}
			}
		})
	}
	time.Sleep(outage) // the outage is the scenario, not a wait for an event
	mu.Lock()
	run.outageEnd = time.Now()
	if !halfOpenSince.IsZero() {
		run.firstHalfOpen = run.outageEnd
	}
	sick.Store(false)
	ended.Store(true)
	mu.Unlock()
	time.Sleep(window)
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	run.after, run.okAfter = after.Load(), okAfter.Load()
	return run
}

// TestBreakerRecoversUnderAStormOfCallers pins the recovery of a breaker
// hammered by 32 closed-loop callers on 2 cores: after a 1.5s outage, it
// closes within openDuration + 100ms of its first half-open moment after
// the outage. Before rejections were made lock-free and allocation-free and
// a failed probe's open period counted from the probe's start, it took up to
// 1.3s and sometimes did not close within 1.5s.
func TestBreakerRecoversUnderAStormOfCallers(t *testing.T) {
	if testing.Short() {
		t.Skip("a 1.5s outage in real time")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	const openDuration = time.Second
	const window = 1500 * time.Millisecond
	run := runBreakerStorm(t, 32, openDuration, 1500*time.Millisecond, window)
	if run.closed.IsZero() {
		t.Fatalf("breaker did not close within %v of the outage's end (first half-open moment after it: +%v)",
			window, sinceOrZero(run.firstHalfOpen, run.outageEnd))
	}
	recovery := run.closed.Sub(run.outageEnd)
	t.Logf("closed %v after the outage (first half-open at +%v); %d of %d calls started after the outage succeeded (%.1f%%)",
		recovery, sinceOrZero(run.firstHalfOpen, run.outageEnd), run.okAfter, run.after, 100*float64(run.okAfter)/float64(max(run.after, 1)))
	if limit := run.firstHalfOpen.Add(openDuration + 100*time.Millisecond); run.closed.After(limit) {
		t.Errorf("breaker closed at +%v after the outage, want by +%v (first half-open moment +%v, plus openDuration + 100ms)",
			recovery, limit.Sub(run.outageEnd), run.firstHalfOpen.Sub(run.outageEnd))
	}
}

func sinceOrZero(t, from time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return t.Sub(from)
}
