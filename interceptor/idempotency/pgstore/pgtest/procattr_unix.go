//go:build unix

package pgtest

import (
	"fmt"
	"os"
	"os/exec"
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

// cleanerScript stops the cluster in $1 (its postmaster, by the PID in its
// postmaster.pid, if that process is still a postgres), kills what is left
// of it (on Linux, each process whose working directory is the cluster's:
// a child a test stopped with SIGSTOP, as pgstore's crash tests stop the
// WAL writer, cannot see its postmaster die, and stayed stopped for ever)
// and removes the directory, once its standard input ends: when the test binary that
// started it has exited, however it exited, or has closed the pipe (Stop).
// It ignores the signals a terminal's Ctrl-C or a hang-up sends to the whole
// process group, so that it outlives the test binary to do its work.
const cleanerScript = `trap '' INT TERM HUP
read -r _ || :
pidfile="$1/data/postmaster.pid"
if [ -f "$pidfile" ]; then
	pid=$(head -n 1 "$pidfile")
	comm=""
	if [ -r "/proc/$pid/comm" ]; then comm=$(cat "/proc/$pid/comm"); else comm=$(ps -o comm= -p "$pid" 2>/dev/null); fi
	case "$comm" in
	*postgres*)
		kill -INT "$pid" 2>/dev/null
		i=0
		while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
		kill -KILL "$pid" 2>/dev/null
		;;
	esac
fi
for p in /proc/[0-9]*; do
	case "$(readlink "$p/cwd" 2>/dev/null)" in
	"$1/data" | "$1/data (deleted)") kill -KILL "${p#/proc/}" 2>/dev/null ;;
	esac
done
rm -rf "$1"
`

// startCleaner starts the process that removes dir, with its cluster,
// once this process exits (see cleanerScript), so that a test binary
// without a TestMain leaves nothing behind. stop ends it now, after the
// caller has stopped the cluster, and waits for it.
func startCleaner(dir string) (stop func(), err error) {
	cmd := exec.Command("sh", "-c", cleanerScript, "pgtest-cleaner", dir)
	in, err := cmd.StdinPipe() // its write end stays open in this process only
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = nil, nil // never the test binary's: go test waits for those to close
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return func() {
		_ = in.Close()
		_ = cmd.Wait()
	}, nil
}
