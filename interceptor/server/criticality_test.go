package server

import (
	"context"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/wire"
)

func TestParseCriticality(t *testing.T) {
	tests := []struct {
		in   string
		want wire.Criticality
		ok   bool
	}{
		{"CRITICAL_PLUS", wire.CriticalPlus, true},
		{"CRITICAL", wire.Critical, true},
		{"sheddable_plus", wire.SheddablePlus, true},
		{"Sheddable", wire.Sheddable, true},
		{"", wire.Critical, false},
		{"URGENT", wire.Critical, false},
		{"CRITICAL ", wire.Critical, false},
	}
	for _, tt := range tests {
		got, ok := wire.ParseCriticality(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseCriticality(%q) = %v, %v, want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
		if ok && got.String() != stringsToUpper(tt.in) {
			t.Errorf("ParseCriticality(%q).String() = %q", tt.in, got.String())
		}
	}
	if got := wire.Criticality(9).String(); got != "Criticality(9)" {
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
		want wire.Criticality
	}{
		{"none", nil, wire.Critical},
		{"one", []string{"CRITICAL_PLUS"}, wire.CriticalPlus},
		{"retry lowers critical", []string{"CRITICAL", "SHEDDABLE_PLUS"}, wire.SheddablePlus},
		{"retry keeps sheddable", []string{"SHEDDABLE", "SHEDDABLE_PLUS"}, wire.Sheddable},
		{"retry lowers critical plus", []string{"CRITICAL_PLUS", "SHEDDABLE_PLUS"}, wire.SheddablePlus},
		{"invalid ignored", []string{"bogus", "CRITICAL_PLUS"}, wire.CriticalPlus},
		{"only invalid", []string{"bogus"}, wire.Critical},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			md := metadata.MD{}
			for _, v := range tt.vals {
				md.Append(wire.CriticalityKey, v)
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
		ctx := metadata.NewIncomingContext(context.Background(), metadata.MD{wire.CriticalityKey: {a, b}})
		got := incomingCriticality(ctx)
		if got > wire.Sheddable {
			t.Fatalf("incomingCriticality(%q, %q) = %v", a, b, got)
		}
		// Adding a value to a valid one never raises the criticality.
		one := incomingCriticality(metadata.NewIncomingContext(context.Background(), metadata.MD{wire.CriticalityKey: {a}}))
		if _, valid := wire.ParseCriticality(a); valid && rank(got) > rank(one) {
			t.Fatalf("%q then %q = %v, above %q alone = %v", a, b, got, a, one)
		}
	})
}

// TestContextWithCriticalityReplaces: the helper sets the key, replacing
// an earlier value, and leaves the rest of the metadata alone.
func TestContextWithCriticalityReplaces(t *testing.T) {
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-other", "v")
	ctx = wire.ContextWithCriticality(ctx, wire.Sheddable)
	ctx = wire.ContextWithCriticality(ctx, wire.CriticalPlus)
	md, _ := metadata.FromOutgoingContext(ctx)
	if got := md.Get(wire.CriticalityKey); len(got) != 1 || got[0] != "CRITICAL_PLUS" {
		t.Errorf("criticality = %q, want [CRITICAL_PLUS]", got)
	}
	if got := md.Get("x-other"); len(got) != 1 {
		t.Errorf("x-other = %q, want it kept", got)
	}
}
