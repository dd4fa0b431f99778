package bench

import (
	"context"
	"testing"
)

// TestBudgetScenario pins the counts the budget scenario's workloads fix:
// without a budget every transient call succeeds in 3 attempts and a
// server that is down gets all 4 of every call. (At the tiny size the
// budget's 10 retries per second cover every retry, so the budgeted rows
// are only checked for their shape.)
func TestBudgetScenario(t *testing.T) {
	tables, err := Budget().Run(context.Background(), Tiny)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, r := range tables[0].Rows {
		rows[r[0]] = r[1:]
	}
	if got := rows["ours, no retry budget"]; len(got) != 5 || got[0] != "100.0%" || got[1] != "3.00" || got[2] != "4.00" {
		t.Errorf("no budget: %q, want 100.0%% and 3.00 attempts on transient failures, 4.00 in the outage", got)
	}
	for _, name := range []string{"ours, default retry budget", "ours, retry budget ratio 0.5"} {
		if got := rows[name]; len(got) != 5 {
			t.Errorf("%s: %q, want 5 cells", name, got)
		}
	}
}
