package overload

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestRunSmoke runs a tiny scenario: every contender reports, the numbers
// are in range, and the markdown names them.
func TestRunSmoke(t *testing.T) {
	rep, err := Run(Config{
		Tokens: 2, Service: 10 * time.Millisecond, Deadline: 200 * time.Millisecond,
		LowFor: 200 * time.Millisecond, HighFor: 500 * time.Millisecond, After: 250 * time.Millisecond,
		Settle: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 3 {
		t.Fatalf("Run gave %d results, want 3", len(rep.Results))
	}
	md := rep.Markdown()
	for _, r := range rep.Results {
		if r.Calls == 0 || r.Goodput < 0 || r.Goodput > 1.5 || r.UnloadedP99 < 10*time.Millisecond {
			t.Errorf("%s: implausible %+v", r.Name, r)
		}
		if !strings.Contains(md, "| "+r.Name+" |") {
			t.Errorf("markdown lacks %q:\n%s", r.Name, md)
		}
	}
	t.Log("\n" + md)
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"too long", Config{HighFor: time.Minute}},
		{"settle past overload", Config{HighFor: time.Second, Settle: 2 * time.Second}},
		{"negative load", Config{High: -1}},
		{"too many calls", Config{Tokens: 10000, Service: time.Millisecond}},
	}
	for _, tt := range tests {
		if _, err := Run(tt.cfg); err == nil {
			t.Errorf("Run(%s) = nil error", tt.name)
		}
	}
}

// TestRunDefault runs the default scenario (about 30s of real time) when
// OVERLOAD_BENCH=1, and checks the claims of the overload issue: ours at
// least as good as failsafe-go on goodput and admitted p99.
func TestRunDefault(t *testing.T) {
	if os.Getenv("OVERLOAD_BENCH") != "1" {
		t.Skip("set OVERLOAD_BENCH=1 to run the default scenario (about 30s)")
	}
	rep, err := Run(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.Markdown())
	bare, fs, ours := rep.Results[0], rep.Results[1], rep.Results[2]
	if ours.Goodput < 0.9 || ours.Goodput < bare.Goodput {
		t.Errorf("our goodput %.2f, want ≥ 0.9 and ≥ no protection's %.2f", ours.Goodput, bare.Goodput)
	}
	if ours.Goodput < fs.Goodput-0.02 || ours.AdmittedP99 > fs.AdmittedP99+fs.AdmittedP99/10 {
		t.Errorf("ours (goodput %.3f, p99 %v) is behind failsafe-go's (%.3f, %v)", ours.Goodput, ours.AdmittedP99, fs.Goodput, fs.AdmittedP99)
	}
}
