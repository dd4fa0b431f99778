package proctest

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

func start(t *testing.T, script string, timeout time.Duration) (*exec.Cmd, <-chan struct{}, error) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	done, err := Start(cmd, out, "sh", "READY", timeout)
	return cmd, done, err
}

func TestStartWaitsForTheReadyLine(t *testing.T) {
	cmd, done, err := start(t, "echo starting; echo READY now; exec sleep 60", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		t.Fatal("done closed while the process runs")
	default:
	}
	_ = cmd.Process.Kill()
	<-done
}

func TestStartReportsAnEarlyExitWithItsLog(t *testing.T) {
	_, _, err := start(t, "echo boom; exit 1", 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "sh exited before it was ready") || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("Start = %v, want an early exit naming sh, with its log", err)
	}
}

func TestStartKillsAProcessNeverReady(t *testing.T) {
	_, _, err := start(t, "exec sleep 60", 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "not ready after 100ms") {
		t.Fatalf("Start = %v, want not ready after 100ms", err)
	}
}
