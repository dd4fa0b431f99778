package server

import (
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestOverloadMildDoesNotRatchet runs 1.2 times the capacity for 20s of
// fake time over gRPC. Under a mild overload the queue never drained, so
// each Vegas probe took a queued latency for the base RTT and the limit
// grew without bound: on main the admitted p99 reached several times the
// service time and calls ran out of their deadline. A probe while the
// limit sheds now drains the queue first: goodput stays at 90% of the
// capacity or more, the admitted p99 within twice the service time.
func TestOverloadMildDoesNotRatchet(t *testing.T) {
	const dur, last = 20 * time.Second, 3 * time.Second
	res, st := runOverload(t, load{gap: ovGap(1.2), dur: dur, deadline: ovDeadline, measureFrom: dur - last},
		withLimit(serviceconfig.ConcurrencyLimit{}))
	good := float64(res.good[0]) / capacityIn(last)
	t.Logf("after %v at 1.2×: goodput %.1f%% of capacity, admitted p99 %v, codes %v, %+v", dur, 100*good, res.p(0.99), res.codes, st)
	if good < 0.9 {
		t.Errorf("goodput = %.2f of capacity, want ≥ 0.9", good)
	}
	if p := res.p(0.99); p > 2*ovService {
		t.Errorf("admitted p99 = %v, want ≤ %v", p, 2*ovService)
	}
}
