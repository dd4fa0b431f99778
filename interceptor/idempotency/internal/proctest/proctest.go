// Package proctest starts the servers the stores' test helpers run
// (redis-server for redistest, postgres for pgtest) and waits until their
// log says they are ready.
package proctest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"time"
)

// FreePort returns a loopback TCP port that nothing listened on a moment
// ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start starts cmd, whose log is log (a pipe of its stdout or stderr, set
// up before), and reads the log until a line contains ready, then keeps
// draining it, so the server never blocks on a full pipe. done is closed
// once the log has ended and cmd has been waited for. If the process exits
// before it is ready, or is not ready within timeout (then it is killed),
// Start returns an error naming name, with the log it wrote, after done.
func Start(cmd *exec.Cmd, log io.Reader, name, ready string, timeout time.Duration) (done <-chan struct{}, err error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	readyc := make(chan error, 1)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		notify := readyc // set to nil once used
		sc := bufio.NewScanner(log)
		var seen strings.Builder
		for sc.Scan() {
			if notify == nil {
				continue
			}
			line := sc.Text()
			seen.WriteString(line + "\n")
			if strings.Contains(line, ready) {
				notify <- nil
				notify = nil
			}
		}
		if notify != nil {
			notify <- fmt.Errorf("%s exited before it was ready:\n%s", name, seen.String())
		}
		_, _ = io.Copy(io.Discard, log) // what a line too long for the scanner left
	}()
	exited := make(chan struct{})
	go func() {
		<-drained
		_ = cmd.Wait()
		close(exited)
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-readyc:
		if err != nil {
			<-exited
			return nil, err
		}
		return exited, nil
	case <-timer.C:
		_ = cmd.Process.Kill()
		<-exited
		return nil, fmt.Errorf("%s not ready after %v", name, timeout)
	}
}
