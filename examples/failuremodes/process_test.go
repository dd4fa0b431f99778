package failuremodes_test

// A server process killed mid-load: examples/server runs as a child process
// on a loopback port with its idempotency records in Redis, a keyed and
// retried load runs against it, the test kills it with SIGKILL and starts it
// again on the same address. Every call must succeed or fail with a clear
// status, no keyed request may run twice across the two processes, the
// breaker must open and close again, the retry budget must bound the retries
// the outage wastes, and the client must recover within a bound.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	. "github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// childServer is one run of the examples/server binary.
type childServer struct {
	cmd    *exec.Cmd
	addr   string // from its "grpc listening on HOST:PORT" line
	stderr *bytes.Buffer
	exited chan struct{}
}

// listenWriter is the child's stdout: it reports the address of the first
// "grpc listening on HOST:PORT" line.
type listenWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	addr chan string // receives the address once
	sent bool
}

func (w *listenWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.sent {
		for line := range strings.Lines(w.buf.String()) {
			if !strings.HasSuffix(line, "\n") {
				break // a line still being written: its address may be cut short
			}
			if a, ok := strings.CutPrefix(strings.TrimSpace(line), "grpc listening on "); ok {
				w.addr <- a
				w.sent = true
				break
			}
		}
	}
	return len(p), nil
}

// startChild starts the binary at bin listening on addr and waits, up to
// 20 s, for it to say where it listens.
func startChild(t *testing.T, bin, addr, redisAddr, execLog string) (*childServer, error) {
	t.Helper()
	return startProcess(t, bin, "-addr", addr, "-metrics-addr", "", "-store", "redis",
		"-redis-addr", redisAddr, "-scope", "shared", "-execution-log", execLog)
}

// startProcess starts the server binary at bin with args and waits, up to
// 20 s, for it to print "grpc listening on HOST:PORT".
func startProcess(t *testing.T, bin string, args ...string) (*childServer, error) {
	t.Helper()
	out := &listenWriter{addr: make(chan string, 1)}
	c := &childServer{stderr: new(bytes.Buffer), exited: make(chan struct{})}
	c.cmd = exec.Command(bin, args...)
	c.cmd.Stdout = out
	c.cmd.Stderr = &lockedBuffer{b: c.stderr}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(c.kill)
	select {
	case c.addr = <-out.addr:
		return c, nil
	case <-c.exited:
		return nil, fmt.Errorf("%s exited before listening: %v\nstderr:\n%s", bin, c.cmd.ProcessState, c.stderrText())
	case <-time.After(20 * time.Second):
		c.kill()
		return nil, fmt.Errorf("%s did not print \"grpc listening on\" within 20s\nstderr:\n%s", bin, c.stderrText())
	}
}

// kill sends SIGKILL (no graceful stop, no flush) and waits for the exit.
func (c *childServer) kill() {
	select {
	case <-c.exited:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exited
}

func (c *childServer) stderrText() string {
	w := c.cmd.Stderr.(*lockedBuffer)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// lockedBuffer is a bytes.Buffer safe for exec's copying goroutine and the
// test.
type lockedBuffer struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// buildExampleServer builds examples/server into a temporary directory.
// The program is part of this module, so a failed build fails t.
func buildExampleServer(t *testing.T) string {
	t.Helper()
	return buildProgram(t, "github.com/grpc-resilience/resilience/examples/server")
}

// buildProgram builds the program pkg of this module into a temporary
// directory; a failed build fails t.
func buildProgram(t *testing.T, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// executions reads execution logs ("<idempotency-key> <method> <message>"
// per line) and counts the executions of each key.
func executions(t *testing.T, paths ...string) map[string]int {
	t.Helper()
	n := make(map[string]int)
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(data)) {
			if f := strings.Fields(line); len(f) > 0 {
				n[f[0]]++
			}
		}
	}
	return n
}

type retriesKey struct{}

func TestProcessKilledMidLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("process test: not in -short")
	}
	bin := buildExampleServer(t)
	redisAddr := redistest.Addr(t)
	dir := t.TempDir()
	logs := []string{filepath.Join(dir, "exec-1.log"), filepath.Join(dir, "exec-2.log")}
	child, err := startChild(t, bin, "127.0.0.1:0", redisAddr, logs[0])
	if err != nil {
		t.Fatal(err)
	}
	addr := child.addr

	const (
		method   = "/resilience.echo.v1.EchoService/Echo"
		openFor  = 300 * time.Millisecond
		ratio    = 0.1
		minRPS   = 2.0
		ttl      = 10 * time.Second
		workers  = 8
		deadline = 3 * time.Second
	)
	var (
		mu       sync.Mutex
		changes  []string
		stops    = map[StopReason]int{}
		failed   atomic.Int64 // retries not refunded: the budget's spending
		okCalls  atomic.Int64
		badCalls atomic.Int64
		calls    atomic.Int64
		okKeys   sync.Map // key → true for calls that succeeded
	)
	c := newTestClient(t,
		WithServiceConfig(&serviceconfig.Config{
			MethodConfig: []serviceconfig.MethodConfig{{
				Name: []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService"}},
				RetryPolicy: &serviceconfig.RetryPolicy{
					MaxAttempts: 5, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
					BackoffMultiplier: 2, RetryableStatusCodes: []codes.Code{codes.Unavailable},
				},
				CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5, OpenDuration: openFor, HalfOpenProbes: 1},
			}},
			RetryBudget: &serviceconfig.RetryBudget{Ratio: ratio, MinRetriesPerSecond: minRPS, TTL: ttl},
		}),
		WithOnStateChange(func(_ string, from, to BreakerState) {
			mu.Lock()
			defer mu.Unlock()
			changes = append(changes, from.String()+">"+to.String())
		}),
		WithOnRetry(func(ctx context.Context, e RetryEvent) {
			if n, ok := ctx.Value(retriesKey{}).(*int); ok {
				*n++ // the call's own goroutine: OnRetry runs synchronously on it
			}
		}),
		WithOnStop(func(_ context.Context, e StopEvent) {
			mu.Lock()
			defer mu.Unlock()
			stops[e.Reason]++
		}),
	)
	cc, err := grpc.NewClient("passthrough:///"+addr, append(c.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.5, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	echo := echov1.NewEchoServiceClient(cc)

	// call makes one keyed call and checks its outcome.
	call := func(key string) error {
		retries := new(int)
		ctx, cancel := context.WithTimeout(context.WithValue(ContextWithIdempotencyKey(context.Background(), key), retriesKey{}, retries), deadline)
		defer cancel()
		r, err := echo.Echo(ctx, &echov1.EchoRequest{Message: key})
		calls.Add(1)
		spent := int64(*retries)
		switch code := status.Code(err); {
		case err == nil:
			if r.GetMessage() != key {
				t.Errorf("Echo(%s) answered %q", key, r.GetMessage())
			}
			okCalls.Add(1)
			okKeys.Store(key, true)
			if spent > 0 {
				spent-- // the retry that succeeded is refunded
			}
		case (code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Aborted) && status.Convert(err).Message() != "":
		default:
			badCalls.Add(1)
			t.Errorf("Echo(%s) = %v: want success or a clear UNAVAILABLE, DEADLINE_EXCEEDED or ABORTED", key, err)
		}
		failed.Add(spent)
		return err
	}

	// The load: workers keyed calls in a loop until stop closes.
	stop := make(chan struct{})
	var lastOK atomic.Int64   // unix nanos of the latest success
	var rejected atomic.Int64 // calls failed fast by the open breaker
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				switch err := call("w" + strconv.Itoa(w) + "-" + strconv.Itoa(i)); {
				case err == nil:
					lastOK.Store(time.Now().UnixNano())
				case errors.Is(err, ErrCircuitOpen):
					rejected.Add(1)
					time.Sleep(10 * time.Millisecond) // a caller honouring the fast failure's hint
				}
			}
		})
	}
	start := time.Now()
	waitFor := func(what string, bound time.Duration, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(bound); !cond(); time.Sleep(10 * time.Millisecond) { // polling a child process
			if time.Now().After(end) {
				close(stop)
				wg.Wait()
				t.Fatalf("%s: not within %v", what, bound)
			}
		}
	}
	waitFor("first successes", 10*time.Second, func() bool { return okCalls.Load() >= 20 })

	child.kill()
	killedAt := time.Now()
	okAtKill := okCalls.Load()
	waitFor("the breaker opening with the server dead", 10*time.Second, func() bool {
		s := c.Status(method).Breaker
		return s != nil && s.State == BreakerOpen
	})
	// Stay down past one OpenDuration, so a half-open probe meets the
	// dead server and the breaker opens again.
	time.Sleep(openFor + 200*time.Millisecond)
	if _, err := startChild(t, bin, addr, redisAddr, logs[1]); err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("restart on %s: %v", addr, err)
	}
	backAt := time.Now()
	waitFor("recovery after the restart", 10*time.Second, func() bool { return lastOK.Load() > backAt.UnixNano() })
	recovered := time.Unix(0, lastOK.Load()).Sub(backAt)
	okAtBack := okCalls.Load()
	waitFor("successes after the restart", 10*time.Second, func() bool { return okCalls.Load() >= okAtBack+20 })
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)

	if bound := openFor + 3*time.Second; recovered > bound {
		t.Errorf("first success %v after the restart, want within %v", recovered, bound)
	}
	execs := executions(t, logs...)
	dups := 0
	for k, n := range execs {
		if n > 1 {
			dups += n - 1
			t.Errorf("key %s executed %d times across the restart", k, n)
		}
	}
	okKeys.Range(func(k, _ any) bool {
		if execs[k.(string)] == 0 {
			t.Errorf("call %s succeeded but no execution was logged", k)
		}
		return true
	})
	if s := c.Status(method).Breaker; s == nil || s.State != BreakerClosed {
		t.Errorf("breaker at the end = %+v, want closed", s)
	}
	mu.Lock()
	transitions := strings.Join(changes, " ")
	budgetStops := stops[StopBudget]
	mu.Unlock()
	if !strings.Contains(transitions, "closed>open") || !strings.HasSuffix(transitions, "half-open>closed") {
		t.Errorf("breaker transitions %q, want it to open in the outage and close after", transitions)
	}
	// The budget's promise: unrefunded retries within one TTL window stay
	// within the reserve plus Ratio per call (the run is shorter than TTL
	// or, if not, the bound is counted per window started).
	windows := float64(elapsed/ttl + 1)
	if limit := windows*minRPS*ttl.Seconds() + ratio*float64(calls.Load()); float64(failed.Load()) > limit+1 {
		t.Errorf("retries not refunded = %d, over the budget's %.0f (%d calls)", failed.Load(), limit, calls.Load())
	}
	t.Logf("summary: calls %d (ok %d, failed with a clear status %d, unclear %d), duplicates executed %d, "+
		"server down %v, first success %v after restart, breaker %s, unrefunded retries %d, budget stops %d, ok before kill %d, rejected fast %d",
		calls.Load(), okCalls.Load(), calls.Load()-okCalls.Load()-badCalls.Load(), badCalls.Load(), dups,
		backAt.Sub(killedAt).Round(time.Millisecond), recovered.Round(time.Millisecond), transitions, failed.Load(), budgetStops, okAtKill, rejected.Load())
}
