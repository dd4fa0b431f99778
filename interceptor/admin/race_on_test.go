//go:build race

package admin

// raceEnabled is true when the race detector is on: the exact allocation
// tests skip (sync.Pool drops items under it).
const raceEnabled = true
