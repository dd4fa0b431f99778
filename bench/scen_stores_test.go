package bench

import (
	"context"
	"os"
	"strconv"
	"testing"
)

// TestIdempotencyStoresRoundTrips runs the stores scenario at the tiny
// size and pins what does not depend on the machine: the round trips per
// call (issue 23: joined mode adds at most one to the handler's own
// transaction on a first execution; a replay costs one).
func TestIdempotencyStoresRoundTrips(t *testing.T) {
	tables, err := IdempotencyStores().Run(context.Background(), Tiny)
	if err != nil {
		t.Fatal(err)
	}
	results := []Result{{Scenario: IdempotencyStores(), Tables: tables}}
	if _, ok := resultCell(results, "idempotency stores", "", sideJoined, "round trips, first"); !ok {
		if os.Getenv("CI") != "" {
			t.Fatalf("no joined row: %v", tables)
		}
		t.Skipf("PostgreSQL or Redis missing: %v", tables[0].Rows)
	}
	num := func(row, col string) float64 {
		c := cell(results, "idempotency stores", row, col)
		x, err := strconv.ParseFloat(c, 64)
		if err != nil {
			t.Fatalf("%s, %s = %q, want a number", row, col, c)
		}
		return x
	}
	alone := num(sideAlone, "round trips, first")
	if got := num(sideJoined, "round trips, first"); got > alone+1 {
		t.Errorf("joined first execution = %.2f round trips, want at most the handler's own %.2f + 1", got, alone)
	}
	if got := num(sideJoined, "round trips, replay"); got != 1 {
		t.Errorf("joined replay = %.2f round trips, want 1", got)
	}
	if got := num(sideLease, "round trips, replay"); got != 1 {
		t.Errorf("lease-mode replay = %.2f round trips, want 1", got)
	}
	if got := num(sideJoined, "round trips, duplicate in progress"); got != 1 {
		t.Errorf("joined duplicate of a call in progress = %.2f round trips, want 1", got)
	}
}

// TestJoinedUnderLoadAbortsNoNewKey runs the joined-mode load scenario at
// the tiny size and pins what does not depend on the machine: no call with
// a new key is ABORTED while Migrate runs (issue 31: the previous Migrate
// made claims of unrelated keys read "in progress"). The timings are the
// report's.
func TestJoinedUnderLoadAbortsNoNewKey(t *testing.T) {
	tables, err := JoinedUnderLoad().Run(context.Background(), Tiny)
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 2 {
		if os.Getenv("CI") != "" {
			t.Fatalf("tables = %v", tables)
		}
		t.Skipf("PostgreSQL missing: %v", tables)
	}
	for _, row := range tables[0].Rows[:2] { // no migration; pgstore.Migrate
		if row[5] != "0" || row[6] != "0" {
			t.Errorf("%s: %s ABORTED, %s other errors; want none", row[0], row[5], row[6])
		}
	}
}
