package bench

import (
	"bytes"
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cellPattern is what a cell may hold: a peer or path name in the first
// column; elsewhere a ratio, a signed count, a share, a plain number, a
// duration in ms, or a parenthesised reason a peer cannot run.
var cellPattern = regexp.MustCompile(`^(-?\d+\.\d\d×|[+-]\d+\.\d|\d+\.\d\d?%|n/a|\d+\.\d\d|\d+|\d+ ms|not within the phase|never|yes|no|—|\(.+\))$`)

// TestSmoke runs every scenario at the tiny size and checks the report's
// structure, and the facts that do not depend on the machine's speed:
// attempt counts and success where the workload fixes them.
func TestSmoke(t *testing.T) {
	scenarios := All()
	start := time.Now()
	results := Run(context.Background(), scenarios, Tiny, nil)
	t.Logf("all scenarios at size tiny: %v", time.Since(start))
	if len(results) != len(scenarios) {
		t.Fatalf("Run returned %d results, want %d", len(results), len(scenarios))
	}
	names := map[string]bool{}
	for _, r := range results {
		if r.Err != nil {
			t.Errorf("scenario %q: %v", r.Scenario.Name, r.Err)
			continue
		}
		if names[r.Scenario.Name] {
			t.Errorf("scenario name %q is not unique", r.Scenario.Name)
		}
		names[r.Scenario.Name] = true
		if r.Scenario.Workload == "" || len(r.Tables) == 0 {
			t.Errorf("scenario %q: workload %q, %d tables; want a documented workload and a table", r.Scenario.Name, r.Scenario.Workload, len(r.Tables))
		}
		for _, tb := range r.Tables {
			checkTable(t, r.Scenario.Name, tb)
		}
	}

	// Facts fixed by the workloads.
	want := []struct {
		scenario, row, column, cell string
	}{
		{"endpoint-failing", epOursRR, "retries to the bad backend", "0"},
		{"endpoint-failing", epOursPF, "retries to the bad backend", "0"},
		{"endpoint-failing", epOursRR + epHostSuffix, "retries to the bad backend", "0"},
		{"endpoint-failing", epOursPF + epHostSuffix, "retries to the bad backend", "0"},
		{"endpoint-failing", "grpc-go retry, pick_first", "success", "0.00%"},
		{"endpoint-hedge", epOursHedged, "hedges elsewhere", "100.00%"},
		{"transient failures", peerBare, "success", "0.0%"},
		{"transient failures", peerBare, "attempts/call", "1.00"},
		{"transient failures", peerGRPC, "attempts/call", "3.00"},
		{"transient failures", peerGRPC, "success", "100.0%"},
		{"transient failures", peerGGM, "attempts/call", "3.00"},
		{"transient failures", peerFailsafe, "attempts/call", "3.00"},
		{"transient failures", peerOurs, "success", "100.0%"},
		{"full outage", peerBare, "attempts/call", "1.00"},
		{"full outage", peerGRPC, "attempts/call", "4.00"},
		{"full outage", peerGGM, "attempts/call", "4.00"},
		{"full outage", peerFailsafe, "success", "0.0%"},
		{"success-path overhead", peerFailsafe, "stream of 10 time vs bare", "(no stream interceptor in failsafegrpc)"},
		{"slow tail (hedging)", peerGRPC, "p50 vs bare", "(no hedging in grpc-go)"},
		{"slow tail (hedging)", peerBare, "extra attempts", "0.0%"},
		{"slow tail (hedging)", peerBare, "success", "100.0%"},
		{"slow tail (hedging)", peerOursHedge, "success", "100.0%"},
	}
	if !raceEnabled {
		want = append(want, struct{ scenario, row, column, cell string }{"slow tail (hedging)", peerFailsafeHedge, "success", "100.0%"})
	}
	for _, w := range want {
		if got := cell(results, w.scenario, w.row, w.column); got != w.cell {
			t.Errorf("%s: %s, %s = %q, want %q", w.scenario, w.row, w.column, got, w.cell)
		}
	}

	var buf bytes.Buffer
	WriteReport(&buf, results, Tiny, ThisMachine(), time.Since(start), "")
	targets := TargetsTable(results)
	if len(targets.Rows) != len(issueTargets) {
		t.Errorf("TargetsTable has %d rows, want %d", len(targets.Rows), len(issueTargets))
	}
	for _, row := range targets.Rows {
		if row[1] == "(not run)" && !strings.HasPrefix(row[0], "adaptive") {
			t.Errorf("target %q: its cell is missing from the results", row[0])
		}
	}
	for _, s := range []string{"# Benchmarks", "GOMAXPROCS", "### Targets (issues 10, 20, 22 and 32)", "google.golang.org/grpc v1.", "github.com/failsafe-go/failsafe-go v", "## transient failures"} {
		if !strings.Contains(buf.String(), s) {
			t.Errorf("report lacks %q", s)
		}
	}
}

func checkTable(t *testing.T, scenario string, tb Table) {
	t.Helper()
	if len(tb.Header) < 2 || len(tb.Rows) == 0 {
		t.Errorf("%s: table %q has %d columns and %d rows", scenario, tb.Title, len(tb.Header), len(tb.Rows))
		return
	}
	for _, row := range tb.Rows {
		if len(row) != len(tb.Header) {
			t.Errorf("%s: row %q has %d cells, header %d", scenario, row[0], len(row), len(tb.Header))
			continue
		}
		for i, c := range row[1:] {
			if !cellPattern.MatchString(c) {
				t.Errorf("%s: row %q, column %q: cell %q is not a ratio, count, share or reason", scenario, row[0], tb.Header[i+1], c)
			}
		}
	}
}

// cell returns the cell of scenario's first table with that row and column.
func cell(results []Result, scenario, row, column string) string {
	c, ok := resultCell(results, scenario, "", row, column)
	if !ok {
		return "(missing)"
	}
	return c
}

// TestScenarioRegistry pins that the registry is the list the command and
// the smoke test run, with unique names.
func TestScenarioRegistry(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range All() {
		if s.Name == "" || s.Run == nil || seen[s.Name] {
			t.Errorf("scenario %q: empty name, nil Run or duplicate", s.Name)
		}
		seen[s.Name] = true
	}
}

// TestOursConfigsParse pins that every service config ours is given parses.
func TestOursConfigsParse(t *testing.T) {
	p := DefaultPolicy
	p.SlowBulkhead = satSlowBulkhead
	for _, doc := range []string{oursConfig(DefaultPolicy), oursConfig(p), oursHedgeConfig(DefaultPolicy, "")} {
		if _, err := oursClient(doc); err != nil {
			t.Errorf("oursClient(%s) = %v", doc, err)
		}
	}
}

// TestSlowTailPassedConfig pins that a hedgingPolicy passed in the Policy
// gets its own row with numbers (the row the adaptive-delay config fills
// once it exists); a fixed-delay object stands in for it here.
func TestSlowTailPassedConfig(t *testing.T) {
	pol := DefaultPolicy
	pol.OursHedgeConfig = `{"maxAttempts": 2, "hedgingDelay": "0.004s"}`
	tables, err := SlowTail(pol).Run(context.Background(), Tiny)
	if err != nil {
		t.Fatalf("SlowTail(passed config).Run = %v", err)
	}
	results := []Result{{Scenario: SlowTail(pol), Tables: tables}}
	if got := cell(results, "slow tail (hedging)", peerOursHedgeQuant, "success"); got != "100.0%" {
		t.Errorf("passed-config row: success = %q, want 100.0%%", got)
	}
	if got := cell(results, "slow tail (hedging)", peerOursHedgeQuant, "p99 vs bare"); !isNumber(got) {
		t.Errorf("passed-config row: p99 vs bare = %q, want a ratio", got)
	}
}

// TestSummarizeReportsMinMedianMax pins cmd/compare -repeat's cells: each
// number of several runs as min / median / max in the cell's own style,
// and a spread read back by its median for the targets.
func TestSummarizeReportsMinMedianMax(t *testing.T) {
	run := func(cells ...string) []Result {
		return []Result{{Scenario: Scenario{Name: "s"}, Tables: []Table{{
			Header: []string{"peer", "a", "b", "c", "d"},
			Rows:   [][]string{append([]string{"ours"}, cells...)},
		}}}}
	}
	got := Summarize([][]Result{run("0.20×", "5.0%", "+4.0", "x"), run("0.10×", "6.5%", "+2.0", "y"), run("0.15×", "4.0%", "+3.0", "z")})
	want := []string{"ours", "0.10× / 0.15× / 0.20×", "4.0% / 5.0% / 6.5%", "+2.0 / +3.0 / +4.0", "x"}
	if row := got[0].Tables[0].Rows[0]; !slices.Equal(row, want) {
		t.Errorf("Summarize row = %q, want %q", row, want)
	}
	if n := number("0.10× / 0.15× / 0.20×"); n != 0.15 {
		t.Errorf("number of a spread = %v, want its median 0.15", n)
	}
}
