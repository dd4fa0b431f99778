//go:build !unix

package pgtest

import "syscall"

// credential is the user a cluster runs as: the current one, always, on
// systems without Unix credentials.
type credential struct{}

func owner() (*credential, error) { return nil, nil }

func chownTo(string, *credential) error { return nil }

func initdbAttr(*credential) *syscall.SysProcAttr { return nil }

// postmasterAttr: nothing here kills the cluster of a test binary that
// dies; stop it by the PID in its directory's postmaster.pid.
func postmasterAttr(*credential) *syscall.SysProcAttr { return nil }

// startCleaner: nothing removes the directory of a cluster whose test
// binary exited without StopShared or Stop.
func startCleaner(string) (stop func(), err error) { return func() {}, nil }
