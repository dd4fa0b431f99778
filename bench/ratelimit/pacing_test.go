package ratelimit

import (
	"context"
	"testing"
	"time"
)

// TestPacingSmoke runs the pacing measurement briefly: the plumbing works,
// and the paced client sends fewer doomed attempts than the retry loop
// (the numbers come from the command, over full runs).
func TestPacingSmoke(t *testing.T) {
	cfg := DefaultPacing()
	cfg.Duration = 500 * time.Millisecond
	plain, err := RunPacing(context.Background(), cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	paced, err := RunPacing(context.Background(), cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%v\n%v", plain, paced)
	if paced.Refused >= plain.Refused || paced.Local == 0 || paced.Admitted == 0 {
		t.Fatalf("paced %v against plain %v: want fewer refused attempts, some local refusals, some admitted", paced, plain)
	}
}
