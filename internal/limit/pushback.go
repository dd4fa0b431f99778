package limit

import (
	"slices"
	"time"
)

// InitialServiceTime stands for the smoothed latency in the pushback
// before any request completed, so that the first requests shed are not
// told to come back after a millisecond.
const InitialServiceTime = 100 * time.Millisecond

// pushback is the wait of the package doc, s·(1 + x/(1 − x)) with s the
// smoothed latency (InitialServiceTime while it is 0), rounded up to a
// step of the pushback grid; NoRetry from x = 1/2.
func pushback(srtt, x float64) time.Duration {
	if x >= 0.5 {
		return NoRetry
	}
	if srtt == 0 {
		srtt = float64(InitialServiceTime)
	}
	return stepUp(time.Duration(srtt * (1 + x/(1-x))))
}

// grid is the pushback's steps, in milliseconds: every millisecond up to
// 10, then the E12 series (10, 12, 15, 18, 22, 27, 33, 39, 47, 56, 68, 82
// times a power of ten) up to 10,000s. A step is at most 25% above the one
// before, so rounding up to the grid lengthens the wait by at most that,
// and a server can keep one status per step (see PushbackStep).
var grid = func() []int64 {
	g := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	e12 := []int64{12, 15, 18, 22, 27, 33, 39, 47, 56, 68, 82, 100}
	for mult := int64(1); mult <= 100_000; mult *= 10 {
		for _, e := range e12 {
			g = append(g, e*mult)
		}
	}
	return g
}()

// stepUp rounds d up to the grid: to the millisecond, at least 1ms, then
// to the next step; beyond the grid, to the millisecond.
func stepUp(d time.Duration) time.Duration {
	ms := max(1, int64((d+time.Millisecond-1)/time.Millisecond))
	if i, _ := slices.BinarySearch(grid, ms); i < len(grid) {
		ms = grid[i]
	}
	return time.Duration(ms) * time.Millisecond
}

// PushbackSteps is the number of steps of the pushback grid.
var PushbackSteps = len(grid)

// PushbackStep returns the index of a pushback a Limiter or BBR returned
// in its grid, in [0, PushbackSteps), so that a server can keep one status
// per step; -1 for NoRetry or a pushback beyond the grid (over 10,000s).
func PushbackStep(d time.Duration) int {
	if d <= 0 || d%time.Millisecond != 0 {
		return -1
	}
	i, found := slices.BinarySearch(grid, int64(d/time.Millisecond))
	if !found {
		return -1
	}
	return i
}
