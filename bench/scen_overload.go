package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/grpc-resilience/resilience/bench/overload"
)

// Overload is the server-side overload scenario of bench/overload: a server
// of fixed capacity under open-loop arrivals over loopback TCP that step
// from 0.5× to 3× its capacity and back, with no protection, failsafe-go's
// adaptive limiter (through its gRPC server interceptor) and ours
// (server.Limits, Vegas, defaults), with plain clients and with our
// client retrying under its default budget. One run; bench/overload's
// cmd/overload runs it (and the hostile, fairness and throttling
// scenarios) several times with min/median/max.
func Overload() Scenario {
	c := overload.DefaultConfig()
	return Scenario{
		Name: "overload (server)",
		Workload: fmt.Sprintf("A server of %d tokens held %v each (capacity %.0f calls/s); open-loop arrivals at %.1f× "+
			"capacity, then %.1f×, then %.1f× again, over loopback TCP; calls have a %v deadline; plain clients, then our client "+
			"retrying RESOURCE_EXHAUSTED and UNAVAILABLE (3 attempts) under its default budget. Goodput is the share of capacity served within "+
			"the deadline during the overload (after its first %v); admitted p99 is of those calls, as a ratio to the unloaded p99; "+
			"convergence is the time from the step up until every later half second has ≥ 90%% goodput with p90 within 2× "+
			"the unloaded p99. The tiny size shortens the phases only.",
			c.Tokens, c.Service, float64(c.Tokens)/c.Service.Seconds(), c.Low, c.High, c.Low, c.Deadline, c.Settle),
		Run: runOverload,
	}
}

func runOverload(_ context.Context, sz Size) ([]Table, error) {
	cfg := overload.DefaultConfig()
	if sz.Name == Tiny.Name {
		cfg.LowFor, cfg.HighFor, cfg.After, cfg.Settle = 300*time.Millisecond, 600*time.Millisecond, 300*time.Millisecond, 200*time.Millisecond
	}
	rep, err := overload.Run(cfg)
	if err != nil {
		return nil, err
	}
	t := Table{
		Header: []string{"server", "goodput (of capacity)", "admitted p99 vs unloaded p99", "in the server", "converges after step up", "recovers after step down"},
		Notes: []string{"Convergence and recovery are times within the scenario's fixed phases (bucketed by 500ms), not machine speed; " +
			"sony/gobreaker, grpc-go and go-grpc-middleware have no server-side limiter. \"In the server\": the p99 of the attempts the server answered OK, " +
			"timed in the server, so a retried call's earlier attempts and pushback are not in it."},
	}
	for _, r := range rep.Results {
		p99, srvP99 := "n/a", "n/a" // no call was served within its deadline
		if r.AdmittedP99 > 0 && r.UnloadedP99 > 0 {
			p99 = ratio(float64(r.AdmittedP99) / float64(r.UnloadedP99))
		}
		if r.ServerAdmittedP99 > 0 && r.ServerUnloadedP99 > 0 {
			srvP99 = ratio(float64(r.ServerAdmittedP99) / float64(r.ServerUnloadedP99))
		}
		name := r.Name // plain clients, no retries
		if r.Retrying {
			name += ", our client retrying (default budget)"
		}
		t.Rows = append(t.Rows, []string{name, pct(r.Goodput), p99, srvP99, settledIn(r.Converge), settledIn(r.Recover)})
	}
	return []Table{t}, nil
}

func settledIn(d time.Duration) string {
	if d < 0 {
		return "not within the phase"
	}
	return fmt.Sprintf("%d ms", d.Milliseconds())
}
