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
}
