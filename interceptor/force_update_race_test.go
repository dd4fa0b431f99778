package interceptor

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// ForceOpen racing a config update that changed the method's breaker
// block could be lost: ForceOpen forced the breaker of the state it read,
// while the update, building the next state, had already copied that
// breaker's state into a new breaker; once the update was published the
// method's breaker was closed and ForceOpen had returned nil. The fix made
// the controls wait for the update lock, under which the state-change hook
// then ran (a deadlock for a hook that called the client:
// TestHooksMayCallEveryMethodOfTheClient). A method's breaker is now one
// object while its entry keeps the block, changed in place
// (breaker.Reconfigure; methods.go, T5): there is no copy to lose the
// forced state to, and the controls take no lock.
func TestForceOpenRacingAnUpdateIsNeverLost(t *testing.T) {
	others := make([]serviceconfig.Name, 300) // an update takes a while after Echo
	for i := range others {
		others[i] = serviceconfig.Name{Service: "tenant.Service", Method: fmt.Sprintf("M%d", i)}
	}
	cfg := func(n int) *serviceconfig.Config {
		return &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
			Name:           []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
			CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 3 + n%2},
		}, {
			Name:    others,
			Timeout: time.Second,
		}}}
	}
	c := newTestClient(t, WithServiceConfig(cfg(0)))
	cc := testserver.Start(t, &testserver.Server{}, c.DialOptions()...)
	lost := 0
	for i := range 200 {
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := c.UpdateServiceConfig(cfg(i + 1)); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			// at a different point of the update each time
			for t0 := time.Now(); time.Since(t0) < time.Duration(i%40)*25*time.Microsecond; {
			}
			if err := c.ForceOpen(echoMethod); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		if err := cc.Invoke(t.Context(), echoMethod, &echov1.EchoRequest{}, &echov1.EchoResponse{}); !errors.Is(err, ErrCircuitOpen) {
			lost++
		}
		if err := c.ResetBreaker(echoMethod); err != nil {
			t.Fatal(err)
		}
	}
	if lost > 0 {
		t.Errorf("Echo admitted after ForceOpen raced an update, %d times of 200", lost)
	}
}
