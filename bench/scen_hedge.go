package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// AdaptiveHedgeConfig is the hedgingPolicy object of the slow-tail
// scenario's adaptive row: ours hedging at the method's observed p95
// (hedgingDelayQuantile), with the fixed delay as the warm-up delay until
// 100 attempts were observed.
var AdaptiveHedgeConfig = `{"maxAttempts": 2, "hedgingDelay": "0.005s", "hedgingDelayQuantile": 0.95, "hedgingDelayMinSamples": 100}`

// The slow-tail workload.
const (
	tailFast    = 2 * time.Millisecond  // an attempt's usual time
	tailSlow    = 40 * time.Millisecond // its time with probability tailP
	tailP       = 0.05
	tailCallers = 4
)

// SlowTail measures hedging on a server with a slow tail; pol's
// OursHedgeConfig, when set, adds ours with that hedgingPolicy, and
// AdaptiveHedgeConfig adds the adaptive row.
func SlowTail(pol Policy) Scenario {
	if pol.OursHedgeConfig == "" {
		pol.OursHedgeConfig = AdaptiveHedgeConfig
	}
	return Scenario{
		Name: "slow tail (hedging)",
		Workload: fmt.Sprintf("Each Echo attempt takes %v, or %v with probability %.2f drawn deterministically from "+
			"(seed, call, attempt). %d closed-loop callers, 2×Size.Calls calls per peer. Hedging peers send at most one hedge "+
			"after a fixed %v (failsafe-go hedgepolicy, ours hedgingPolicy {maxAttempts 2}); the losing attempt is cancelled. "+
			"Latency quantiles are ratios to the bare (unhedged) call's; extra load is server attempts per call minus 1.",
			tailFast, tailSlow, tailP, tailCallers, pol.HedgeDelay),
		Run: func(ctx context.Context, sz Size) ([]Table, error) { return runSlowTail(ctx, sz, pol) },
	}
}

func runSlowTail(ctx context.Context, sz Size, pol Policy) ([]Table, error) {
	b := constant(func(_, msg string, attempt int) (time.Duration, error) {
		if chance(randomSeed+1, msg, attempt) < tailP {
			return tailSlow, nil
		}
		return tailFast, nil
	})
	peers := hedgePeers(pol)
	t := Table{
		Header: []string{"peer", "p50 vs bare", "p99 vs bare", "extra attempts", "success"},
	}
	var bare50, bare99 time.Duration
	for _, p := range peers {
		n := needHedge
		if p.name == peerBare {
			n = needUnary
		}
		r, cannot, err := runPeer(ctx, p, pol, n, b, closedCalls(tailCallers, 2*sz.Calls))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		if cannot != "" {
			t.Rows = append(t.Rows, []string{p.name, "(" + cannot + ")", "—", "—", "—"})
			continue
		}
		ds := r.latencies()
		p50, p99 := quantile(ds, 0.5), quantile(ds, 0.99)
		if p.name == peerBare {
			bare50, bare99 = p50, p99
		}
		t.Rows = append(t.Rows, []string{p.name, ratio(float64(p50) / float64(bare50)), ratio(float64(p99) / float64(bare99)),
			pct(r.attemptsPerCall() - 1), pct(r.success())})
	}
	return []Table{t}, nil
}

// The slow tail that triples: the slow-tail workload whose base latency
// (and tail) triple halfway through the run.
const (
	shiftFactor  = 3                    // the base latency's growth halfway
	shiftSlowMul = 20                   // a slow attempt takes this many times the base
	shiftFixed   = 5 * time.Millisecond // the fixed hedging delay, set for the first half
	shiftQuant   = 0.95                 // the adaptive delays' quantile
	shiftAge     = 256                  // failsafe-go's quantileAge, executions remembered
	shiftSamples = 100                  // samples before an adaptive delay is used
	shiftBase    = 2 * time.Millisecond // the first half's base latency
)

// ShiftHedgeConfig is ours' adaptive hedgingPolicy in the slow tail that
// triples, the same quantile and warm-up as failsafe-go's row.
var ShiftHedgeConfig = fmt.Sprintf(`{"maxAttempts": 2, "hedgingDelayQuantile": %g, "hedgingDelayMinSamples": %d}`, shiftQuant, shiftSamples)

// SlowTailTriples measures hedging when the latency a fixed hedging delay
// was set for changes: the base latency triples halfway through the run.
func SlowTailTriples() Scenario {
	return slowTailDrift(shiftFactor, "slow tail that triples (hedging)")
}

// SlowTailQuadruples is SlowTailTriples with the base latency growing 4×
// halfway: the drift scenario of issue 32.
func SlowTailQuadruples() Scenario { return slowTailDrift(4, "slow tail that quadruples (hedging)") }

// slowTailDrift is the slow-tail workload whose base latency grows factor×
// halfway through the run.
func slowTailDrift(factor int, name string) Scenario {
	return Scenario{
		Name: name,
		Workload: fmt.Sprintf("Each Echo attempt takes the base latency, or %d× it with probability %.2f drawn deterministically "+
			"from (seed, call, attempt); the base is %v for the first half of the calls and %v for the second. %d closed-loop "+
			"callers, 4×Size.Calls calls per peer (the p99 rests on 1%% of them), each with a %v deadline. Hedging peers send at most one hedge: after a fixed %v "+
			"(set for the first half: below the second half's base), or after the observed p%.0f of attempt durations "+
			"(failsafe-go NewBuilderWithDelayQuantile(%.2f, %d, %d), ours hedgingDelayQuantile %.2f after %d samples); the losing "+
			"attempt is cancelled. Ours runs within the default retry budget, which raises either delay to the latency the "+
			"share of calls it pays for outlasts (about a fifth at these rates). Latency quantiles are ratios to the bare (unhedged) "+
			"call's; extra load is server attempts per call minus 1.",
			shiftSlowMul, tailP, shiftBase, time.Duration(factor)*shiftBase, tailCallers, callTimeout, shiftFixed,
			100*shiftQuant, shiftQuant, shiftAge, shiftSamples, shiftQuant, shiftSamples),
		Run: func(ctx context.Context, sz Size) ([]Table, error) { return runSlowTailDrift(ctx, sz, factor) },
	}
}

func runSlowTailDrift(ctx context.Context, sz Size, factor int) ([]Table, error) {
	total := 4 * sz.Calls
	b := constant(func(_, msg string, attempt int) (time.Duration, error) {
		base := shiftBase
		if i, err := strconv.Atoi(strings.TrimPrefix(msg, "c")); err == nil && i >= total/2 {
			base *= time.Duration(factor)
		}
		if chance(randomSeed+2, msg, attempt) < tailP {
			return shiftSlowMul * base, nil
		}
		return base, nil
	})
	pol := DefaultPolicy
	pol.HedgeDelay = shiftFixed
	peers := []peer{bare(), failsafeHedge(), failsafeHedgeQuantile(shiftQuant, shiftAge, shiftSamples),
		oursHedge(peerOursHedge, ""), oursHedge(peerOursHedgeQuant, ShiftHedgeConfig)}
	t := Table{Header: []string{"peer", "p50 vs bare", "p99 vs bare", "extra attempts", "success"}}
	var bare50, bare99 time.Duration
	for _, p := range peers {
		n := needHedge
		if p.name == peerBare {
			n = needUnary
		}
		r, cannot, err := runPeer(ctx, p, pol, n, b, closedCalls(tailCallers, total))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		if cannot != "" {
			t.Rows = append(t.Rows, []string{p.name, "(" + cannot + ")", "—", "—", "—"})
			continue
		}
		ds := r.latencies()
		p50, p99 := quantile(ds, 0.5), quantile(ds, 0.99)
		if p.name == peerBare {
			bare50, bare99 = p50, p99
		}
		t.Rows = append(t.Rows, []string{p.name, ratio(float64(p50) / float64(bare50)), ratio(float64(p99) / float64(bare99)),
			pct(r.attemptsPerCall() - 1), pct(r.success())})
	}
	return []Table{t}, nil
}
