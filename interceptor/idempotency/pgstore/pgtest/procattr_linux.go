package pgtest

import "syscall"

// postmasterAttr runs the postmaster as cred (nil: the current user), and
// kills it (SIGKILL) when the test binary dies (a timeout's panic, a
// kill), so no cluster outlives it.
func postmasterAttr(cred *credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
}
