package main

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// TestBreakerTransitionFollowsTheCallThatCausedIt: the breaker part prints
// each transition after the line of the call whose attempt caused it (the
// state-change hook runs inside that call, before its line is printed), so
// the reader sees cause, then effect.
func TestBreakerTransitionFollowsTheCallThatCausedIt(t *testing.T) {
	defer goleak.VerifyNone(t)
	var out bytes.Buffer
	if err := breakerDemo(&out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	after := func(transition string) string {
		for i, l := range lines {
			if strings.Contains(l, transition) {
				for j := i - 1; j >= 0; j-- {
					if !strings.Contains(lines[j], "moved the breaker") {
						return lines[j]
					}
				}
			}
		}
		t.Fatalf("no line says %q:\n%s", transition, out.String())
		return ""
	}
	// consecutiveFailures 4, 2 attempts per call: the second call's second
	// attempt opens the breaker.
	if got := after("closed -> open"); !strings.HasPrefix(got, "Echo   2:") {
		t.Errorf("closed -> open follows %q, want the line of call 2, which opened it:\n%s", got, out.String())
	}
	if got := after("half-open -> closed"); !strings.HasPrefix(got, "Echo after the server healed") {
		t.Errorf("half-open -> closed follows %q, want the line of the call that closed it:\n%s", got, out.String())
	}
}
