package interceptor

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// echoBreakerConfig is a config whose only entry guards Echo with cb.
func echoBreakerConfig(cb serviceconfig.CircuitBreaker) *serviceconfig.Config {
	return &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
		Name:           []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
		CircuitBreaker: &cb,
	}}}
}

// An update that changes a breaker's block built a new, closed breaker:
// an operator's ForceOpen during an incident, or a breaker tripped open by
// the outage, was undone by the next config push that touched the block
// (a resolver's or control plane's, which the operator may not control),
// and calls went to the failing backend again. The new breaker now takes
// the old one's state: forced states stay, an open breaker stays open
// until the old one's open time ends (bounded by the new config's
// maxOpenDuration from the update), then probes under the new thresholds.
func TestBreakerStateSurvivesAnUpdateOfItsBlock(t *testing.T) {
	before := serviceconfig.CircuitBreaker{ConsecutiveFailures: 2, OpenDuration: 30 * time.Second}
	after := serviceconfig.CircuitBreaker{ConsecutiveFailures: 5, OpenDuration: 10 * time.Second}
	tests := []struct {
		name  string
		setup func(t *testing.T, c *Client, stub echov1.EchoServiceClient)
		want  BreakerState
		// reopen is when, after the update, the breaker lets a probe
		// through; 0: never by itself.
		reopen time.Duration
	}{
		{"forced open", func(t *testing.T, c *Client, _ echov1.EchoServiceClient) {
			if err := c.ForceOpen(echoMethod); err != nil {
				t.Fatal(err)
			}
		}, BreakerForcedOpen, 0},
		{"tripped open", func(t *testing.T, _ *Client, stub echov1.EchoServiceClient) {
			for range 2 {
				_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{})
			}
			time.Sleep(5 * time.Second) // 25s of the 30s left
		}, BreakerOpen, 10 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(failFirst(2, codes.Unavailable))
				stub, c := newEcho(t, srv, WithServiceConfig(echoBreakerConfig(before)))
				tt.setup(t, c, stub)
				sent := srv.Count("Echo")
				if err := c.UpdateServiceConfig(echoBreakerConfig(after)); err != nil {
					t.Fatal(err)
				}
				if st := c.Status(echoMethod); st.Breaker == nil || st.Breaker.State != tt.want {
					t.Errorf("Status after the update = %+v, want the breaker %v", st.Breaker, tt.want)
				}
				if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); !errors.Is(err, ErrCircuitOpen) || srv.Count("Echo") != sent {
					t.Errorf("Echo after the update = %v, with %d attempts sent, want ErrCircuitOpen and none", err, srv.Count("Echo")-sent)
				}
				if tt.reopen == 0 {
					return
				}
				time.Sleep(tt.reopen)
				if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
					t.Errorf("Echo %v after the update = %v, want the probe to succeed", tt.reopen, err)
				}
			})
		})
	}
}

// A lowered bulkhead cap applies to new calls only: an update that changes
// the block builds a new, empty bulkhead, while the calls in flight hold
// slots of the old one, so an operator who lowers maxConcurrent from 4 to
// 1 to shed load mid-incident gets 5 calls in flight at once until the
// old ones drain (and Statuses shows the new bulkhead's 1, not 5).
func TestLoweredBulkheadCapCountsTheCallsInFlight(t *testing.T) {
	t.Skip("known gap (r20): a new bulkhead does not count the old one's calls in flight; " +
		"a fix needs the old bulkhead's releases forwarded to the new one (internal/bulkhead resize or hand-over), " +
		"too large for the review: see the r20 report")
	synctest.Test(t, func(t *testing.T) {
		bulkhead := func(n int) *serviceconfig.Config {
			return &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
				Name:     []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
				Bulkhead: &serviceconfig.Bulkhead{MaxConcurrent: n},
			}}}
		}
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: time.Second} })
		stub, c := newEcho(t, srv, WithServiceConfig(bulkhead(4)))
		done := make(chan error, 4)
		for range 4 {
			go func() { _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); done <- err }()
		}
		synctest.Wait()
		if err := c.UpdateServiceConfig(bulkhead(1)); err != nil {
			t.Fatal(err)
		}
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
		if !errors.Is(err, ErrBulkheadFull) {
			t.Errorf("Echo with 4 calls in flight after the cap was lowered to 1 = %v, want ErrBulkheadFull", err)
		}
		for range 4 {
			<-done
		}
	})
}
