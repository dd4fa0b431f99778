//go:build !race

package endpoint

// raceEnabled is true under the race detector, which makes sync.Pool drop
// items on purpose: the exact allocation tests skip.
const raceEnabled = false
