package interceptor

import (
	"context"
	"strconv"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/wire"
)

// Moved from the server's criticality tests by the package split: it pins
// the client's side (retryCriticality, attemptContext).

// TestRetryAttemptsAreSheddablePlus: attempts after the first carry
// SHEDDABLE_PLUS with grpc-previous-rpc-attempts; the first attempt's
// context is the caller's, with no allocation.
func TestRetryAttemptsAreSheddablePlus(t *testing.T) {
	if retryCriticality != wire.SheddablePlus.String() {
		t.Fatalf("retryCriticality = %q, want %q", retryCriticality, wire.SheddablePlus.String())
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
		if got := md.Get(wire.CriticalityKey); len(got) != 1 || got[0] != "SHEDDABLE_PLUS" {
			t.Errorf("attempt %d: criticality %q, want [SHEDDABLE_PLUS]", n, got)
		}
		if got := md.Get(previousAttemptsKey); len(got) != 1 || got[0] != strconv.Itoa(n-1) {
			t.Errorf("attempt %d: previous attempts %q, want %d", n, got, n-1)
		}
	}
}
