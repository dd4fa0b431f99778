package interceptor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/internal/bulkhead"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// A method a config named exactly stayed named, and kept, after an update
// dropped its entry (populate carried the named flag), so it never counted
// against maxMethods and was never let go: a control plane or resolver that
// pushes configs naming new methods (per tenant, per rollout) grew the
// table with every push, and each update copied all of it. 3000 updates,
// each naming one new method, kept 3000 methods and took 5.9 s (O(n²)); now
// a method no longer named by the config nor called by a generated stub
// has a row only while it has state, and under no entry it has none: 1
// method kept, 40 ms. With
// metrics on, the metrics' names let the dropped methods go too.
func TestMethodsNamedOnlyByOldConfigsAreBounded(t *testing.T) {
	_, meters := newMeterReader()
	c := newTestClient(t, WithMeterProvider(meters))
	const updates = 3000
	for i := range updates {
		if err := c.UpdateServiceConfig(namingOne(fmt.Sprintf("M%d", i), false)); err != nil {
			t.Fatal(err)
		}
	}
	if n := keptMethods(c); n != 1 {
		t.Errorf("after %d updates each naming one new method, %d methods kept, want 1 (the one named now)", updates, n)
	}
	n := 0
	c.metrics.names.Range(func(_, _ any) bool { n++; return true })
	if n != 1 {
		t.Errorf("after %d updates each naming one new method, the metrics name %d methods, want 1 (the one named now)", updates, n)
	}
}

// namingOne is a config that names /tenant.Service/<method> exactly with a
// breaker and, when guarded, gives every other method a breaker of its own
// (the default entry).
func namingOne(method string, guarded bool) *serviceconfig.Config {
	cfg := &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
		Name:           []serviceconfig.Name{{Service: "tenant.Service", Method: method}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 3},
	}}}
	if guarded {
		cfg.MethodConfig = append(cfg.MethodConfig, serviceconfig.MethodConfig{
			Name:           []serviceconfig.Name{{}},
			CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5},
		})
	}
	return cfg
}

// keptMethods returns how many rows c's table holds (draining ones
// included).
func keptMethods(c *Client) int {
	c.table.mu.Lock()
	defer c.table.mu.Unlock()
	return len(c.table.rows)
}

// kept reports whether fullMethod has a row that is not draining.
func kept(c *Client, fullMethod string) bool {
	return keptPolicy(c, fullMethod) != nil
}

// keptPolicy returns the policy of fullMethod under the config in force
// when it has a row that is not draining, else nil.
func keptPolicy(c *Client, fullMethod string) *methodPolicy {
	c.table.mu.Lock()
	r := c.table.rows[fullMethod]
	draining := r != nil && !r.g.any() && r.latency == nil
	c.table.mu.Unlock()
	if r == nil || draining {
		return nil
	}
	v, ok := c.state.Load().methods.Load(fullMethod)
	if !ok {
		return nil
	}
	return v.(*methodPolicy)
}

// policyOf returns the policy a call of fullMethod (not through a
// generated stub) runs under.
func policyOf(c *Client, fullMethod string) *methodPolicy {
	_, p := c.resolve(fullMethod, false)
	return p
}

// eachBulkhead calls f with every bulkhead c's table holds: in force, or
// dropped.
func eachBulkhead(c *Client, f func(*bulkhead.Bulkhead)) {
	c.table.mu.Lock()
	defer c.table.mu.Unlock()
	for _, r := range c.table.rows {
		for _, b := range []*bulkhead.Bulkhead{r.g.bulkhead, r.dropped} {
			if b != nil {
				f(b)
			}
		}
	}
}

// fillBound keeps n methods that no config names, as a proxy's callers
// would by calling them: "/invented.vN.Service/MethodN", which the default
// entry of the config applies to.
func fillBound(c *Client, n int) {
	for i := range n {
		c.resolve(callerNamed(i), false)
	}
}

// The same with state to keep: under a default entry with a breaker, each
// dropped method keeps a breaker of its own, so it stays while the default
// entry's key has room and is let go past it, oldest first (the rows are
// idle); the methods kept before stay. Statuses lists exactly the methods
// kept (and nothing of those let go).
func TestMethodsDroppedWithStateKeepItWhileTheBoundHasRoom(t *testing.T) {
	c := newTestClient(t, WithServiceConfig(namingOne("Start", true)))
	const room, updates = 10, 50
	fillBound(c, maxMethods-room)
	for i := range updates {
		if err := c.UpdateServiceConfig(namingOne(fmt.Sprintf("M%d", i), true)); err != nil {
			t.Fatal(err)
		}
	}
	if n := keptMethods(c); n != maxMethods+1 {
		t.Errorf("after %d updates, %d methods kept, want %d (the bound, and the method named now)", updates, n, maxMethods+1)
	}
	// Start, then M0..M8 filled the room; M9..M48 were let go; M49 is named.
	for i, want := range map[int]bool{0: true, 8: true, 9: false, 48: false, 49: true} {
		if m := fmt.Sprintf("/tenant.Service/M%d", i); kept(c, m) != want {
			t.Errorf("%s kept %v, want %v", m, kept(c, m), want)
		}
	}
	if !kept(c, "/tenant.Service/Start") || !kept(c, callerNamed(0)) || !kept(c, callerNamed(maxMethods-room-1)) {
		t.Errorf("a method kept before the updates was let go")
	}
	var want []string
	c.table.mu.Lock()
	for m, r := range c.table.rows {
		if r.g.any() {
			want = append(want, m)
		}
	}
	c.table.mu.Unlock()
	slices.Sort(want)
	var got []string
	for _, s := range c.Statuses() {
		got = append(got, s.FullMethod)
	}
	if !slices.Equal(got, want) {
		t.Errorf("Statuses() lists %d methods, want the %d kept with a guard", len(got), len(want))
	}
	if slices.Contains(got, "/tenant.Service/M9") {
		t.Errorf("Statuses() lists M9, let go")
	}
}

// inventedEcho returns the i-th name a proxy's callers invent in the echo
// service, which its service entry applies to.
func inventedEcho(i int) string { return fmt.Sprintf("/%s/Invented%d", echoService, i) }

// A method dropped from the config with its breaker forced open (ForceOpen),
// whose calls now fall under a service entry with the same breaker block:
//   - kept (its key has room): its breaker carries over, still forced open,
//     and its calls are rejected;
//   - its key full of idle rows: a forced breaker is live, so the update
//     keeps it (and lets an idle row go);
//   - its key full of live rows older than it: it is let go, with its
//     forced state; its calls run untracked, with no breaker at all (never
//     another method's), and reach the server; ForceOpen says why it
//     cannot act;
//   - under no entry at all: it has no state, so it is let go whatever the
//     room, and its calls run under the default policy (no breaker).
//
// A method a generated stub called keeps its state whatever the bound
// (grpc.StaticMethod: its number is the code's, not the callers'). Before
// the table, a method let go ran under the breaker its entry shared among
// the methods past the bound ("/pkg.Service/*"), which another method's
// failures could open, and ForceOpen forced that shared breaker.
func TestMethodDroppedFromTheConfigKeepsItsBreakerOnlyWhileKept(t *testing.T) {
	const withService = `{"methodConfig": [
		{"name": [{"service": "resilience.echo.v1.EchoService", "method": "Echo"}], "circuitBreaker": {"consecutiveFailures": 3}}%s]}`
	const serviceEntry = `{"name": [{"service": "resilience.echo.v1.EchoService"}], "circuitBreaker": {"consecutiveFailures": 3}}`
	tests := []struct {
		name   string
		fill   string // how the service's key is filled before the update: "", "idle" or "live"
		static bool   // a generated stub called Echo before the update
		after  string // the config after the update
		forced bool   // Echo's calls after the update are rejected (its forced-open breaker)
		kept   bool   // Echo is kept after the update
	}{
		{name: "kept", after: serviceEntry, forced: true, kept: true},
		{name: "key full of idle rows", fill: "idle", after: serviceEntry, forced: true, kept: true},
		{name: "key full of live rows", fill: "live", after: serviceEntry},
		{name: "no entry", after: ""},
		{name: "generated stub, key full of live rows", fill: "live", static: true, after: serviceEntry, forced: true, kept: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := &testserver.Server{}
			// The service's key is filled first, then Echo is named: its
			// row is the newest.
			c := newTestClient(t, parsedConfig(t, `{"methodConfig": [`+serviceEntry+`]}`))
			c.table.bound = 8
			cc := testserver.Start(t, srv, c.DialOptions()...)
			for i := range c.table.bound {
				switch tt.fill {
				case "idle":
					policyOf(c, inventedEcho(i))
				case "live":
					if err := c.ForceOpen(inventedEcho(i)); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := c.UpdateServiceConfig(mustParse(t, fmt.Sprintf(withService, ","+serviceEntry))); err != nil {
				t.Fatal(err)
			}
			if tt.static {
				if _, err := echov1.NewEchoServiceClient(cc).Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.ForceOpen(echoMethod); err != nil {
				t.Fatal(err)
			}
			after := `{"methodConfig": [` + tt.after + `]}`
			if err := c.UpdateServiceConfig(mustParse(t, after)); err != nil {
				t.Fatal(err)
			}
			if got := kept(c, echoMethod); got != tt.kept {
				t.Errorf("Echo kept %v after the update, want %v", got, tt.kept)
			}
			// Not through the stub: its call would pin Echo.
			err := cc.Invoke(t.Context(), echoMethod, &echov1.EchoRequest{}, &echov1.EchoResponse{})
			if tt.forced != errors.Is(err, ErrCircuitOpen) || !tt.forced && err != nil {
				t.Errorf("Echo after the update = %v, want rejected %v", err, tt.forced)
			}
			if want := map[bool]int{true: 0, false: 1}[tt.forced]; srv.Count("Echo")-map[bool]int{true: 1}[tt.static] != want {
				t.Errorf("the server saw %d calls of Echo, want %d", srv.Count("Echo")-map[bool]int{true: 1}[tt.static], want)
			}
			listed := slices.ContainsFunc(c.Statuses(), func(s MethodStatus) bool { return s.FullMethod == echoMethod })
			if listed != tt.kept {
				t.Errorf("Statuses() lists Echo %v, want %v", listed, tt.kept)
			}
			if tt.fill == "live" && !tt.kept {
				if p := policyOf(c, echoMethod); p.g.breaker != nil {
					t.Errorf("Echo, untracked, runs under a breaker: want none")
				}
				err := c.ForceOpen(echoMethod)
				if err == nil || !strings.Contains(err.Error(), "none is idle") {
					t.Errorf("ForceOpen(Echo), its key full of live rows = %v, want an error saying there is no room", err)
				}
			}
			if tt.fill == "idle" && keptMethods(c) > c.table.bound {
				t.Errorf("%d rows kept, want at most the bound, %d", keptMethods(c), c.table.bound)
			}
		})
	}
}

// Calls of kept, dropped and invented methods, through generated stubs and
// not, while updates name new methods and drop them, name Echo and drop it
// (its calls are never a stub's, so it is dropped each time): no call fails
// but as the server answers it (or as a dropped method's breaker, opened by
// those answers, rejects it), the table stays bounded, and nothing is held
// at the end (-race).
func TestMethodsConcurrentCallsDuringUpdatesThatDropThem(t *testing.T) {
	srv := &testserver.Server{}
	c := newTestClient(t, WithServiceConfig(namingOne("Start", true)))
	cc := testserver.Start(t, srv, c.DialOptions()...)
	stub := echov1.NewEchoServiceClient(cc)
	ctx, cancel := context.WithCancel(t.Context())
	var named atomic.Int64 // the M<n> the config names now
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				var err error
				switch (g + i) % 4 {
				case 0:
					err = cc.Invoke(ctx, echoMethod, &echov1.EchoRequest{}, &echov1.EchoResponse{})
				case 1:
					_, err = stub.Lookup(ctx, &echov1.LookupRequest{})
				case 2:
					m := fmt.Sprintf("/tenant.Service/M%d", named.Load()-int64(i%3))
					err = cc.Invoke(ctx, m, &echov1.EchoRequest{}, &echov1.EchoResponse{})
				case 3:
					err = cc.Invoke(ctx, callerNamed(g*1_000_000+i), &echov1.EchoRequest{}, &echov1.EchoResponse{})
				}
				if status.Code(err) == codes.Unimplemented || errors.Is(err, ErrCircuitOpen) && (g+i)%4 == 2 {
					err = nil
				}
				if err != nil && ctx.Err() == nil {
					errs <- fmt.Errorf("call %d of goroutine %d: %w", i, g, err)
					return
				}
			}
		})
	}
	// At least 200 updates, and on until the calls of each kind ran
	// beside them (an update takes microseconds: on a busy machine 200 can
	// be over before a goroutine runs), within a minute.
	const updates = 200
	for i, until := 0, time.Now().Add(time.Minute); i < updates || (srv.Count("Echo") < 20 || srv.Count("Lookup") < 20) && time.Now().Before(until); i++ {
		cfg := namingOne(fmt.Sprintf("M%d", i), i%3 != 0)
		if i%2 == 0 {
			cfg.MethodConfig[0].Name = append(cfg.MethodConfig[0].Name, serviceconfig.Name{Service: "resilience.echo.v1.EchoService", Method: "Echo"})
		}
		if err := c.UpdateServiceConfig(cfg); err != nil {
			t.Fatal(err)
		}
		named.Store(int64(i))
		if i%20 == 0 {
			_ = c.ForceClosed(fmt.Sprintf("/tenant.Service/M%d", i))
		}
	}
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if srv.Count("Echo") == 0 || srv.Count("Lookup") == 0 {
		t.Errorf("the server saw %d calls of Echo and %d of Lookup during the updates, want some of each", srv.Count("Echo"), srv.Count("Lookup"))
	}
	if n := keptMethods(c); n > maxMethods+3 {
		t.Errorf("%d methods kept, want at most %d", n, maxMethods+3)
	}
}

// The hot path gains nothing from the split of named: a call of a method
// the config named exactly, then of the same method kept after an update
// dropped its name, allocates nothing, through a generated stub
// (grpc.StaticMethod: one atomic load) and not, with metrics on.
func TestMethodsDroppedFromTheConfigAllocateNothingWhileKept(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations are counted without -race")
	}
	const guarded = `"retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.001s", "maxBackoff": "0.001s",
		"backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}, "circuitBreaker": {"consecutiveFailures": 3}`
	const before = `{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService", "method": "Echo"}], ` + guarded +
		`}, {"name": [{}], ` + guarded + `}]}`
	const after = `{"methodConfig": [{"name": [{}], ` + guarded + `}]}`
	_, meters := newMeterReader()
	c := newTestClient(t, parsedConfig(t, before), WithMeterProvider(meters))
	ic := c.UnaryClientInterceptor()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
	static := []grpc.CallOption{grpc.StaticMethod()}
	for _, cfg := range []string{before, after} {
		if err := c.UpdateServiceConfig(mustParse(t, cfg)); err != nil {
			t.Fatal(err)
		}
		if !kept(c, echoMethod) {
			t.Fatal("Echo not kept")
		}
		for _, opts := range [][]grpc.CallOption{nil, static} {
			_ = ic(ctx, echoMethod, req, reply, nil, okInvoker, opts...)
			allocs := testing.AllocsPerRun(1000, func() {
				if err := ic(ctx, echoMethod, req, reply, nil, okInvoker, opts...); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Errorf("a call of Echo (static %v) under %s: %v allocs, want 0", opts != nil, cfg, allocs)
			}
		}
	}
}
