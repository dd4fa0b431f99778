package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if v := os.Getenv(ChildEnv); v != "" { // a replica process of TestDistributedSmoke
		var args ChildArgs
		if err := json.Unmarshal([]byte(v), &args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if err := RunChild(args, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// TestDistributedSmoke runs the distributed measurement briefly, with this
// test binary as the replica processes: the plumbing (processes, per-second
// reports, round trips) works, and, in either mode, the run admits no
// more than the burst and the rate over its time (a token is never spent
// before its slot on Redis's schedule, and the calls start together).
func TestDistributedSmoke(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server not on PATH (CI is set: Redis tests must not be skipped)")
		}
		t.Skip("redis-server not on PATH")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"leased", "envoy"} {
		cfg := DistConfig{Replicas: 2, Rate: 200, Burst: 10, Load: 3, Shares: []float64{0.5, 0.5}, Duration: 2 * time.Second, Mode: mode}
		r, err := Distributed(context.Background(), cfg, self)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if r.Admitted == 0 || r.RoundTrips == 0 {
			t.Fatalf("%s: %+v: nothing admitted or no round trip", mode, r)
		}
		total := 0
		for _, n := range r.A {
			total += n
		}
		if total > 10+200*2+1 {
			t.Errorf("%s: tenant a: %d admitted in 2 s, over the burst and the rate (411)", mode, total)
		}
		t.Logf("%s: tenant a %v, tenant b %v, %d round trips", mode, r.A, r.B, r.RoundTrips)
	}
}

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
