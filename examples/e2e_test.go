package examples_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// bound is how long any one step may take on a loaded machine.
const bound = 2 * time.Minute

// build builds the example commands into a temporary directory.
func build(t *testing.T, pkgs ...string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	out := map[string]string{}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to build the examples: %v", err)
	}
	for _, pkg := range pkgs {
		bin := filepath.Join(dir, filepath.Base(pkg))
		args := []string{"build", "-o", bin}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
		cmd := exec.CommandContext(ctx, goTool, append(args, pkg)...)
		msg, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, msg)
		}
		out[pkg] = bin
	}
	return out
}

// process is a started command whose stdout lines arrive on lines.
type process struct {
	cmd    *exec.Cmd
	lines  chan string // closed at EOF
	stderr strings.Builder
	done   chan error // the Wait result, once
	waited bool       // done was received; only the test's goroutine uses it
}

func start(t *testing.T, bin string, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(bin, args...), lines: make(chan string, 1024), done: make(chan error, 1)}
	p.cmd.Stderr = &p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.done <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		if !p.waited {
			_ = p.cmd.Process.Kill() // fails harmlessly if it has exited
			<-p.done
		}
	})
	return p
}

// line returns the next stdout line, failing the test at EOF or after bound.
func (p *process) line(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatalf("%s ended before printing the expected line; stderr:\n%s", p.cmd.Path, p.stderr.String())
		}
		return l
	case <-time.After(bound):
		t.Fatalf("%s printed nothing for %v", p.cmd.Path, bound)
	}
	return ""
}

// addr reads a "<what> listening on HOST:PORT" line.
func (p *process) addr(t *testing.T, what string) string {
	t.Helper()
	l := p.line(t)
	a, ok := strings.CutPrefix(l, what+" listening on ")
	if !ok {
		t.Fatalf("%s printed %q, want %q", p.cmd.Path, l, what+" listening on HOST:PORT")
	}
	return a
}

// stop sends SIGTERM and waits for a clean exit, returning the remaining
// stdout.
func (p *process) stop(t *testing.T) []string {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var rest []string
	timeout := time.After(bound)
	for {
		select {
		case l, ok := <-p.lines:
			if ok {
				rest = append(rest, l)
				continue
			}
			err := <-p.done
			p.waited = true
			if err != nil {
				t.Fatalf("%s exited with %v; stderr:\n%s", p.cmd.Path, err, p.stderr.String())
			}
			return rest
		case <-timeout:
			t.Fatalf("%s did not exit within %v of SIGTERM", p.cmd.Path, bound)
		}
	}
}

// scrape fetches /metrics until a sample of series has a positive value,
// polling until bound, and returns that value.
func scrape(t *testing.T, addr, series string) float64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + `(\{[^}]*\})? ([0-9.e+]+)$`)
	deadline := time.Now().Add(bound)
	var body string
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			for _, m := range re.FindAllStringSubmatch(body, -1) {
				if v, _ := strconv.ParseFloat(m[2], 64); v > 0 {
					return v
				}
			}
		}
		time.Sleep(50 * time.Millisecond) // polling an outside process, not waiting for time
	}
	t.Fatalf("no positive %s at %s/metrics within %v; last body:\n%s", series, addr, bound, body)
	return 0
}

// TestServerAndClientProcesses builds examples/server and examples/client,
// runs them on loopback, drives keyed load through injected failures,
// checks both /metrics (every metric the Grafana dashboard reads among
// them), health, and that no idempotency key ran its handler twice.
func TestServerAndClientProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two processes")
	}
	bins := build(t, "github.com/grpc-resilience/resilience/examples/server", "github.com/grpc-resilience/resilience/examples/client")
	dir := t.TempDir()
	execLog := filepath.Join(dir, "executions.log")
	srv := start(t, bins["github.com/grpc-resilience/resilience/examples/server"], append([]string{
		"-addr", "127.0.0.1:0", "-metrics-addr", "127.0.0.1:0", "-fail-rate", "0.3", "-seed", "1",
		"-scope", "shared", // the client's keys are random, 128 bits
		"-execution-log", execLog}, dashboardServerFlags(t, dir)...)...)
	grpcAddr := srv.addr(t, "grpc")
	srvMetrics := srv.addr(t, "metrics")

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "resilience.echo.v1.EchoService"}, grpc.WaitForReady(true))
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health Check = %v, %v; want SERVING", hr, err)
	}

	config := filepath.Join(dir, "config.json")
	if err := os.WriteFile(config, []byte(`{"methodConfig": [{
		"name": [{"service": "resilience.echo.v1.EchoService"}],
		"retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.001s", "maxBackoff": "0.01s",
		                "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]},
		"circuitBreaker": {"failureRateThreshold": 0.9, "minimumCalls": 50},
		"bulkhead": {"maxConcurrent": 64}}, {
		"name": [{"service": "resilience.echo.v1.EchoService", "method": "Lookup"}],
		"circuitBreaker": {"mode": "adaptive"}}],
		"loadBalancingConfig": [{"resilience_endpoint": {"childPolicy": [{"round_robin": {}}]}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// The client runs until stopped; the test stops it once both /metrics
	// show what it checks.
	cli := start(t, bins["github.com/grpc-resilience/resilience/examples/client"],
		"-addr", grpcAddr, "-config", config, "-concurrency", "4", "-duration", "1h", "-keyed",
		"-metrics-addr", "127.0.0.1:0")
	cliMetrics := cli.addr(t, "metrics")

	scrape(t, cliMetrics, "resilience_client_retries_total")
	scrape(t, cliMetrics, "grpc_client_call_retries_count")
	scrape(t, srvMetrics, "resilience_server_idempotency_executions_total")
	driveDashboardSeries(t, conn)
	requireDashboardMetrics(t, cliMetrics, srvMetrics)
	requireDashboardLinks(t, cliMetrics, srvMetrics)
	rest := cli.stop(t)
	if len(rest) == 0 || !strings.HasPrefix(rest[len(rest)-1], "total calls=") {
		t.Errorf("client's last lines = %q, want a total summary", rest)
	}
	srv.stop(t)

	data, err := os.ReadFile(execLog)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	for _, l := range lines {
		f := strings.SplitN(l, " ", 3)
		if len(f) != 3 || f[1] != "/resilience.echo.v1.EchoService/Echo" {
			t.Fatalf("execution log line %q, want \"<key> <method> <message>\"", l)
		}
		seen[f[0]]++
		if seen[f[0]] > 1 {
			t.Errorf("key %s ran its handler %d times", f[0], seen[f[0]])
		}
	}
	if len(seen) == 0 {
		t.Error("no keyed execution was logged")
	}
	t.Logf("%d keyed executions; client summary: %s", len(seen), rest[len(rest)-1])
}
