//go:build !race

package bench

// raceEnabled reports whether the race detector is on: failsafe-go's hedge
// row is then skipped (see failsafeHedge).
const raceEnabled = false
