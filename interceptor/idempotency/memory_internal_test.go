package idempotency

import (
	"strconv"
	"strings"
	"testing"
)

func TestMemTokensAreTheCounterInBase32(t *testing.T) {
	var tok memTokens
	tok.n = 1<<40 - 2*memTokenChunk // chunks start at multiples of the chunk; cross a carry into the upper digits
	for range 3 * memTokenChunk {
		n := tok.n
		want := strconv.FormatUint(n, 32)
		want = strings.Repeat("0", memTokenLen-len(want)) + want
		if got := tok.next(); got != want {
			t.Fatalf("token %d = %q, want %q", n, got, want)
		}
	}
}
