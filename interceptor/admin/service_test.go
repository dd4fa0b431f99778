package admin

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/endpoint"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/interceptor/server"
	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// adminEnv is a View with a Client "orders" (a breaker on Echo) and its
// admin service over bufconn, its HTTP handler, and the write log.
type adminEnv struct {
	v      *View
	client *interceptor.Client
	admin  adminv1.AdminServiceClient
	http   *httptest.Server
	log    *syncBuffer
}

func newAdminEnv(t *testing.T, opts ...Option) *adminEnv {
	t.Helper()
	env := &adminEnv{log: &syncBuffer{}}
	env.v = newView(t, append([]Option{WithLogger(slog.New(slog.NewTextHandler(env.log, nil)))}, opts...)...)
	_, env.client, _ = startClient(t, env.v, "orders", &testserver.Server{}, methodConfig(serviceconfig.MethodConfig{
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5}}))
	cc := testserver.ServeWith(t, nil, func(s *grpc.Server) { Register(s, env.v) })
	env.admin = adminv1.NewAdminServiceClient(cc)
	env.http = httptest.NewServer(http.StripPrefix("/debug/resilience", env.v.Handler()))
	t.Cleanup(env.http.Close)
	return env
}

func (env *adminEnv) state() interceptor.BreakerState {
	return env.client.Status(echoMethod).Breaker.State
}

func (env *adminEnv) post(t *testing.T, body, contentType string) (int, string) {
	t.Helper()
	resp, err := http.Post(env.http.URL+"/debug/resilience/breaker", contentType, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const forceOpenJSON = `{"client": "orders", "fullMethod": "/resilience.echo.v1.EchoService/Echo", "action": "BREAKER_ACTION_FORCE_OPEN"}`

// TestWriteWithoutTheHookIsRefused: on a View without WithWrites, a
// ForceOpen over gRPC is PERMISSION_DENIED and over HTTP 403; the breaker
// stays closed; each attempt is logged and recorded as an event.
func TestWriteWithoutTheHookIsRefused(t *testing.T) {
	env := newAdminEnv(t)
	_, err := env.admin.ControlBreaker(context.Background(), &adminv1.ControlBreakerRequest{Client: "orders", FullMethod: echoMethod,
		Action: adminv1.BreakerAction_BREAKER_ACTION_FORCE_OPEN})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "admin.WithWrites") {
		t.Errorf("ControlBreaker over gRPC = %v, want PERMISSION_DENIED naming admin.WithWrites", err)
	}
	if code, body := env.post(t, forceOpenJSON, "application/json"); code != http.StatusForbidden {
		t.Errorf("POST /breaker = %d %q, want 403", code, body)
	}
	if s := env.state(); s != interceptor.BreakerClosed {
		t.Errorf("breaker %v after refused writes, want closed", s)
	}
	if n := strings.Count(env.log.String(), "refused: admin: write actions are off"); n != 2 {
		t.Errorf("log has %d refused writes, want 2:\n%s", n, env.log)
	}
	if w := eventsOf(env.v, adminv1.Part_PART_ADMIN, adminv1.EventKind_EVENT_KIND_WRITE); len(w) != 2 || !strings.Contains(w[0].GetCause(), "force_open") {
		t.Errorf("write events %v, want 2 refused force_open", w)
	}
}

// TestWritesGoThroughTheHook: with WithWrites, the hook decides: a refusal
// is PERMISSION_DENIED (403) with its reason; an allowed ForceOpen over
// HTTP and a reset over gRPC act on the breaker; every write is logged
// with who asked; a write over HTTP without a JSON body is refused before
// the hook.
func TestWritesGoThroughTheHook(t *testing.T) {
	var asked []Write
	var mu sync.Mutex
	env := newAdminEnv(t, WithWrites(func(ctx context.Context, w Write) error {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, w)
		if w.HTTP != nil && w.HTTP.Header.Get("Authorization") != "Bearer ops" {
			return errors.New("not an operator")
		}
		return nil
	}))
	if code, body := env.post(t, forceOpenJSON, "application/json"); code != http.StatusForbidden || !strings.Contains(body, "not an operator") {
		t.Errorf("POST without the token = %d %q, want 403 with the hook's reason", code, body)
	}
	req, _ := http.NewRequest(http.MethodPost, env.http.URL+"/debug/resilience/breaker", strings.NewReader(forceOpenJSON))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer ops")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || env.state() != interceptor.BreakerForcedOpen || !strings.Contains(string(body), "BREAKER_STATE_FORCED_OPEN") {
		t.Errorf("POST with the token = %d %s; breaker %v, want 200 and forced open", resp.StatusCode, body, env.state())
	}
	if code, _ := env.post(t, forceOpenJSON, "text/plain"); code != http.StatusUnsupportedMediaType {
		t.Errorf("POST text/plain = %d, want 415", code)
	}
	r, err := env.admin.ControlBreaker(context.Background(), &adminv1.ControlBreakerRequest{Client: "orders", FullMethod: echoMethod,
		Action: adminv1.BreakerAction_BREAKER_ACTION_RESET})
	if err != nil || r.GetBreaker().GetState() != adminv1.BreakerState_BREAKER_STATE_CLOSED || env.state() != interceptor.BreakerClosed {
		t.Errorf("reset over gRPC = %v, %v; breaker %v, want closed", r, err, env.state())
	}
	for _, bad := range []*adminv1.ControlBreakerRequest{
		{Client: "nobody", FullMethod: echoMethod, Action: adminv1.BreakerAction_BREAKER_ACTION_RESET},
		{Client: "orders", FullMethod: "/other.Service/Method", Action: adminv1.BreakerAction_BREAKER_ACTION_RESET},
		{Client: "orders", FullMethod: echoMethod},
	} {
		if _, err := env.admin.ControlBreaker(context.Background(), bad); err == nil {
			t.Errorf("ControlBreaker(%v) = nil error, want a refusal", bad)
		}
	}
	mu.Lock()
	// The hook is asked before the client and the method are looked up, so
	// that a caller it refuses learns nothing of them.
	if len(asked) != 5 || asked[0].Action != ActionForceOpen || asked[1].HTTP == nil || asked[2].HTTP != nil || asked[4].Action != ActionReset {
		t.Errorf("the hook was asked %+v, want 2 HTTP force_open, then 3 gRPC resets", asked)
	}
	mu.Unlock()
	log := env.log.String()
	if !strings.Contains(log, "action=force_open") || !strings.Contains(log, "outcome=done") || !strings.Contains(log, "by=127.0.0.1") {
		t.Errorf("log:\n%s\nwant the allowed force_open with who asked", log)
	}
}

// TestHTTPServesTheViewReadOnly: the page, view.json and events.json
// answer GET; a POST to them is refused; the JSON is the view.
func TestHTTPServesTheViewReadOnly(t *testing.T) {
	env := newAdminEnv(t)
	env.v.events.add(&event{key: partKey{sideClient, "orders", adminv1.Part_PART_BREAKER, echoMethod}, kind: adminv1.EventKind_EVENT_KIND_BREAKER_STATE,
		from: "closed", to: "open", cause: "opened on failures: <script>alert(1)</script>"})
	get := func(path string) (int, string) {
		resp, err := http.Get(env.http.URL + "/debug/resilience" + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, page := get("/")
	if code != http.StatusOK || !strings.Contains(page, "client orders") || !strings.Contains(page, echoMethod) ||
		strings.Contains(page, "<script>") || !strings.Contains(page, "&lt;script&gt;") {
		t.Errorf("page = %d:\n%s\nwant the client's method and the event's cause escaped", code, page)
	}
	code, js := get("/view.json")
	var view adminv1.View
	if err := protojson.Unmarshal([]byte(js), &view); code != http.StatusOK || err != nil || view.GetClients()[0].GetName() != "orders" {
		t.Errorf("view.json = %d %v:\n%s", code, err, js)
	}
	code, js = get("/events.json?after=0&max=10")
	var events adminv1.ListEventsResponse
	if err := protojson.Unmarshal([]byte(js), &events); code != http.StatusOK || err != nil || len(events.GetEvents()) != 1 {
		t.Errorf("events.json = %d %v:\n%s", code, err, js)
	}
	if code, _ := get("/events.json?after=-1"); code != http.StatusBadRequest {
		t.Errorf("events.json?after=-1 = %d, want 400", code)
	}
	for _, path := range []string{"/", "/view.json", "/events.json"} {
		resp, err := http.Post(env.http.URL+"/debug/resilience"+path, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("POST %s = %d, want 405", path, resp.StatusCode)
		}
	}
}

// TestWatchFollowsTheEvents: a watcher gets the backlog after its
// sequence, then each new event and each new count of an episode, as they
// happen.
func TestWatchFollowsTheEvents(t *testing.T) {
	env := newAdminEnv(t)
	old := env.v.events.add(&event{key: partKey{sideClient, "orders", adminv1.Part_PART_BREAKER, echoMethod}, kind: adminv1.EventKind_EVENT_KIND_BREAKER_STATE})
	first := env.v.events.add(&event{key: partKey{sideClient, "orders", adminv1.Part_PART_BREAKER, echoMethod}, kind: adminv1.EventKind_EVENT_KIND_BREAKER_STATE})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := env.admin.WatchEvents(ctx, &adminv1.WatchEventsRequest{AfterSequence: &old})
	if err != nil {
		t.Fatal(err)
	}
	next := func() *adminv1.Event {
		t.Helper()
		r, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return r.GetEvent()
	}
	if e := next(); e.GetSequence() != first {
		t.Fatalf("first event = %v, want the backlog's %d", e, first)
	}
	// One instant for both refusals, so that they are one episode however
	// long the first takes to reach the watcher.
	at := time.Now()
	env.v.events.refuse(refusal("api", "(server)", "limit", ""), at)
	e := next()
	if e.GetKind() != adminv1.EventKind_EVENT_KIND_REFUSED || e.GetCount() != 1 {
		t.Fatalf("then %v, want the refusal", e)
	}
	env.v.events.refuse(refusal("api", "(server)", "limit", ""), at)
	if e2 := next(); e2.GetSequence() != e.GetSequence() || e2.GetCount() != 2 {
		t.Errorf("then %v, want the same episode with count 2", e2)
	}
	cancel()
}

// TestPageRendersEveryPart: the page renders a view with every kind of
// part (a client with a breaker, adaptive throttling, a bulkhead and
// hedging; a server with a limit, tenants and a failing store; a channel
// with an ejected endpoint) without a template error, each in its section.
func TestPageRendersEveryPart(t *testing.T) {
	v := newView(t)
	v.opts.endpoints = true
	until := time.Now().Add(time.Minute)
	v.eps.snapshots = func(time.Time) []endpoint.Snapshot {
		return []endpoint.Snapshot{{Target: "dns:///orders", ChildPolicy: "round_robin", Ejections: 1, Endpoints: []endpoint.EndpointState{
			{Addresses: []string{"10.0.0.9:443"}, Connectivity: connectivity.Ready, EjectedUntil: until, Ejections: 1, ConsecutiveFailures: 5, Calls: 5, Failures: 5},
			{Addresses: []string{"10.0.0.8:443"}, Connectivity: connectivity.Ready},
		}}}
	}
	ec, _, _ := startClient(t, v, "orders", &testserver.Server{}, methodConfig(serviceconfig.MethodConfig{
		HedgingPolicy:  &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: time.Hour}, // no copy is sent: its slot would be released after the call returns
		CircuitBreaker: &serviceconfig.CircuitBreaker{Mode: "adaptive"},
		Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 4},
		RateLimit:      &serviceconfig.ClientRateLimit{Rate: 1000, Burst: 100},
	}), interceptor.WithServiceConfig(&serviceconfig.Config{RetryThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 0.1}}))
	if _, err := ec.Echo(context.Background(), echoReq("x")); err != nil { // the method is listed once called
		t.Fatal(err)
	}
	ss, err := v.Server("api")
	if err != nil {
		t.Fatal(err)
	}
	newLimitedServer(t, ss)
	ss.OnRefusal(context.Background(), server.Refusal{FullMethod: echoMethod, Reason: server.RefusalStoreUnavailable,
		Err: status.Error(codes.Unavailable, "idempotency: store unavailable: connection refused")})
	edge, err := v.Server("edge")
	if err != nil {
		t.Fatal(err)
	}
	rated, err := server.New(server.WithLimits(server.Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{
		{Name: "per-tenant", Rate: 50, Burst: 10, Key: serviceconfig.KeyTenant}}}, Tenant: server.TenantFromMetadata("x-tenant")}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rated.Close() })
	edge.Attach(rated)
	edge.OnRefusal(context.Background(), server.Refusal{FullMethod: echoMethod, Reason: server.RefusalRateLimit, Limit: "per-tenant",
		RateLimits: []string{"per-tenant"}, Key: "acme", Tenant: "acme", Wait: 20 * time.Millisecond,
		Err: status.Error(codes.ResourceExhausted, "over the rate limit")})
	code, page := getPage(t, v, "/?refresh=5")
	for _, want := range []string{
		`<meta http-equiv="refresh" content="5">`, "client orders", "1h0m0s", "rejects 0%", "0 in flight, 0 queued",
		"10.0 of 10 tokens", "server api", `data-limit="(server)"`, "CRITICAL: 0 / 0 / 0", `data-healthy="false"`,
		"connection refused", "channel dns:///orders", `data-ejected="true"`, "ejected (ejection 1) after 5 failures in a row",
		`data-part="endpoint"`, `data-part="idempotency store"`,
		`<td class="ratelimit">0 waiting</td>`, "server edge", `data-ratelimit="per-tenant"`, "<td>50 per 1s</td>",
		`data-part="rate limit"`, `over the rate limit &#34;per-tenant&#34; for tenant &#34;acme&#34;`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if code != http.StatusOK || strings.Contains(page, "rendering the page failed") {
		t.Errorf("page = %d:\n%s", code, page)
	}
}
