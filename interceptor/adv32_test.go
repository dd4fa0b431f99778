package interceptor

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Adversarial review of issue 32 (adv32).

// ForceOpen made the method's row (or found it, idle, its reference bit
// cleared by its key's hand) and then forced its breaker with no lock held;
// meanwhile a call of another name of the same full key could let that row
// go to make room (T6b: it was idle, a closed breaker with nothing counted),
// and ForceOpen forced a breaker no call would use again: it returned nil
// and the method's next call made a new row, closed, and went through. Now
// an operator's control that finds its row let go meanwhile acts again on
// the method's row: a nil return means the method's calls are refused.
func TestForceOpenIsNeverLostToAnEvictionOfItsRow(t *testing.T) {
	c := newTestClient(t, WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: "shop.Orders"}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 3, OpenDuration: time.Hour},
	}), WithRetryBudget(nil))
	c.table.bound = 2
	cc := anyMethodServer(t, c.DialOptions()...)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var n atomic.Int64
	for range 3 { // a proxy forwarding ever new names of the service
		wg.Go(func() {
			for ctx.Err() == nil {
				m := fmt.Sprintf("/shop.Orders/Flood%d", n.Add(1))
				_ = cc.Invoke(ctx, m, &echov1.EchoRequest{}, &echov1.EchoResponse{})
			}
		})
	}
	lost := 0
	for i := 0; ctx.Err() == nil && lost == 0; i++ {
		m := fmt.Sprintf("/shop.Orders/Forced%d", i)
		if err := c.ForceOpen(m); err != nil {
			continue // no room: said so
		}
		if s := c.Status(m); s.Breaker == nil || s.Breaker.State != BreakerForcedOpen {
			lost++
			t.Errorf("ForceOpen(%s) = nil, then its breaker is %+v", m, s.Breaker)
		}
		// Let it go: a forced row is live, and would hold its room for ever.
		_ = c.ResetBreaker(m)
	}
	cancel()
	wg.Wait()
}
