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
	if len(rep.Results) != 6 {
		t.Fatalf("Run gave %d results, want 6 (three servers, plain and retrying clients)", len(rep.Results))
	}
	md := rep.Markdown()
	for _, r := range rep.Results {
		if r.Calls == 0 || r.Goodput < 0 || r.Goodput > 1.5 || r.UnloadedP99 < 10*time.Millisecond {
			t.Errorf("%s: implausible %+v", r.Name, r)
		}
		if !strings.Contains(md, "| "+r.Name+" | ") {
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

// TestSuiteSmoke runs every scenario but the step once on a tiny server
// when OVERLOAD_BENCH=1 (about a minute): each reports its tables and the
// targets.
func TestSuiteSmoke(t *testing.T) {
	if os.Getenv("OVERLOAD_BENCH") != "1" {
		t.Skip("set OVERLOAD_BENCH=1 to run the suite once (about a minute); cmd/overload runs it in full")
	}
	s := &Suite{Runs: 1, Only: []string{ScenHostile, ScenFairness, ScenThrottle, ScenRecovery}}
	if err := s.Run(); err != nil {
		t.Fatal(err)
	}
	md := s.Markdown()
	t.Log("\n" + md)
	for _, want := range []string{tHostile, tFair, tIso, tOutage, tQuota, tRecover, "Targets of issues 19 and 32"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}
