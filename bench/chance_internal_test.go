package bench

import (
	"strconv"
	"testing"
)

// TestChanceUniform pins that the deterministic draws are spread evenly:
// the share below p over many calls is close to p.
func TestChanceUniform(t *testing.T) {
	for _, p := range []float64{0.05, 0.2, 0.5} {
		n, below := 20000, 0
		for i := range n {
			if chance(randomSeed, "c"+strconv.Itoa(i), 1+i%3) < p {
				below++
			}
		}
		if got := float64(below) / float64(n); got < p-0.01 || got > p+0.01 {
			t.Errorf("share of chance(...) < %v = %v, want %v ± 0.01", p, got, p)
		}
	}
}
