package bench

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/grpc-resilience/resilience/resiliencetest"
)

// Row names and configs of the pause scenario beyond the shared ones.
const (
	// lbOursEWMAShortDecay is peak_ewma with a decay time of 1s.
	lbOursEWMAShortDecay = `{"resilience_endpoint":{"childPolicy":[{"peak_ewma":{"decayTime":"1s"}}]}}`
	epOursEWMAShortDecay = "grpc-resilience, resilience_endpoint (peak_ewma, decayTime 1s)"
)

// pauseFast and pauseSlow are the pause scenario's service times: every
// answer, and the one slow answer.
const pauseFast, pauseSlow = 5 * time.Millisecond, 50 * time.Millisecond

// EndpointPause: one slow answer from one backend of three (a GC pause, a
// cold cache), then every backend healthy again (issue 30). It measures in
// real time what the endpoint tests prove on fake time: how long a
// latency-aware policy keeps that backend out of rotation.
func EndpointPause() Scenario {
	return Scenario{
		Name: "endpoint-pause",
		Workload: "Three backends on loopback TCP answering in 5 ms; two phases in, backend 1 answers one call in 50 ms " +
			"(one pause), then in 5 ms again. 16 closed-loop callers for 32 phases, no hedging, no retry. Backend 1's " +
			"share of the calls (33.33% when they spread evenly) in the phase after the end of its slow answer and in " +
			"the 10 phases after it; 'back to 25%' is when its share of a half phase first reaches 25% again, after the " +
			"end of the slow answer ('never': not within the run).",
		Run: runEndpointPause,
	}
}

func runEndpointPause(ctx context.Context, sz Size) ([]Table, error) {
	rows := []epPeer{
		oursLB(epOursEWMA, lbOursEWMA),
		oursLB(epOursEWMAShortDecay, lbOursEWMAShortDecay),
		oursLB(epOursEWMALinkerd, lbOursEWMALinkerd),
		oursLB(epOursRR, lbOursRR),
	}
	// 30 phases after the pause: at the default size, 3τ of peak_ewma's
	// default decay time, past the τ·ln(50/5) ≈ 2.3τ its recovery takes at
	// most, so that "back to 25%" reads a recovery, not the run's end.
	pauseAt, d, after := 2*sz.Phase, 32*sz.Phase, 10*sz.Phase
	t := Table{Title: "One answer 10× slower from one backend of three, then all healthy",
		Header: []string{"peer", "calls", "its share, the phase after", "its share, 10 phases after", "back to 25% after (ms)", "p99 (ms)"}}
	for _, p := range rows {
		var paused atomic.Int64 // 1 + when backend 1 took the slow call; 0 before
		behave := func(b int, at time.Duration) resiliencetest.Step {
			if b == 1 && at >= pauseAt && paused.CompareAndSwap(0, int64(at)+1) {
				return resiliencetest.Step{Delay: pauseSlow}
			}
			return resiliencetest.Step{Delay: pauseFast}
		}
		row, err := epRow(ctx, p, epNoRetry, epBackends, false, behave, func(c *epCluster) []string {
			l := c.run(ctx, d)
			first, later, back := "(no pause)", "—", "—"
			if at := paused.Load(); at > 0 {
				end := time.Duration(at-1) + pauseSlow
				first = c.shares(end, end+sz.Phase)[1]
				later = c.shares(end, end+after)[1]
				back = c.backTo(1, 0.25, end, d, sz.Phase/2)
			}
			return []string{p.name, strconv.Itoa(len(l.outcomes)), first, later, back, ms(quantile(l.okLatencies(0, 0), 0.99))}
		})
		if err != nil {
			return nil, err
		}
		t.Rows = append(t.Rows, row)
	}
	t.Notes = append(t.Notes,
		"peak_ewma's estimate takes a slow answer at once and decays over decayTime (τ): the endpoint comes back as its "+
			"estimate falls toward the others' (the fast endpoints' estimates are peaks of noisy latencies too, so it "+
			"comes back gradually, within about τ·ln(50 ms / 5 ms) ≈ 2.3 τ). On fake time, where latencies never vary, "+
			"the tests pin 8.7 s before its next call at the defaults (TestOneSlowResponseBenchesAnEndpointForAboutTauLnRatio).",
		"endpointConcurrency 1 prices the fast endpoints' calls in flight at whole latencies, so the paused one keeps "+
			"some calls at once, but it too takes about τ to get its share back; its price is the endpoint-slow table's "+
			"(a persistently slow endpoint keeps a share that reaches the p99).",
		"A shorter decayTime brings the endpoint back sooner, and lets a persistently slow endpoint take more calls at "+
			"low traffic (docs/endpoints.md, peak_ewma).")
	return []Table{t}, nil
}

// backTo returns how long after from backend b's share of the first
// attempts in a bucket first reached share, in milliseconds, looking at
// buckets of the given length up to to; "never" when none did.
func (c *epCluster) backTo(b int, share float64, from, to, bucket time.Duration) string {
	for at := from; at+bucket <= to; at += bucket {
		counts, all := c.firstAttempts(at, at+bucket)
		if all > 0 && float64(counts[b]) >= share*float64(all) {
			return strconv.FormatInt((at - from).Milliseconds(), 10)
		}
	}
	return "never"
}
