//go:build splittodo

package server

import (
	"context"
	"strconv"
	"testing"

	"google.golang.org/grpc/metadata"
)

func TestParseCriticality(t *testing.T) {
	tests := []struct {
		in   string
		want Criticality
		ok   bool
	}{
		{"CRITICAL_PLUS", CriticalPlus, true},
		{"CRITICAL", Critical, true},
		{"sheddable_plus", SheddablePlus, true},
		{"Sheddable", Sheddable, true},
		{"", Critical, false},
		{"URGENT", Critical, false},
		{"CRITICAL ", Critical, false},
	}
	for _, tt := range tests {
		got, ok := ParseCriticality(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseCriticality(%q) = %v, %v, want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
		if ok && got.String() != stringsToUpper(tt.in) {
			t.Errorf("ParseCriticality(%q).String() = %q", tt.in, got.String())
		}
	}
	if got := Criticality(9).String(); got != "Criticality(9)" {
		t.Errorf("Criticality(9).String() = %q", got)
	}
}

func stringsToUpper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// TestIncomingCriticalityLowestWins pins the reading of untrusted values:
// the least critical valid value counts, invalid values are ignored, and
// none means CRITICAL.
func TestIncomingCriticalityLowestWins(t *testing.T) {
	tests := []struct {
		name string
		vals []string
		want Criticality
	}{
		{"none", nil, Critical},
		{"one", []string{"CRITICAL_PLUS"}, CriticalPlus},
		{"retry lowers critical", []string{"CRITICAL", "SHEDDABLE_PLUS"}, SheddablePlus},
		{"retry keeps sheddable", []string{"SHEDDABLE", "SHEDDABLE_PLUS"}, Sheddable},
		{"retry lowers critical plus", []string{"CRITICAL_PLUS", "SHEDDABLE_PLUS"}, SheddablePlus},
		{"invalid ignored", []string{"bogus", "CRITICAL_PLUS"}, CriticalPlus},
		{"only invalid", []string{"bogus"}, Critical},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			md := metadata.MD{}
			for _, v := range tt.vals {
				md.Append(CriticalityKey, v)
			}
			ctx := metadata.NewIncomingContext(context.Background(), md)
			if got := incomingCriticality(ctx); got != tt.want {
				t.Errorf("incomingCriticality(%q) = %v, want %v", tt.vals, got, tt.want)
			}
		})
	}
}

func FuzzIncomingCriticality(f *testing.F) {
	for _, s := range []string{"", "CRITICAL", "sheddable", "\xff", "CRITICAL_PLUS"} {
		f.Add(s, "SHEDDABLE_PLUS")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.MD{CriticalityKey: {a, b}})
		got := incomingCriticality(ctx)
		if got > Sheddable {
			t.Fatalf("incomingCriticality(%q, %q) = %v", a, b, got)
		}
		// Adding a value to a valid one never raises the criticality.
		one := incomingCriticality(metadata.NewIncomingContext(context.Background(), metadata.MD{CriticalityKey: {a}}))
		if _, valid := ParseCriticality(a); valid && got.rank() > one.rank() {
			t.Fatalf("%q then %q = %v, above %q alone = %v", a, b, got, a, one)
		}
	})
}

// TestContextWithCriticalityReplaces: the helper sets the key, replacing
// an earlier value, and leaves the rest of the metadata alone.
func TestContextWithCriticalityReplaces(t *testing.T) {
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-other", "v")
	ctx = ContextWithCriticality(ctx, Sheddable)
	ctx = ContextWithCriticality(ctx, CriticalPlus)
	md, _ := metadata.FromOutgoingContext(ctx)
	if got := md.Get(CriticalityKey); len(got) != 1 || got[0] != "CRITICAL_PLUS" {
		t.Errorf("criticality = %q, want [CRITICAL_PLUS]", got)
	}
	if got := md.Get("x-other"); len(got) != 1 {
		t.Errorf("x-other = %q, want it kept", got)
	}
}

// TestRetryAttemptsAreSheddablePlus: attempts after the first carry
// SHEDDABLE_PLUS with grpc-previous-rpc-attempts; the first attempt's
// context is the caller's, with no allocation.
func TestRetryAttemptsAreSheddablePlus(t *testing.T) {
	if retryCriticality != SheddablePlus.String() {
		t.Fatalf("retryCriticality = %q, want %q", retryCriticality, SheddablePlus.String())
	}
	bg := context.Background()
	if attemptContext(bg, 1) != bg {
		t.Errorf("first attempt's context changed")
	}
	if n := testing.AllocsPerRun(100, func() { _ = attemptContext(bg, 1) }); n != 0 {
		t.Errorf("first attempt allocs = %v, want 0", n)
	}
	for _, n := range []int{2, 7, 8, 12} {
		md, _ := metadata.FromOutgoingContext(attemptContext(bg, n))
		if got := md.Get(CriticalityKey); len(got) != 1 || got[0] != "SHEDDABLE_PLUS" {
			t.Errorf("attempt %d: criticality %q, want [SHEDDABLE_PLUS]", n, got)
		}
		if got := md.Get(previousAttemptsKey); len(got) != 1 || got[0] != strconv.Itoa(n-1) {
			t.Errorf("attempt %d: previous attempts %q, want %d", n, got, n-1)
		}
	}
}
