package interceptor

import (
	"context"
	"testing"
	"time"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestAdaptiveHedgeDelayCostsNoAllocation pins the hot-path promise of the
// adaptive delay: reading it allocates nothing, and a hedged call under it
// allocates no more than one under a fixed delay.
func TestAdaptiveHedgeDelayCostsNoAllocation(t *testing.T) {
	hedgedCallAllocs := func(hp *serviceconfig.HedgingPolicy) (callAllocs float64, mp *methodPolicy) {
		c := newTestClient(t, WithRetryBudget(nil), WithMethodConfig(serviceconfig.MethodConfig{
			Name: []serviceconfig.Name{{Service: echoService}}, HedgingPolicy: hp,
		}))
		ic := c.UnaryClientInterceptor()
		ctx := context.Background()
		req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
		for range 200 { // past the minimum samples
			if err := ic(ctx, echoMethod, req, reply, nil, okInvoker); err != nil {
				t.Fatal(err)
			}
		}
		return testing.AllocsPerRun(500, func() {
			if err := ic(ctx, echoMethod, req, reply, nil, okInvoker); err != nil {
				t.Fatal(err)
			}
		}), c.state.Load().policy(echoMethod, false)
	}
	fixed, _ := hedgedCallAllocs(&serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: time.Hour})
	adaptive, mp := hedgedCallAllocs(&serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.9, HedgingDelayFloor: time.Hour})
	if mp.hedgeWindow == nil || mp.hedgeWindow.Samples() < serviceconfig.DefaultHedgingDelayMinSamples {
		t.Fatalf("the adaptive policy has no window, or too few samples in it")
	}
	if d := mp.hedgeDelay(); d != time.Hour {
		t.Errorf("hedgeDelay() = %v, want the floor, 1h", d)
	}
	if n := testing.AllocsPerRun(1000, func() { _ = mp.hedgeDelay() }); n != 0 {
		t.Errorf("hedgeDelay allocates %v times, want 0", n)
	}
	t.Logf("a hedged call allocates %v times with a fixed delay, %v with an adaptive one", fixed, adaptive)
	if adaptive > fixed+0.5 {
		t.Errorf("a hedged call allocates %v times with an adaptive delay, %v with a fixed one: want no more", adaptive, fixed)
	}
}
