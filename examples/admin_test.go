package examples_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// The tests of this file run examples/server as a real process (a front
// server, and for the client side's parts, backends it forwards to), cause
// one part to refuse a call, and check that cmd/resadmin shows which part
// refused it and why: `resadmin watch` prints the event within a second of
// the call that caused it, and `resadmin view` lists the part under
// "refusing now" with its cause.

const (
	serverPkg   = "github.com/grpc-resilience/resilience/examples/server"
	resadminPkg = "github.com/grpc-resilience/resilience/cmd/resadmin"
	echoMethod  = "/resilience.echo.v1.EchoService/Echo"
	lookup      = "/resilience.echo.v1.EchoService/Lookup"
	// freshWithin is how soon after its cause the CLI must show a
	// refusal: the "within 1 s".
	freshWithin = time.Second
)

var (
	adminBinsOnce sync.Once
	adminBins     map[string]string
	adminBinsErr  error
)

// adminBinaries builds examples/server and cmd/resadmin once for the tests
// of this file, into a directory removed when the test binary exits
// (TestMain).
func adminBinaries(t *testing.T) map[string]string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	adminBinsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "resilience-admin-e2e-")
		if err != nil {
			adminBinsErr = err
			return
		}
		buildDirs = append(buildDirs, dir)
		adminBins = map[string]string{}
		for _, pkg := range []string{serverPkg, resadminPkg} {
			bin := filepath.Join(dir, filepath.Base(pkg))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg).CombinedOutput()
			cancel()
			if err != nil {
				adminBinsErr = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
				return
			}
			adminBins[pkg] = bin
		}
	})
	if adminBinsErr != nil {
		t.Fatal(adminBinsErr)
	}
	return adminBins
}

// startServer starts examples/server with args on loopback ports it picks,
// and returns the process, its gRPC address and its debug (HTTP) address.
func startServer(t *testing.T, args ...string) (p *process, grpcAddr, debugAddr string) {
	t.Helper()
	bins := adminBinaries(t)
	p = start(t, bins[serverPkg], append([]string{"-addr", "127.0.0.1:0", "-metrics-addr", "127.0.0.1:0"}, args...)...)
	return p, p.addr(t, "grpc"), p.addr(t, "metrics")
}

// writeFile writes data to a file of the test's temporary directory and
// returns its path.
func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// dialEcho returns the echo service and the admin service of addr.
func dialEcho(t *testing.T, addr string) (echov1.EchoServiceClient, adminv1.AdminServiceClient) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return echov1.NewEchoServiceClient(conn), adminv1.NewAdminServiceClient(conn)
}

// stamped is a line of a process's output with when the test read it.
type stamped struct {
	line string
	at   time.Time
}

// watcher is `resadmin watch -json` against a process: its events, each
// with when it arrived, and the calls the test makes meanwhile.
type watcher struct {
	lines  chan stamped // closed at EOF
	stderr strings.Builder
}

// watchCLI starts `resadmin -addr addr watch -after 0 -json`, stopped when
// the test ends: every event of the process, the ones before the watch
// connected too, so that a cause the test makes at once is not missed.
func watchCLI(t *testing.T, addr string) *watcher {
	t.Helper()
	w := &watcher{lines: make(chan stamped, 1024)}
	cmd := exec.Command(adminBinaries(t)[resadminPkg], "-addr", addr, "watch", "-after", "0", "-json")
	cmd.Stderr = &w.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			w.lines <- stamped{sc.Text(), time.Now()}
		}
		close(w.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		_ = cmd.Wait()
	})
	return w
}

// causeOf is when the cause of event e happened: when the part refused or
// changed state (the hooks record the event on the call's goroutine, at
// that instant), or when the endpoint policy ejected the endpoint (the
// view stamps an ejection with the policy's EjectedSince).
func causeOf(e *adminv1.Event) time.Time { return e.GetTime().AsTime() }

// until reads watch's events until match accepts one, calling more
// between reads (nil: no more calls; more returns true when the test
// needs no more calls), and checks that the event reached the CLI within
// freshWithin of its cause.
func (w *watcher) until(t *testing.T, more func() (done bool), match func(e *adminv1.Event) bool) *adminv1.Event {
	t.Helper()
	deadline := time.After(bound)
	var seen []string
	for {
		var l stamped
		var ok bool
		select {
		case l, ok = <-w.lines:
		default:
			if more != nil {
				if more() {
					more = nil
				}
				continue
			}
			select {
			case l, ok = <-w.lines:
			case <-deadline:
				t.Fatalf("resadmin watch printed no matching event within %v; it printed:\n%s", bound, strings.Join(seen, "\n"))
			}
		}
		if !ok {
			t.Fatalf("resadmin watch ended; stderr:\n%s", w.stderr.String())
		}
		var e adminv1.Event
		if err := protojson.Unmarshal([]byte(l.line), &e); err != nil {
			t.Fatalf("resadmin watch -json printed %q: %v", l.line, err)
		}
		if !match(&e) {
			seen = append(seen, l.line)
			continue
		}
		if d := l.at.Sub(causeOf(&e)); d > freshWithin {
			t.Errorf("resadmin watch showed the event %v after its cause, want within %v: %s", d, freshWithin, l.line)
		} else {
			t.Logf("resadmin watch showed the event %v after its cause: %s", d.Round(time.Millisecond), l.line)
		}
		return &e
	}
}

// event matches an event of the part, subject and kind whose cause
// contains every string of cause.
func event(part adminv1.Part, subject string, kind adminv1.EventKind, cause ...string) func(*adminv1.Event) bool {
	return func(e *adminv1.Event) bool {
		return e.GetPart() == part && e.GetSubject() == subject && e.GetKind() == kind && containsAll(e.GetCause(), cause)
	}
}

func containsAll(s string, want []string) bool {
	for _, w := range want {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return true
}

// viewShows runs `resadmin -addr addr view` and checks that "refusing now"
// has a row with every string of want.
func viewShows(t *testing.T, addr string, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	out, err := exec.CommandContext(ctx, adminBinaries(t)[resadminPkg], "-addr", addr, "view").CombinedOutput()
	if err != nil {
		t.Fatalf("resadmin view: %v\n%s", err, out)
	}
	s := string(out)
	start, end := strings.Index(s, "REFUSING NOW\n"), strings.Index(s, "\nCLIENT ")
	if end < 0 {
		end = strings.Index(s, "\nSERVER ")
	}
	if start < 0 || end < start {
		t.Fatalf("resadmin view has no refusing-now table:\n%s", s)
	}
	for _, row := range strings.Split(s[start:end], "\n") {
		if containsAll(row, want) {
			return
		}
	}
	t.Errorf("resadmin view's refusing-now table has no row with %q:\n%s", want, s[start:end])
}

// callCtx bounds one call of a test.
func callCtx(t *testing.T) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), 30*time.Second)
}

func echo(ctx context.Context, ec echov1.EchoServiceClient, msg string) error {
	_, err := ec.Echo(ctx, &echov1.EchoRequest{Message: msg})
	return err
}

// forwarding starts backends (the args of each) and a front server that
// forwards to them with the client config cfg, and returns the front's
// echo service and address and the backends' addresses.
func forwarding(t *testing.T, cfg string, backends ...[]string) (ec echov1.EchoServiceClient, front string, addrs []string) {
	t.Helper()
	for _, args := range backends {
		_, a, _ := startServer(t, args...)
		addrs = append(addrs, a)
	}
	_, front, _ = startServer(t, "-forward", strings.Join(addrs, ","), "-forward-config", writeFile(t, "forward.json", cfg))
	ec, _ = dialEcho(t, front)
	return ec, front, addrs
}

// waitReady waits until the view of the front server at admin shows n
// endpoints READY on its forwarding channel: a retry can go elsewhere only
// once the other backends are connected.
func waitReady(t *testing.T, admin adminv1.AdminServiceClient, n int) {
	t.Helper()
	waitView(t, admin, fmt.Sprintf("%d endpoints READY", n), func(v *adminv1.View) bool {
		for _, ch := range v.GetChannels() {
			ready := 0
			for _, e := range ch.GetEndpoints() {
				if e.GetConnectivity() == "READY" {
					ready++
				}
			}
			if ready == n {
				return true
			}
		}
		return false
	})
}

// untilRefused makes calls with call until one fails with a status whose
// message contains want, at most n calls.
func untilRefused(t *testing.T, n int, want string, call func(ctx context.Context) error) func() bool {
	i := 0
	return func() bool {
		if i >= n {
			t.Fatalf("%d calls and none refused with %q", n, want)
		}
		i++
		ctx, cancel := callCtx(t)
		defer cancel()
		err := call(ctx)
		return err != nil && strings.Contains(status.Convert(err).Message(), want)
	}
}

// calls makes calls with call until the event the test waits for
// arrives, at most n: then it makes no more, and until waits for the event
// (within its bound). The event comes through the process's watch, which
// sends at most every 50 ms and finds an ejection at its next look at the
// endpoints (every 250 ms), while n calls that the part refuses at once,
// or that go to the good backends, can take less than that: failing at the
// n-th call failed the test for a machine that was fast.
func calls(t *testing.T, n int, call func(ctx context.Context) error) func() bool {
	i := 0
	return func() bool {
		i++
		ctx, cancel := callCtx(t)
		defer cancel()
		_ = call(ctx)
		return i >= n
	}
}

// TestCLIShowsTheBreakerOpen: a backend fails every call; the front's
// breaker opens on the third failure; the CLI shows the breaker open with
// the failures that opened it.
func TestCLIShowsTheBreakerOpen(t *testing.T) {
	ec, front, _ := forwarding(t, `{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService"}],
		"retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.001s", "maxBackoff": "0.001s", "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]},
		"circuitBreaker": {"consecutiveFailures": 3, "openDuration": "60s"}}]}`, []string{"-fail-rate", "1"})
	w := watchCLI(t, front)
	e := w.until(t, untilRefused(t, 20, "circuit breaker open", func(ctx context.Context) error { return echo(ctx, ec, "x") }),
		event(adminv1.Part_PART_BREAKER, echoMethod, adminv1.EventKind_EVENT_KIND_BREAKER_STATE, "opened on failures; the 2 failed attempts heard of before it: UNAVAILABLE ×2", "faultinject: injected abort"))
	if e.GetSource() != "backends" || e.GetFrom() != "closed" || e.GetTo() != "open" || len(e.GetFailures()) == 0 {
		t.Errorf("event %v, want the client backends' breaker closed → open with its failures", e)
	}
	viewShows(t, front, "client", "backends", "breaker", echoMethod, "breaker open: opened on failures; the 2 failed attempts heard of before it: UNAVAILABLE ×2")
}

// TestCLIShowsTheBulkheadFull: a bulkhead of one slot is held by a slow
// call; the next call is refused, and the CLI shows the bulkhead full.
func TestCLIShowsTheBulkheadFull(t *testing.T) {
	ec, front, _ := forwarding(t, `{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService"}],
		"retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.001s", "maxBackoff": "0.001s", "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]},
		"bulkhead": {"maxConcurrent": 1}}]}`, []string{"-latency", "5s"})
	_, admin := dialEcho(t, front)
	w := watchCLI(t, front)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		ctx, cancel := callCtx(t)
		defer cancel()
		_ = echo(ctx, ec, "slow")
	})
	waitView(t, admin, "the slow call in the bulkhead", func(v *adminv1.View) bool {
		for _, c := range v.GetClients() {
			for _, m := range c.GetMethods() {
				if m.GetBulkhead().GetInFlight() == 1 {
					return true
				}
			}
		}
		return false
	})
	e := w.until(t, untilRefused(t, 1, "bulkhead full", func(ctx context.Context) error { return echo(ctx, ec, "refused") }),
		event(adminv1.Part_PART_BULKHEAD, echoMethod, adminv1.EventKind_EVENT_KIND_REFUSED, "bulkhead full"))
	if e.GetSource() != "backends" || e.GetReason() != "bulkhead_full" || e.GetCode() != "RESOURCE_EXHAUSTED" {
		t.Errorf("event %v, want the client backends' bulkhead refusing with RESOURCE_EXHAUSTED", e)
	}
	viewShows(t, front, "client", "backends", "bulkhead", echoMethod, "bulkhead full")
}

// waitView polls the view over gRPC until ok says the state the test
// waits for is there: a state of another process, which only the view
// shows.
func waitView(t *testing.T, admin adminv1.AdminServiceClient, what string, ok func(*adminv1.View) bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		ctx, cancel := callCtx(t)
		r, err := admin.GetView(ctx, &adminv1.GetViewRequest{})
		cancel()
		if err == nil && ok(r.GetView()) {
			return
		}
		time.Sleep(10 * time.Millisecond) // polling another process's state
	}
	t.Fatalf("the view never showed %s within %v", what, bound)
}

// TestCLIShowsTheBudgetSpent: a backend fails every call; retries spend a
// small retry budget, and the CLI shows the budget withholding a retry.
func TestCLIShowsTheBudgetSpent(t *testing.T) {
	ec, front, _ := forwarding(t, `{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService"}],
		"retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.001s", "maxBackoff": "0.001s", "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}],
		"retryBudget": {"ratio": 0.01, "minRetriesPerSecond": 1, "ttl": "10s"}}`, []string{"-fail-rate", "1"})
	w := watchCLI(t, front)
	// A call the budget stops ends with its last attempt's error: the
	// event is the sign.
	e := w.until(t, calls(t, 50, func(ctx context.Context) error { return echo(ctx, ec, "x") }),
		event(adminv1.Part_PART_RETRY_BUDGET, echoMethod, adminv1.EventKind_EVENT_KIND_REFUSED, "retry budget spent", "UNAVAILABLE"))
	if e.GetReason() != "retry_budget" {
		t.Errorf("event %v, want reason retry_budget", e)
	}
	viewShows(t, front, "client", "backends", "retry budget", echoMethod, "retry budget spent")
}

// TestCLIShowsTheThrottling: a backend refuses every Lookup; adaptive
// throttling starts rejecting attempts locally, and the CLI shows it.
func TestCLIShowsTheThrottling(t *testing.T) {
	ec, front, _ := forwarding(t, `{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService", "method": "Lookup"}],
		"retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.001s", "maxBackoff": "0.001s", "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]},
		"circuitBreaker": {"mode": "adaptive", "k": 1.1}}]}`, []string{"-fail-rate", "1"})
	w := watchCLI(t, front)
	w.until(t, untilRefused(t, 500, "circuit breaker open", func(ctx context.Context) error {
		_, err := ec.Lookup(ctx, &echov1.LookupRequest{Message: "x"})
		return err
	}), event(adminv1.Part_PART_ADAPTIVE, lookup, adminv1.EventKind_EVENT_KIND_REFUSED, "adaptive throttling rejected the attempt locally"))
	viewShows(t, front, "client", "backends", "adaptive", lookup, "adaptive throttling")
}

// TestCLIShowsTheEndpointEjected: one backend of three fails every call;
// the endpoint policy ejects it, and the CLI shows it ejected with its
// failures.
func TestCLIShowsTheEndpointEjected(t *testing.T) {
	ec, front, addrs := forwarding(t, `{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService"}],
		"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.001s", "maxBackoff": "0.001s", "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}],
		"loadBalancingConfig": [{"resilience_endpoint": {"consecutiveFailures": 3, "childPolicy": [{"round_robin": {}}]}}]}`,
		[]string{"-fail-rate", "1"}, nil, nil)
	_, admin := dialEcho(t, front)
	waitReady(t, admin, 3)
	w := watchCLI(t, front)
	e := w.until(t, calls(t, 200, func(ctx context.Context) error {
		if err := echo(ctx, ec, "x"); err != nil {
			t.Errorf("a call failed: %v (its retries should go to the good backends)", err)
		}
		return nil
	}), event(adminv1.Part_PART_ENDPOINT, addrs[0], adminv1.EventKind_EVENT_KIND_EJECTED, "after 3 failures in a row"))
	if e.GetSide() != "channel" || e.GetSource() != "backends:///backends" {
		t.Errorf("event %v, want the channel backends:///backends", e)
	}
	viewShows(t, front, "channel", "endpoint", addrs[0], "ejected (ejection 1) after 3 failures in a row")
}

// TestCLIShowsTheServerLimitShed: a server limit of one is held by a slow
// call; the next is shed, and the CLI shows the limit, the call's
// criticality and why.
func TestCLIShowsTheServerLimitShed(t *testing.T) {
	_, front, _ := startServer(t, "-latency", "5s", "-server-config",
		writeFile(t, "server.json", `{"concurrencyLimit": {"initialLimit": 1, "minLimit": 1, "maxLimit": 1}}`))
	ec, admin := dialEcho(t, front)
	w := watchCLI(t, front)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		ctx, cancel := callCtx(t)
		defer cancel()
		_ = echo(ctx, ec, "slow")
	})
	waitView(t, admin, "the slow call in the limit", func(v *adminv1.View) bool {
		return len(v.GetServers()) > 0 && len(v.GetServers()[0].GetLimits()) > 0 && v.GetServers()[0].GetLimits()[0].GetInFlight() == 1
	})
	e := w.until(t, untilRefused(t, 1, "over the concurrency limit", func(ctx context.Context) error { return echo(ctx, ec, "shed") }),
		event(adminv1.Part_PART_LIMIT, "(server)", adminv1.EventKind_EVENT_KIND_REFUSED, "shed CRITICAL call of "+echoMethod+": over the concurrency limit"))
	if e.GetSource() != "example" || e.GetReason() != "limit" || e.GetCriticality() != "CRITICAL" || e.GetCode() != "RESOURCE_EXHAUSTED" {
		t.Errorf("event %v, want the server example's limit shedding a CRITICAL call", e)
	}
	viewShows(t, front, "server", "example", "limit", "(server)", "over the concurrency limit")
}

// TestCLIShowsTheTenantOverItsShare: under tenant fairness (limit 10,
// CRITICAL's share 9, shared max-min among the tenants holding calls), a
// quiet tenant holds 1 call, a noisy one 8 (its share while the quiet one
// takes one slot) and another tenant 2; the heavy tenants' fair share is
// then (9-1)/2 = 4, the noisy tenant's 8 are twice that, so its next call
// is shed over its share, and the CLI names the tenant over its share.
func TestCLIShowsTheTenantOverItsShare(t *testing.T) {
	_, front, _ := startServer(t, "-latency", "60s", "-server-config", writeFile(t, "server.json",
		`{"concurrencyLimit": {"initialLimit": 10, "minLimit": 10, "maxLimit": 10},
		  "tenantFairness": {"metadataKey": "x-tenant", "idleTimeout": "60s"}}`))
	ec, admin := dialEcho(t, front)
	w := watchCLI(t, front)
	var wg sync.WaitGroup
	defer wg.Wait()
	holding, stop := context.WithCancel(t.Context())
	defer stop() // before wg.Wait: the held calls end now, not after their latency
	held := 0
	hold := func(tenant string) {
		held++
		want := held
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(holding, time.Minute)
			defer cancel()
			_ = echo(metadata.AppendToOutgoingContext(ctx, "x-tenant", tenant), ec, "slow")
		})
		waitView(t, admin, fmt.Sprintf("%d calls in flight", want), func(v *adminv1.View) bool {
			return len(v.GetServers()) > 0 && len(v.GetServers()[0].GetLimits()) > 0 && v.GetServers()[0].GetLimits()[0].GetInFlight() == int64(want)
		})
	}
	hold("quiet")
	for range 8 {
		hold("noisy")
	}
	hold("other")
	hold("other")
	e := w.until(t, untilRefused(t, 1, "over the concurrency limit", func(ctx context.Context) error {
		return echo(metadata.AppendToOutgoingContext(ctx, "x-tenant", "noisy"), ec, "shed")
	}), event(adminv1.Part_PART_LIMIT, "(server)", adminv1.EventKind_EVENT_KIND_REFUSED, `tenant "noisy" was over its fair share (3 tenants share the limit)`))
	if e.GetTenant() != "noisy" || !e.GetOverShare() || e.GetTenants() != 3 {
		t.Errorf("event %v, want tenant noisy over its share among 3", e)
	}
	viewShows(t, front, "server", "limit", `tenant "noisy" was over its fair share`)
}

// TestCLIShowsTheStoreDown: the server's Redis store stops; a keyed call is
// refused (the server fails closed), and the CLI shows the store down with
// the store's error.
func TestCLIShowsTheStoreDown(t *testing.T) {
	redis := redistest.Start(t)
	_, front, _ := startServer(t, "-store", "redis", "-redis-addr", redis.Addr, "-scope", "shared")
	ec, _ := dialEcho(t, front)
	keyed := func(ctx context.Context, key string) error {
		return echo(metadata.AppendToOutgoingContext(ctx, "idempotency-key", key), ec, "x")
	}
	ctx, cancel := callCtx(t)
	defer cancel()
	if err := keyed(ctx, "k1"); err != nil {
		t.Fatalf("a keyed call with Redis up: %v", err)
	}
	w := watchCLI(t, front)
	redis.Stop()
	e := w.until(t, untilRefused(t, 1, "store unavailable", func(ctx context.Context) error {
		err := keyed(ctx, "k2")
		if status.Code(err) != codes.Unavailable {
			t.Errorf("a keyed call with Redis down: %v, want UNAVAILABLE", err)
		}
		return err
	}), event(adminv1.Part_PART_IDEMPOTENCY_STORE, "idempotency store", adminv1.EventKind_EVENT_KIND_REFUSED, "idempotency store down, failing closed"))
	if e.GetReason() != "store_unavailable" || e.GetCode() != "UNAVAILABLE" {
		t.Errorf("event %v, want store_unavailable, UNAVAILABLE", e)
	}
	viewShows(t, front, "server", "example", "idempotency store", "failures; the latest")
}

// TestCLIShowsTheRateLimit: a per-tenant rate limit of a burst of 3 (and
// one call an hour after) refuses the tenant's fourth call, and the CLI
// shows the limit, the tenant and the wait; its view lists the limit.
func TestCLIShowsTheRateLimit(t *testing.T) {
	_, front, _ := startServer(t, "-server-config", writeFile(t, "server.json",
		`{"rateLimits": [{"name": "echo-per-tenant", "rate": 1, "per": "3600s", "burst": 3, "key": "tenant"}],
		  "tenantFairness": {"metadataKey": "x-tenant"}}`))
	ec, _ := dialEcho(t, front)
	w := watchCLI(t, front)
	acme := func(ctx context.Context) error {
		return echo(metadata.AppendToOutgoingContext(ctx, "x-tenant", "acme"), ec, "x")
	}
	e := w.until(t, untilRefused(t, 4, "over the rate limit", acme),
		event(adminv1.Part_PART_RATE_LIMIT, "echo-per-tenant", adminv1.EventKind_EVENT_KIND_REFUSED,
			`over the rate limit "echo-per-tenant" for tenant "acme": refused CRITICAL call of `+echoMethod, "told to retry after "))
	if e.GetSource() != "example" || e.GetReason() != "rate_limit" || e.GetTenant() != "acme" || e.GetCode() != "RESOURCE_EXHAUSTED" {
		t.Errorf("event %v, want the server example's rate limit refusing tenant acme", e)
	}
	viewShows(t, front, "server", "example", "rate limit", "echo-per-tenant", `for tenant "acme"`)
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	out, err := exec.CommandContext(ctx, adminBinaries(t)[resadminPkg], "-addr", front, "view").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "RATE LIMIT") || !containsAll(string(out), []string{"echo-per-tenant", "rateLimits[0]", "tenant", "1 per 1h0m0s"}) {
		t.Errorf("resadmin view: %v; want the rate limit listed:\n%s", err, out)
	}
}
