package redistest_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
)

// TestStartLeavesNoServerWhenKilled: a test binary killed from outside
// (SIGKILL: no cleanup runs) leaves no redis-server running; before, every
// server it had started kept its port for ever. The test runs itself as
// the child binary (TestHelperStartChild).
func TestStartLeavesNoServerWhenKilled(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("only Linux has the parent-death signal redistest relies on")
	}
	if _, err := exec.LookPath("redis-server"); err != nil && os.Getenv("CI") == "" {
		t.Skip("redis-server not found on PATH")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHelperStartChild$", "-test.v")
	cmd.Env = append(os.Environ(), "REDISTEST_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var addr string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "addr="); ok {
			addr = a
			break
		}
	}
	_ = cmd.Process.Kill()
	go func() { _, _ = io.Copy(io.Discard, out) }()
	_ = cmd.Wait()
	if addr == "" {
		t.Fatal("the child printed no address")
	}
	c := redistest.Client(t, addr)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if err := c.Ping(context.Background()).Err(); err != nil {
			return // the server is gone
		}
		if time.Now().After(deadline) {
			t.Fatalf("the redis-server at %s still answers 10s after its test binary was killed", addr)
		}
		time.Sleep(20 * time.Millisecond) // the kernel delivers the signal; the server exits
	}
}

// TestHelperStartChild is the child of TestStartLeavesNoServerWhenKilled:
// it starts a server, prints its address and waits to be killed.
func TestHelperStartChild(t *testing.T) {
	if os.Getenv("REDISTEST_CHILD") == "" {
		t.Skip("the child process of TestStartLeavesNoServerWhenKilled")
	}
	s := redistest.Start(t)
	fmt.Printf("addr=%s\n", s.Addr)
	select {} // until killed
}
