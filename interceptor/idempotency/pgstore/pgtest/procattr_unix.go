//go:build unix

package pgtest

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

// credential is the user a cluster runs as.
type credential = syscall.Credential

// owner is who runs the cluster: nil for the current user; as root, the
// system user "postgres".
func owner() (*credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and PostgreSQL refuses to: need the system user \"postgres\" to run it as: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// chownTo gives dir to cred's user, so the cluster can write in it.
func chownTo(dir string, cred *credential) error {
	return os.Chown(dir, int(cred.Uid), int(cred.Gid))
}

// initdbAttr runs initdb as cred (nil: the current user).
func initdbAttr(cred *credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}
