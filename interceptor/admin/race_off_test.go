//go:build !race

package admin

const raceEnabled = false
