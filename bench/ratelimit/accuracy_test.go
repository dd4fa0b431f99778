package ratelimit

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestAccuracySmoke runs the measurement briefly and checks what does not
// depend on the machine: calls were offered, no more were admitted than
// the limit allows over the elapsed time.
func TestAccuracySmoke(t *testing.T) {
	cfg := AccuracyConfig{Rate: 200, Burst: 5, Load: 3, Duration: 300 * time.Millisecond, Senders: 2}
	r, err := Accuracy(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.Offered == 0 {
		t.Fatal("nothing offered")
	}
	if max := int64(cfg.Rate*r.Elapsed.Seconds()) + int64(cfg.Burst) + 1; r.Admitted > max {
		t.Fatalf("admitted %d over %v, more than the limit allows (%d)", r.Admitted, r.Elapsed, max)
	}
}
