//go:build !race

package server

// raceEnabled is true when the race detector is on: tests of a size that
// takes seconds without it skip their largest rows.
const raceEnabled = false
