package proctest

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes cmd, not yet started, receive SIGKILL when the
// process that starts it dies (a test binary killed from outside, or
// panicking at its -timeout), so that a server it runs does not outlive
// it. Linux's parent-death signal follows the thread that started cmd;
// the Go runtime keeps its threads for the life of the process.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
