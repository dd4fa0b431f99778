package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/admin"
	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const payMethod = "/shop.Orders/Pay"

// env is a process's admin view served over loopback TCP: a Client
// "orders" whose Pay breaker the test forces open, and a Server "api".
type env struct {
	v      *admin.View
	addr   string
	client *interceptor.Client
	server *admin.ServerSource
}

func newEnv(t *testing.T) *env {
	t.Helper()
	v, err := admin.New(admin.WithoutEndpoints())
	if err != nil {
		t.Fatal(err)
	}
	src, err := v.Client("orders")
	if err != nil {
		t.Fatal(err)
	}
	c, err := interceptor.NewClient(append([]interceptor.ClientOption{interceptor.WithMethodConfig(serviceconfig.MethodConfig{
		Name: []serviceconfig.Name{{Service: "shop.Orders", Method: "Pay"}}, CircuitBreaker: &serviceconfig.CircuitBreaker{}})},
		src.Options()...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	src.Attach(c)
	ss, err := v.Server("api")
	if err != nil {
		t.Fatal(err)
	}
	return &env{v: v, addr: serveView(t, v), client: c, server: ss}
}

// serveView serves v's AdminService over loopback TCP until the test ends
// and returns its address, for resadmin's -addr.
func serveView(t *testing.T, v *admin.View) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	admin.Register(gs, v)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

func (e *env) run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), append([]string{"-addr", e.addr}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestViewShowsWhatRefusesAndWhy: view prints "refusing now" first, with
// the forced-open breaker and the limit's shed and their causes, then the
// client's method row and the events; -json prints the View.
func TestViewShowsWhatRefusesAndWhy(t *testing.T) {
	e := newEnv(t)
	if err := e.client.ForceOpen(payMethod); err != nil {
		t.Fatal(err)
	}
	e.server.OnRefusal(context.Background(), server.Refusal{FullMethod: payMethod, Reason: server.RefusalLimit, Limit: "shop.Orders",
		Criticality: wire.Sheddable, Err: status.Error(codes.ResourceExhausted, "over the limit")})
	code, out, errOut := e.run(t)
	if code != exitOK {
		t.Fatalf("view: exit %d, stderr %s", code, errOut)
	}
	refusing := out[strings.Index(out, "REFUSING NOW"):strings.Index(out, "CLIENT orders")]
	for _, want := range []string{
		"client  orders  breaker  /shop.Orders/Pay", "breaker forced-open: forced open (ForceOpen)",
		"server  api     limit    shop.Orders", "shed SHEDDABLE call of /shop.Orders/Pay: over the concurrency limit",
	} {
		if !strings.Contains(refusing, want) {
			t.Errorf("refusing now lacks %q:\n%s", want, refusing)
		}
	}
	if !strings.Contains(out, "forced-open (0 trips)") || !strings.Contains(out, "state closed → forced-open") {
		t.Errorf("view lacks the method's row or the event:\n%s", out)
	}
	code, out, _ = e.run(t, "view", "-json")
	var v struct {
		Refusing []struct{ Part, Subject, Cause string }
	}
	if err := json.Unmarshal([]byte(out), &v); code != exitOK || err != nil || len(v.Refusing) != 2 || v.Refusing[0].Part != "PART_BREAKER" {
		t.Errorf("view -json: exit %d, %v:\n%s", code, err, out)
	}
}

// TestWatchPrintsEventsAsTheyHappen: watch -after the newest sequence
// prints the breaker's next change within a second of it, and -json
// prints one object a line.
func TestWatchPrintsEventsAsTheyHappen(t *testing.T) {
	e := newEnv(t)
	for i, asJSON := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		pr, pw := io.Pipe()
		done := make(chan int, 1)
		after := e.v.Snapshot().GetLastSequence()
		args := []string{"-addr", e.addr, "watch", "-after", strconv.FormatUint(after, 10)}
		if asJSON {
			args = append(args, "-json")
		}
		go func() {
			done <- run(ctx, args, pw, io.Discard)
			pw.Close()
		}()
		lines := bufio.NewScanner(pr)
		if !asJSON {
			if !lines.Scan() || !strings.HasPrefix(lines.Text(), "watching ") {
				t.Fatalf("watch's first line = %q", lines.Text())
			}
		}
		// The change after the sequence is sent whether it happens before
		// the stream opens (in the backlog) or after (as it happens).
		change, want := e.client.ForceOpen, "state closed → forced-open"
		if i == 1 {
			change, want = e.client.ResetBreaker, "state forced-open → closed"
		}
		start := time.Now()
		if err := change(payMethod); err != nil {
			t.Fatal(err)
		}
		if !lines.Scan() {
			t.Fatalf("watch ended: %v", lines.Err())
		}
		line := lines.Text()
		elapsed := time.Since(start)
		cancel()
		go func() { _, _ = io.Copy(io.Discard, pr) }()
		if code := <-done; code != exitOK {
			t.Errorf("watch exit %d after an interrupt, want 0", code)
		}
		if asJSON {
			var ev struct{ Part, Subject, From, To string }
			if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Part != "PART_BREAKER" || ev.Subject != payMethod || ev.To != "closed" {
				t.Errorf("watch -json line %q (%v), want the breaker's reset", line, err)
			}
		} else if !strings.Contains(line, "client/orders breaker /shop.Orders/Pay: "+want) {
			t.Errorf("watch line %q, want the breaker's %q", line, want)
		}
		if elapsed > time.Second {
			t.Errorf("the event came %v after the change, want within 1s", elapsed)
		}
	}
}

// TestBreakerWithoutWritesIsRefused: the process did not turn writes on:
// breaker exits 1 with PermissionDenied, and the breaker is unchanged.
func TestBreakerWithoutWritesIsRefused(t *testing.T) {
	e := newEnv(t)
	code, _, errOut := e.run(t, "-H", "authorization:Bearer x", "breaker", "force-open", "orders", payMethod)
	if code != exitFailed || !strings.Contains(errOut, "PermissionDenied") {
		t.Errorf("breaker force-open: exit %d, stderr %q; want 1 and PermissionDenied", code, errOut)
	}
	if s := e.client.Status(payMethod).Breaker.State; s != interceptor.BreakerClosed {
		t.Errorf("breaker %v, want closed", s)
	}
}

// TestUsageErrors: a bad command, argument count, action or flag exits 2
// with the reason; -h prints the usage and exits 0.
func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"nonsense"}, {"breaker", "open", "c", "m"}, {"breaker", "reset"}, {"view", "extra"},
		{"-timeout", "0s"}, {"-H", "novalue"}, {"-bogus"}} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, &out, &errOut); code != exitUsage || errOut.Len() == 0 {
			t.Errorf("run(%q) = %d, stderr %q; want 2 with the reason", args, code, errOut.String())
		}
	}
	var out bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, &out, io.Discard); code != exitOK || !strings.Contains(out.String(), "usage: resadmin") {
		t.Errorf("-h = %d, %q", code, out.String())
	}
}

// TestUnreachableExits1: a process that does not answer is exit 1 with the
// reason.
func TestUnreachableExits1(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	var errOut bytes.Buffer
	if code := run(context.Background(), []string{"-addr", addr, "-timeout", "2s", "events"}, io.Discard, &errOut); code != exitFailed || !strings.Contains(errOut.String(), "Unavailable") {
		t.Errorf("events against a closed port: exit %d, %q; want 1, Unavailable", code, errOut.String())
	}
}

// TestViewShowsRateLimits: view lists a Server's rate limits (where,
// key, rate, burst, keys remembered), a rate-limit refusal under
// "refusing now" with its limit and tenant, and a method's rateLimit
// block in its row.
func TestViewShowsRateLimits(t *testing.T) {
	e := newEnv(t)
	srv, err := server.New(server.WithLimits(server.Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{
		{Name: "per-tenant", Rate: 20, Burst: 10, Key: serviceconfig.KeyTenant}}}, Tenant: server.TenantFromMetadata("x-tenant")}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	e.server.Attach(srv)
	e.server.OnRefusal(context.Background(), server.Refusal{FullMethod: payMethod, Reason: server.RefusalRateLimit, Limit: "per-tenant",
		RateLimits: []string{"per-tenant"}, Key: "acme", Tenant: "acme", Criticality: wire.Critical, Wait: 50 * time.Millisecond,
		Err: status.Error(codes.ResourceExhausted, "over the rate limit")})
	code, out, errOut := e.run(t)
	if code != exitOK {
		t.Fatalf("view: exit %d, stderr %s", code, errOut)
	}
	refusing := out[strings.Index(out, "REFUSING NOW"):strings.Index(out, "CLIENT orders")]
	if want := `server  api     rate limit  per-tenant`; !strings.Contains(refusing, want) ||
		!strings.Contains(refusing, `over the rate limit "per-tenant" for tenant "acme": refused CRITICAL call of /shop.Orders/Pay; told to retry after 50ms`) {
		t.Errorf("refusing now lacks the rate limit's refusal:\n%s", refusing)
	}
	srvPart := out[strings.Index(out, "SERVER api"):]
	for _, want := range []string{"RATE LIMIT", "per-tenant", "rateLimits[0]", "tenant", "20 per 1s", "10"} {
		if !strings.Contains(srvPart, want) {
			t.Errorf("the server's section lacks %q:\n%s", want, srvPart)
		}
	}
}
