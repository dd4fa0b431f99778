package interceptor

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/interceptor/endpoint"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// hedgedMC is a hedging policy on the echo service: maxAttempts copies,
// delay apart.
func hedgedMC(maxAttempts int, delay time.Duration) serviceconfig.MethodConfig {
	return serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: echoService}},
		HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: maxAttempts, HedgingDelay: delay,
			NonFatalStatusCodes: []codes.Code{codes.Unavailable}}}
}

// assertSettled fails unless every endpoint of rg's channel has no attempt
// in flight.
func assertSettled(t *testing.T, rg *rig) {
	t.Helper()
	s := rg.snapshot()
	for i, e := range s.Endpoints {
		if e.Outstanding != 0 {
			t.Fatalf("endpoint %d: %d attempts outstanding after every call returned:\n%v", i, e.Outstanding, s)
		}
	}
}

// TestHedgedCopiesTheCallerEndsNeverMeasureTheirEndpoint pins that the
// end mark is only the hedged call's: copies that the caller's
// cancellation or deadline ends (no copy answered) say nothing of their
// endpoints' latency, however many copies were in flight, and leave
// nothing outstanding. The deadline case failed when hedgeCall.close
// asked ctx.Err() whether the caller was still there while onResult asks
// callerErr (the clock): a copy's failure that arrives at the deadline
// before the context's timer has run (here the server's own grpc-timeout
// firing at the same instant) ends the call as the caller's deadline
// (StopDeadline), yet close marked the trail ended and the copies still
// running, cut by that deadline, raised their endpoints' estimates.
func TestHedgedCopiesTheCallerEndsNeverMeasureTheirEndpoint(t *testing.T) {
	for _, how := range []string{"cancel", "deadline"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newTestClient(t, WithMethodConfig(hedgedMC(3, 5*time.Millisecond)), WithRetryBudget(nil))
				rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"childPolicy": [{"peak_ewma": {}}], `+noEjection[1:]))...)
				rg.waitReady(3)
				for _, b := range rg.backends {
					b.OnCall(func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Delay: time.Second} })
				}
				var wg sync.WaitGroup
				for g := range 8 {
					wg.Go(func() {
						for i := range 5 {
							ctx, cancel := context.WithTimeout(t.Context(), time.Duration(20+g+i)*time.Millisecond)
							if how == "cancel" {
								cancel()
								ctx, cancel = context.WithCancel(t.Context())
								time.AfterFunc(time.Duration(20+g+i)*time.Millisecond, cancel)
							}
							_, err := rg.echo().Echo(ctx, &echov1.EchoRequest{Message: "x"})
							cancel()
							if err == nil {
								t.Errorf("call %d/%d answered: the backends take 1 s", g, i)
							}
						}
					})
				}
				wg.Wait()
				synctest.Wait()
				s := rg.snapshot()
				for i, e := range s.Endpoints {
					if e.Latency != 0 {
						t.Errorf("endpoint %d measured %v by copies its callers ended:\n%v", i, e.Latency, s)
					}
				}
				assertSettled(t, rg)
			})
		})
	}
}

// TestHedgeLosersNeverEjectUnderAnyChild pins that the end mark changes no
// child's ejection: a slow backend whose every attempt is a cancelled
// loser, under a policy that ejects at the first failure, stays in
// rotation under round_robin, pick_first and peak_ewma, and its losers
// count as no call.
func TestHedgeLosersNeverEjectUnderAnyChild(t *testing.T) {
	for _, child := range []string{"round_robin", "pick_first", "peak_ewma"} {
		t.Run(child, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newTestClient(t, WithMethodConfig(hedgedMC(3, 5*time.Millisecond)), WithRetryBudget(nil))
				rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"childPolicy": [{"`+child+`": {}}], "consecutiveFailures": 1,
					"failurePercentageEjection": {"threshold": 1, "requestVolume": 1}}`))...)
				rg.waitReady(3)
				for i, b := range rg.backends {
					d := time.Millisecond
					if i == 0 { // pick_first's endpoint: its copies lose to the others'
						d = time.Second
					}
					b.OnCall(func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Delay: d} })
				}
				for i := range 30 {
					if _, err := rg.echo().Echo(t.Context(), &echov1.EchoRequest{Message: "x"}); err != nil {
						t.Fatalf("call %d: %v", i, err)
					}
				}
				synctest.Wait()
				s := rg.snapshot()
				if s.Ejections != 0 || !s.Endpoints[0].EjectedUntil.IsZero() || s.Endpoints[0].Failures != 0 {
					t.Fatalf("hedge losers counted against their endpoint:\n%v", s)
				}
				if rg.counts()[0] == 0 {
					t.Fatalf("the slow backend got no attempt: the test proves nothing (%v)", rg.counts())
				}
				assertSettled(t, rg)
			})
		})
	}
}

// TestHedgedCallsUnderChurnSettleEveryEndpoint runs many concurrent
// hedged calls with random latencies, failures, caller cancellations and
// deadlines while a backend restarts in place and the channel's child
// policy changes between peak_ewma, round_robin and pick_first: when every
// call has returned, no endpoint has an attempt outstanding (the main test
// checks that no goroutine is left).
func TestHedgedCallsUnderChurnSettleEveryEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithMethodConfig(hedgedMC(3, 2*time.Millisecond)), WithRetryBudget(nil))
		rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"childPolicy": [{"peak_ewma": {}}], `+noEjection[1:]))...)
		rg.waitReady(3)
		var rmu sync.Mutex
		rnd := rand.New(rand.NewPCG(1, 2))
		draw := func(n int) int {
			rmu.Lock()
			defer rmu.Unlock()
			return rnd.IntN(n)
		}
		for _, b := range rg.backends {
			b.OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
				st := resiliencetest.Step{Delay: time.Duration(draw(12)) * time.Millisecond}
				switch draw(10) {
				case 0:
					st.Code = codes.Unavailable
				case 1:
					st.Code = codes.Canceled // a server that answers CANCELLED
				case 2:
					st.Code = codes.InvalidArgument
				}
				return st
			})
		}
		stop := make(chan struct{})
		churned := make(chan struct{})
		go func() {
			defer close(churned)
			children := []string{"round_robin", "pick_first", "peak_ewma"}
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				case <-time.After(7 * time.Millisecond):
				}
				if k%3 == 0 {
					rg.restart(1)
				}
				st := rg.state(rg.names...)
				st.ServiceConfig = rg.r.CC().ParseServiceConfig(`{"loadBalancingConfig": [{"` + endpoint.Name +
					`": {"childPolicy": [{"` + children[k%3] + `": {}}], ` + noEjection[1:] + `}]}`)
				rg.r.UpdateState(st)
			}
		}()
		var wg sync.WaitGroup
		for g := range 12 {
			wg.Go(func() {
				for i := range 25 {
					ctx, cancel := context.WithCancel(t.Context())
					switch draw(4) {
					case 0:
						time.AfterFunc(time.Duration(draw(10))*time.Millisecond, cancel)
					case 1:
						ctx, cancel = context.WithTimeout(ctx, time.Duration(1+draw(10))*time.Millisecond)
					}
					_, _ = rg.echo().Echo(ctx, &echov1.EchoRequest{Message: fmt.Sprint(g, i)})
					cancel()
				}
			})
		}
		wg.Wait()
		close(stop)
		<-churned
		synctest.Wait()
		assertSettled(t, rg)
	})
}
