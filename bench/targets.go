package bench

import (
	"strconv"
	"strings"
)

// target is one of issue 10's goals, read back from the report's cells.
type target struct {
	goal               string
	scenario, table    string // table "" means any table of the scenario
	row, column        string
	max                float64 // met when the cell's number ≤ max (≥ max with atLeast)
	atLeast            bool
	ratioOf, ratioOver string // when set: met when cell(row) < cell(ratioOver) in the same column
}

// issueTargets are issue 10's measurable targets for ours.
var issueTargets = []target{
	{goal: "unary success path, bufconn: time ≤ 1.01×", scenario: "success-path overhead", table: "Success path, bufconn", row: peerOurs, column: "unary time vs bare", max: 1.01},
	{goal: "unary success path, bufconn: +0 allocations", scenario: "success-path overhead", table: "Success path, bufconn", row: peerOurs, column: "unary extra allocs/call", max: 0.4},
	{goal: "unary success path, TCP: time ≤ 1.01×", scenario: "success-path overhead", table: "Success path, loopback TCP", row: peerOurs, column: "unary time vs bare", max: 1.01},
	{goal: "unary success path, TCP: +0 allocations", scenario: "success-path overhead", table: "Success path, loopback TCP", row: peerOurs, column: "unary extra allocs/call", max: 0.4},
	{goal: "server stream, bufconn: time ≤ 1.02×", scenario: "success-path overhead", table: "Success path, bufconn", row: peerOurs, column: "stream of 10 time vs bare", max: 1.02},
	{goal: "server stream, bufconn: ≤ +2 allocations", scenario: "success-path overhead", table: "Success path, bufconn", row: peerOurs, column: "stream extra allocs/call", max: 2.4},
	{goal: "server stream, TCP: time ≤ 1.02×", scenario: "success-path overhead", table: "Success path, loopback TCP", row: peerOurs, column: "stream of 10 time vs bare", max: 1.02},
	{goal: "server stream, TCP: ≤ +2 allocations", scenario: "success-path overhead", table: "Success path, loopback TCP", row: peerOurs, column: "stream extra allocs/call", max: 2.4},
	{goal: "idempotency, first execution: ≤ 1.03× a bare call", scenario: "idempotency (server)", row: "first execution (new key per call)", column: "time vs bare server", max: 1.03},
	{goal: "idempotency, miss (no key): nothing measurable (≤ 1.01×)", scenario: "idempotency (server)", row: "miss (no key)", column: "time vs bare server", max: 1.01},
	{goal: "idempotency, replay cheaper than running the handler (replay < first execution)", scenario: "idempotency (server)", row: "replay (one key repeated)", column: "time vs bare server", ratioOver: "first execution (new key per call)"},
	{goal: "hedging, fixed delay: p99 ≤ 0.25× unhedged", scenario: "slow tail (hedging)", row: peerOursHedge, column: "p99 vs bare", max: 0.25},
	{goal: "hedging, fixed delay: ≤ 6% extra attempts", scenario: "slow tail (hedging)", row: peerOursHedge, column: "extra attempts", max: 6},
	{goal: "adaptive hedging: p99 ≤ 0.25× unhedged", scenario: "slow tail (hedging)", row: peerOursHedgeQuant, column: "p99 vs bare", max: 0.25},
	{goal: "adaptive hedging: ≤ 6% extra attempts", scenario: "slow tail (hedging)", row: peerOursHedgeQuant, column: "extra attempts", max: 6},
	{goal: "slow tail that triples (issue 20), adaptive hedging: p99 ≤ 0.15× unhedged", scenario: "slow tail that triples (hedging)", row: peerOursHedgeQuant, column: "p99 vs bare", max: 0.15},
	{goal: "slow tail that triples (issue 20), adaptive hedging: ≤ 6% extra attempts", scenario: "slow tail that triples (hedging)", row: peerOursHedgeQuant, column: "extra attempts", max: 6},
	{goal: "slow tail that triples (issue 20), fixed delay rationed: p99 ≤ 0.25× unhedged", scenario: "slow tail that triples (hedging)", row: peerOursHedge, column: "p99 vs bare", max: 0.25},
	{goal: "slow tail that triples (issues 20, 32), fixed delay under the budget: ≤ 15% extra attempts (the budget's fifth over the half every call outlasts it)", scenario: "slow tail that triples (hedging)", row: peerOursHedge, column: "extra attempts", max: 15},
	{goal: "drift, latency ×4 halfway (issue 32), adaptive hedging: p99 ≤ 0.15× unhedged", scenario: "slow tail that quadruples (hedging)", row: peerOursHedgeQuant, column: "p99 vs bare", max: 0.15},
	{goal: "drift, latency ×4 halfway (issue 32), adaptive hedging: load ≤ 1.06 (≤ 6% extra attempts)", scenario: "slow tail that quadruples (hedging)", row: peerOursHedgeQuant, column: "extra attempts", max: 6},
	{goal: "one slow backend of three, default budget, 40 calls/s (issue 32): hedged p99 ≤ 0.5× unhedged", scenario: "hedge-budget", row: hbHedged, column: "p99 / unhedged p99", max: 0.5},
	{goal: "overload (issue 12): admitted p99 ≤ 2× the unloaded p99 under 3× load", scenario: "overload (server)", row: "grpc-resilience", column: "admitted p99 vs unloaded p99", max: 2},
	{goal: "per-method isolation: fast p99 under saturation ≤ 1.5× idle", scenario: "slow method saturating the connection (per-method isolation)", row: peerOurs, column: "fast loaded p99 / own idle p99", max: satLimit},
	{goal: "endpoint (issue 22), one bad backend of three, maxAttempts 2: success ≥ 99.9%", scenario: "endpoint-failing", row: epOursRR, column: "success", max: 99.9, atLeast: true},
	{goal: "endpoint (issue 22), pick_first child: success ≥ 99.9%", scenario: "endpoint-failing", row: epOursPF, column: "success", max: 99.9, atLeast: true},
	{goal: "endpoint (issue 22): the bad backend under 1% of first attempts within 2 s (ms)", scenario: "endpoint-failing", row: epOursRR, column: "under 1% from (ms)", max: 2000},
	{goal: "endpoint (issue 22): back in rotation within its ejection time, 1 s (ms)", scenario: "endpoint-recovery", row: epOursRR, column: "back after (ms)", max: 1000},
	{goal: "endpoint (issue 22): ≥ 99% of hedges to a different endpoint", scenario: "endpoint-hedge", row: epOursHedged, column: "hedges elsewhere", max: 99, atLeast: true},
	{goal: "endpoint (issue 22): whole-cluster outage ejects ≤ 50% (1 of 3)", scenario: "endpoint-outage", row: epOursRR, column: "most ejected at once", max: 1},
	{goal: "endpoint (issue 30), host names: one bad backend of three, success ≥ 99.9%", scenario: "endpoint-failing", row: epOursRR + epHostSuffix, column: "success", max: 99.9, atLeast: true},
	{goal: "endpoint (issue 30), host names, pick_first child: success ≥ 99.9%", scenario: "endpoint-failing", row: epOursPF + epHostSuffix, column: "success", max: 99.9, atLeast: true},
	{goal: "endpoint (issue 30), peak_ewma, one backend 10× slower, no hedging: p99 ≤ 1.5× all-healthy p99", scenario: "endpoint-slow", row: epOursEWMA, column: "p99 / all-healthy p99", max: 1.5},
	{goal: "endpoint (issue 30), hedged on distinct endpoints: p99 ≤ 0.25× unhedged", scenario: "endpoint-hedge", row: epOursHedged, column: "p99 / unhedged p99", max: 0.25},
	{goal: "endpoint (issue 30), a backend restarted in place back within 1 s of READY (ms)", scenario: "endpoint-restart", row: epOursRR, column: "back after READY (ms)", max: 1000},
	{goal: "endpoint (issue 30), scale-down 4 → 3 with 2 ejected: at most 1 ejected after", scenario: "endpoint-scaledown", row: epOursRR, column: "most ejected after", max: 1},
	{goal: "endpoint (issue 30), all healthy: p50 within 1.03× of round_robin (paired)", scenario: "endpoint-healthy", row: epOursRR, column: "p50 ratio", max: 1.03},
	{goal: "endpoint (issue 30), peak_ewma all healthy: p50 within 1.03× of round_robin (paired)", scenario: "endpoint-healthy", row: epOursEWMA, column: "p50 ratio", max: 1.03},
}

// TargetsTable reads issue 10's targets back from results: what was
// measured and whether it meets the goal. A goal whose scenario did not run,
// or whose row is pending, says so.
func TargetsTable(results []Result) Table {
	t := Table{
		Title:  "Targets (issues 10, 20, 22 and 32)",
		Header: []string{"goal", "measured (ours)", "met"},
		Notes: []string{"A local rejection (breaker open, bulkhead full, budget spent) in under 100 ns with 0 allocations is measured " +
			"by the interceptor's own benchmarks (go test -run ^$ -bench Rejection ./interceptor), not here: it is the interceptor alone, not a whole call."},
	}
	for _, g := range issueTargets {
		c, ok := resultCell(results, g.scenario, g.table, g.row, g.column)
		met := "no"
		switch {
		case !ok:
			c, met = "(not run)", "—"
		case !isNumber(c):
			met = "—"
		case g.ratioOver != "":
			other, ok := resultCell(results, g.scenario, g.table, g.ratioOver, g.column)
			if ok && number(c) < number(other) {
				met = "yes"
			}
			c += " (vs " + other + ")"
		case g.atLeast && number(c) >= g.max, !g.atLeast && number(c) <= g.max:
			met = "yes"
		}
		t.Rows = append(t.Rows, []string{g.goal, c, met})
	}
	return t
}

// resultCell returns the cell at row and column of scenario's table
// (the first table that has them when table is "").
func resultCell(results []Result, scenario, table, row, column string) (string, bool) {
	for _, r := range results {
		if r.Scenario.Name != scenario || r.Err != nil {
			continue
		}
		for _, tb := range r.Tables {
			if table != "" && tb.Title != table {
				continue
			}
			col := -1
			for i, h := range tb.Header {
				if h == column {
					col = i
				}
			}
			if col < 0 {
				continue
			}
			for _, rw := range tb.Rows {
				if rw[0] == row {
					return rw[col], true
				}
			}
		}
	}
	return "", false
}

func isNumber(cell string) bool {
	_, err := strconv.ParseFloat(strings.TrimRight(median3(cell), "×%"), 64)
	return err == nil
}

// number parses a cell: "1.03×", "+2.0", "3.8%", or the median of a
// "min / median / max" cell (Summarize).
func number(cell string) float64 {
	f, _ := strconv.ParseFloat(strings.TrimRight(median3(cell), "×%"), 64)
	return f
}

// median3 returns the middle of a "min / median / max" cell, or cell.
func median3(cell string) string {
	if parts := strings.Split(cell, " / "); len(parts) == 3 {
		return parts[1]
	}
	return cell
}
