package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// Size scales every scenario's workload. The workloads themselves (what
// the server does, how many callers, which policy) are fixed and documented
// on each scenario; a Size only says how long to run them.
type Size struct {
	// Name is printed in the report.
	Name string
	// Pairs is the number of timed calls per side (bare and peer) in the
	// paired success-path and idempotency scenarios.
	Pairs int
	// Calls is the number of logical calls per peer in the count-based
	// failure and tail scenarios.
	Calls int
	// Phase is the length of one phase (outage, recovery, saturation).
	Phase time.Duration
	// Rate is the open-loop arrival rate, in calls per second.
	Rate float64
}

// Sizes are the named sizes the command accepts; Default fits the whole run
// in under 5 minutes on 2 cores, Tiny is the smoke test's.
var (
	Default = Size{Name: "default", Pairs: 4000, Calls: 800, Phase: time.Second, Rate: 200}
	Tiny    = Size{Name: "tiny", Pairs: 40, Calls: 20, Phase: 100 * time.Millisecond, Rate: 100}
)

// Table is one markdown table of a scenario's result.
type Table struct {
	// Title heads the table.
	Title string
	// Header names the columns; the first is the peer.
	Header []string
	// Rows hold one cell per column.
	Rows [][]string
	// Notes are printed under the table.
	Notes []string
}

// Scenario is one fixed, documented workload run through every peer.
type Scenario struct {
	// Name is short and unique; the command's -run flag matches it.
	Name string
	// Workload documents exactly what runs: server behaviour, callers,
	// policy, and what each column means.
	Workload string
	// Run runs the workload at size sz and returns its tables. It must end
	// within a bound set by sz, and leave no goroutine or server behind.
	Run func(ctx context.Context, sz Size) ([]Table, error)
}

// All returns the scenarios of this package in report order. A scenario
// from another package (bench/overload) is one more entry in the command's
// list (cmd/compare's scenarios function).
func All() []Scenario {
	return []Scenario{
		SuccessPath(),
		Transient(),
		Outage(),
		OutageRecovery(),
		RandomFailures(),
		Budget(),
		Saturation(),
		SlowTail(DefaultPolicy),
		SlowTailTriples(),
		SlowTailQuadruples(),
		Idempotency(),
		IdempotencyStores(),
		JoinedUnderLoad(),
		Overload(),
		EndpointFailing(),
		EndpointRecovery(),
		EndpointHedge(),
		HedgeBudget(),
		EndpointOutage(),
		EndpointSlow(),
		EndpointPause(),
		EndpointRestart(),
		EndpointScaleDown(),
		EndpointHealthy(),
		EndpointEjectedP50(),
	}
}

// Result is one scenario's outcome.
type Result struct {
	Scenario Scenario      // the scenario that ran
	Tables   []Table       // its tables; nil when Err is set
	Err      error         // why it failed, or nil
	Elapsed  time.Duration // its wall-clock time, for the progress report only
}

// Run runs every scenario in order at size sz, reporting progress to
// progress (may be nil). A failing scenario is recorded and the rest run.
func Run(ctx context.Context, scenarios []Scenario, sz Size, progress io.Writer) []Result {
	if progress == nil {
		progress = io.Discard
	}
	results := make([]Result, 0, len(scenarios))
	for _, s := range scenarios {
		start := time.Now()
		fmt.Fprintf(progress, "running %s ...\n", s.Name)
		tables, err := s.Run(ctx, sz)
		r := Result{Scenario: s, Tables: tables, Err: err, Elapsed: time.Since(start)}
		fmt.Fprintf(progress, "  %s done in %.1fs\n", s.Name, r.Elapsed.Seconds())
		if err != nil {
			fmt.Fprintf(progress, "  %s failed: %v\n", s.Name, err)
		}
		results = append(results, r)
	}
	return results
}

// Markdown renders results as markdown sections, one per scenario.
func Markdown(w io.Writer, results []Result) {
	for _, r := range results {
		fmt.Fprintf(w, "## %s\n\n%s\n\n", r.Scenario.Name, r.Scenario.Workload)
		if r.Err != nil {
			fmt.Fprintf(w, "**Failed:** %v\n\n", r.Err)
			continue
		}
		for _, t := range r.Tables {
			writeTable(w, t)
		}
	}
}

func writeTable(w io.Writer, t Table) {
	if t.Title != "" {
		fmt.Fprintf(w, "### %s\n\n", t.Title)
	}
	fmt.Fprintf(w, "| %s |\n", strings.Join(t.Header, " | "))
	fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(t.Header)))
	for _, row := range t.Rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Fprintln(w)
	for _, n := range t.Notes {
		fmt.Fprintf(w, "- %s\n", n)
	}
	if len(t.Notes) > 0 {
		fmt.Fprintln(w)
	}
}

// peerNotes lists each peer's configuration note: what it runs with and
// what it cannot express.
func peerNotes(ps []peer) []string {
	notes := make([]string, 0, len(ps))
	for _, p := range ps {
		notes = append(notes, fmt.Sprintf("%s: %s", p.name, p.note))
	}
	return notes
}
