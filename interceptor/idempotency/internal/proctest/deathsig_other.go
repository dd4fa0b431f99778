//go:build !linux

package proctest

import "os/exec"

// DieWithParent does nothing without Linux's parent-death signal: a
// server of a test binary that dies keeps running; stop it by its PID.
func DieWithParent(*exec.Cmd) {}
