//go:build unix && !linux

package pgtest

import "syscall"

// postmasterAttr runs the postmaster as cred (nil: the current user).
// Without Linux's parent-death signal, a test binary that dies leaves its
// cluster running: stop it by the PID in its directory's postmaster.pid.
func postmasterAttr(cred *credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}
