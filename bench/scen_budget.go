package bench

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// budgetPeer is ours with DefaultPolicy's retry policy alone (no breaker,
// no bulkhead, so that the budget is what is measured) and the retry
// budget block budget; "" turns the budget off (WithRetryBudget(nil)).
func budgetPeer(name, budget string) peer {
	return peer{name: name, setup: func(p Policy, _ need) ([]grpc.DialOption, string, error) {
		doc := fmt.Sprintf(`{"methodConfig":[{"name":[{"service":%q}],"retryPolicy":{"maxAttempts":%d,`+
			`"initialBackoff":"%gs","maxBackoff":"%gs","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]`,
			echoService, p.MaxAttempts, p.InitialBackoff.Seconds(), p.MaxBackoff.Seconds())
		opts := []interceptor.ClientOption{}
		if budget == "" {
			opts = append(opts, interceptor.WithRetryBudget(nil))
			doc += "}"
		} else {
			doc += `,"retryBudget":` + budget + "}"
		}
		cfg, err := serviceconfig.Parse([]byte(doc))
		if err != nil {
			return nil, "", fmt.Errorf("bench: budget: %w", err)
		}
		c, err := interceptor.NewClient(append(opts, interceptor.WithServiceConfig(cfg))...)
		if err != nil {
			return nil, "", fmt.Errorf("bench: budget: %w", err)
		}
		return c.DialOptions(), "", nil
	}}
}

// Budget: what the retry budget costs (transient failures it gives up on)
// and buys (the load it keeps off a server that is down).
func Budget() Scenario {
	return Scenario{
		Name: "retry budget trade-off",
		Workload: fmt.Sprintf("Ours with DefaultPolicy's retry policy alone (no breaker, no bulkhead), without a retry budget, "+
			"with the default one (ratio 0.2, minRetriesPerSecond 10, ttl 10s) and with ratio 0.5, through three workloads of the scenarios above: "+
			"transient (every call fails twice, then succeeds; one sequential caller, Size.Calls/4 calls), full outage (every attempt fails; "+
			"%d closed-loop callers for Size.Phase) and 20%% random failures (%d closed-loop callers, Size.Calls calls). "+
			"Attempts per call are counted on the server.", failureCallers, failureCallers),
		Run: func(ctx context.Context, sz Size) ([]Table, error) {
			transient := constant(func(_, _ string, attempt int) (time.Duration, error) {
				if attempt <= 2 {
					return 0, errUnavailable
				}
				return 0, nil
			})
			outage := constant(func(string, string, int) (time.Duration, error) { return 0, errUnavailable })
			random := constant(func(_, msg string, attempt int) (time.Duration, error) {
				if chance(randomSeed, msg, attempt) < 0.2 {
					return 0, errUnavailable
				}
				return 0, nil
			})
			t := Table{Header: []string{"peer", "transient: success", "attempts/call", "outage: attempts/call",
				"20% random: success", "attempts/call"}}
			for _, p := range []peer{
				budgetPeer("ours, no retry budget", ""),
				budgetPeer("ours, default retry budget", `{"ratio":0.2,"minRetriesPerSecond":10,"ttl":"10s"}`),
				budgetPeer("ours, retry budget ratio 0.5", `{"ratio":0.5,"minRetriesPerSecond":10,"ttl":"10s"}`),
			} {
				row := []string{p.name}
				for _, w := range []struct {
					b   func(time.Time) Behavior
					w   workload
					out func(r *loadRun) []string
				}{
					{transient, closedCalls(transientCallers, max(sz.Calls/4, 1)), func(r *loadRun) []string {
						return []string{pct(r.success()), perCall(r.attemptsPerCall())}
					}},
					{outage, closedFor(failureCallers, sz.Phase), func(r *loadRun) []string { return []string{perCall(r.attemptsPerCall())} }},
					{random, closedCalls(failureCallers, sz.Calls), func(r *loadRun) []string {
						return []string{pct(r.success()), perCall(r.attemptsPerCall())}
					}},
				} {
					r, _, err := runPeer(ctx, p, DefaultPolicy, needUnary, w.b, w.w)
					if err != nil {
						return nil, fmt.Errorf("%s: %w", p.name, err)
					}
					row = append(row, w.out(r)...)
				}
				t.Rows = append(t.Rows, row)
			}
			t.Notes = []string{"A retry is allowed while retries over the last ttl stay within ratio × requests + minRetriesPerSecond × ttl, " +
				"and a retry that succeeds earns its token back. Without a budget, a server that is down receives maxAttempts attempts " +
				"per call; with one, close to 1 + ratio. The price: a workload whose every call needs retries gets only that share."}
			return []Table{t}, nil
		},
	}
}
