package admin

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/endpoint"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

var errStoreDown = errors.New("dial tcp 10.0.0.7:6379: connection refused")

// TestServerRefusalsAreEvents: the refusals a Server reports become one
// event per episode with the limit, criticality, tenant and cause; the
// store failing closed makes the store unhealthy in the view, and "refusing
// now" lists both.
func TestServerRefusalsAreEvents(t *testing.T) {
	clk := newFakeClock()
	v := newView(t, WithNow(clk.now))
	src, err := v.Server("api")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	shed := status.Error(codes.ResourceExhausted, "over the concurrency limit")
	for range 50 {
		src.OnRefusal(ctx, server.Refusal{FullMethod: "/shop.Orders/Pay", Reason: server.RefusalLimit, Limit: "shop.Orders",
			Criticality: wire.SheddablePlus, Tenant: "noisy", Tenants: 3, OverShare: true, Err: shed})
	}
	src.DescribeStore("redis at 10.0.0.7:6379")
	src.OnRefusal(ctx, server.Refusal{FullMethod: "/shop.Orders/Pay", Reason: server.RefusalStoreUnavailable,
		Err: status.Error(codes.Unavailable, "idempotency: store unavailable: "+errStoreDown.Error())})
	got := eventsOf(v, adminv1.Part_PART_LIMIT, adminv1.EventKind_EVENT_KIND_REFUSED)
	if len(got) != 1 {
		t.Fatalf("limit events %v, want one episode", got)
	}
	e := got[0]
	want := `shed SHEDDABLE_PLUS call of /shop.Orders/Pay: over the concurrency limit, no room in its queue; tenant "noisy" was over its fair share (3 tenants share the limit)`
	if e.GetCount() != 50 || e.GetSubject() != "shop.Orders" || e.GetCause() != want || e.GetTenant() != "noisy" || !e.GetOverShare() ||
		e.GetCriticality() != "SHEDDABLE_PLUS" || e.GetCode() != "RESOURCE_EXHAUSTED" || e.GetFullMethod() != "/shop.Orders/Pay" {
		t.Errorf("limit event = %v, want 50 refusals with cause %q", e, want)
	}
	view := v.Snapshot()
	st := view.GetServers()[0].GetStore()
	if st.GetHealthy() || st.GetFailures() != 1 || !strings.Contains(st.GetLastFailure(), "connection refused") || st.GetDescription() != "redis at 10.0.0.7:6379" {
		t.Errorf("store = %v, want unhealthy with the failure and the description", st)
	}
	if r := refusingOf(view, adminv1.Part_PART_IDEMPOTENCY_STORE); r == nil || !strings.Contains(r.GetCause(), "connection refused") {
		t.Errorf("refusing now = %v, want the store with its failure", view.GetRefusing())
	}
	clk.add(recentWindow)
	view = v.Snapshot()
	if !view.GetServers()[0].GetStore().GetHealthy() || len(view.GetRefusing()) != 0 {
		t.Errorf("a minute later: store %v, refusing %v; want healthy, nothing refusing", view.GetServers()[0].GetStore(), view.GetRefusing())
	}
}

// TestServerRefusalsOfShutdownAndUnknownReasons: a call refused by
// Server.Shutdown is an event of the shutdown part with its method; a
// reason this view does not know (a newer server package's, such as issue
// 34's rate limits before the view names them) is still one event per
// episode, of part "other", its cause naming the reason's token and the
// error, and listed under refusing now.
func TestServerRefusalsOfShutdownAndUnknownReasons(t *testing.T) {
	clk := newFakeClock()
	v := newView(t, WithNow(clk.now))
	src, err := v.Server("api")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 3 {
		src.OnRefusal(ctx, server.Refusal{FullMethod: "/shop.Orders/Pay", Reason: server.RefusalShuttingDown,
			Err: status.Error(codes.Unavailable, "resilience: the server is shutting down; retry elsewhere")})
	}
	got := eventsOf(v, adminv1.Part_PART_SHUTDOWN, adminv1.EventKind_EVENT_KIND_REFUSED)
	want := "the server is shutting down (Server.Shutdown): refused a call of /shop.Orders/Pay"
	if len(got) != 1 || got[0].GetCount() != 3 || got[0].GetCause() != want || got[0].GetCode() != "UNAVAILABLE" || got[0].GetSubject() != "/shop.Orders/Pay" {
		t.Errorf("shutdown events %v, want one episode of 3 with cause %q", got, want)
	}
	for range 2 {
		src.OnRefusal(ctx, server.Refusal{FullMethod: "/shop.Orders/Pay", Reason: server.RefusalReason(200),
			Err: status.Error(codes.ResourceExhausted, "over the rate limit of tenant acme")})
	}
	got = eventsOf(v, adminv1.Part_PART_UNSPECIFIED, adminv1.EventKind_EVENT_KIND_REFUSED)
	want = `unknown: refused: RESOURCE_EXHAUSTED: "over the rate limit of tenant acme"`
	if len(got) != 1 || got[0].GetCount() != 2 || got[0].GetCause() != want || got[0].GetSubject() != "/shop.Orders/Pay" {
		t.Errorf("events of an unknown reason %v, want one episode of 2 with cause %q", got, want)
	}
	view := v.Snapshot()
	if r := refusingOf(view, adminv1.Part_PART_UNSPECIFIED); r == nil || !strings.Contains(r.GetCause(), "over the rate limit") {
		t.Errorf("refusing now = %v, want the unknown reason's refusals", view.GetRefusing())
	}
	if r := refusingOf(view, adminv1.Part_PART_SHUTDOWN); r == nil {
		t.Errorf("refusing now = %v, want the shutdown's refusals", view.GetRefusing())
	}
	if n := adminv1.Part_PART_UNSPECIFIED.Label(); n != "other" {
		t.Errorf("PART_UNSPECIFIED.Label() = %q, want \"other\"", n)
	}
}

// TestServerSourceOverGRPC: a real Server with a limit of one sheds a
// second call while the first holds the slot; the view shows the limit's
// counts and the shed.
func TestServerSourceOverGRPC(t *testing.T) {
	v := newView(t)
	ss, err := v.Server("api")
	if err != nil {
		t.Fatal(err)
	}
	srv := newLimitedServer(t, ss)
	ec, release := serveHolding(t, srv)
	if ts := v.Snapshot().GetServers()[0].GetLimits()[0].GetBusiestTenants(); len(ts) != 1 || ts[0].GetTenant() != "" || ts[0].GetInFlight() != 1 {
		t.Errorf("busiest tenants with the held call = %v, want the default tenant with 1 in flight", ts)
	}
	// The same (default) tenant as the held call: another tenant, under
	// its fair share, would be admitted past the limit by up to a share.
	_, err = ec.Echo(context.Background(), echoReq("now"))
	release()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second call = %v, want RESOURCE_EXHAUSTED", err)
	}
	got := eventsOf(v, adminv1.Part_PART_LIMIT, adminv1.EventKind_EVENT_KIND_REFUSED)
	if len(got) != 1 || got[0].GetSubject() != "(server)" || got[0].GetReason() != "limit" || got[0].GetFullMethod() != echoMethod {
		t.Errorf("events %v, want the server limit's shed of %s", got, echoMethod)
	}
	lim := v.Snapshot().GetServers()[0].GetLimits()[0]
	if lim.GetName() != "(server)" || lim.GetLimit() != 1 || len(lim.GetByCriticality()) != 4 {
		t.Errorf("limit = %v, want the server's limit of 1 with counts by criticality", lim)
	}
}

// TestEndpointEjectionsAreEvents: an endpoint the policy ejects is an
// event with its failures when the view next looks, shown in "refusing
// now" while ejected; its return is an event too.
func TestEndpointEjectionsAreEvents(t *testing.T) {
	clk := newFakeClock()
	v, err := New(WithNow(clk.now))
	if err != nil {
		t.Fatal(err)
	}
	until := clk.now().Add(28 * time.Second)
	since := clk.now().Add(-2 * time.Second) // before the view looked
	snap := endpoint.Snapshot{Target: "dns:///orders:50051", ChildPolicy: "round_robin", Ejections: 1, Endpoints: []endpoint.EndpointState{
		{Addresses: []string{"10.0.0.1:50051"}, Connectivity: connectivity.Ready, Calls: 40, Failures: 1},
		{Addresses: []string{"10.0.0.2:50051"}, Connectivity: connectivity.Ready, EjectedUntil: until, EjectedSince: since,
			Cause: "consecutive_failures", Ejections: 1, Multiplier: 1, ConsecutiveFailures: 5, Calls: 12, Failures: 9},
	}}
	v.eps.snapshots = func(time.Time) []endpoint.Snapshot { return []endpoint.Snapshot{snap} }
	view := v.Snapshot()
	ej := eventsOf(v, adminv1.Part_PART_ENDPOINT, adminv1.EventKind_EVENT_KIND_EJECTED)
	want := "ejected (ejection 1) after 5 failures in a row; 9 of 12 attempts failed in the window"
	if len(ej) != 1 || ej[0].GetSubject() != "10.0.0.2:50051" || ej[0].GetSource() != snap.Target || ej[0].GetCause() != want ||
		!ej[0].GetUntil().AsTime().Equal(until) || !ej[0].GetTime().AsTime().Equal(since) {
		t.Fatalf("ejection events = %v, want one of 10.0.0.2 with cause %q, stamped when the policy ejected it", ej, want)
	}
	r := refusingOf(view, adminv1.Part_PART_ENDPOINT)
	if r == nil || !strings.HasPrefix(r.GetCause(), want) || r.GetSequence() != ej[0].GetSequence() {
		t.Errorf("refusing now = %v, want the ejected endpoint with its cause", view.GetRefusing())
	}
	if e := view.GetChannels()[0].GetEndpoints()[1]; e.GetCause() != want || e.GetEjectedUntil() == nil ||
		!e.GetEjectedSince().AsTime().Equal(since) || e.GetEjectionCause() != "consecutive_failures" {
		t.Errorf("endpoint row = %v, want ejected since when it was, with its cause", e)
	}
	v.Snapshot() // a second look at the same state is no new event
	snap.Endpoints[1].EjectedUntil = time.Time{}
	v.Snapshot()
	if ev := eventsOf(v, adminv1.Part_PART_ENDPOINT, adminv1.EventKind_EVENT_KIND_RETURNED); len(ev) != 1 || len(eventsOf(v, adminv1.Part_PART_ENDPOINT, adminv1.EventKind_EVENT_KIND_EJECTED)) != 1 {
		all, _ := v.Events(0, 0)
		t.Errorf("events %v, want one ejection and one return", all)
	}
}

var _ grpc.ServiceRegistrar = (*grpc.Server)(nil)

// TestEjectionCauses: the words of each cause the endpoint policy gives.
func TestEjectionCauses(t *testing.T) {
	tests := []struct {
		e    endpoint.EndpointState
		want string
	}{
		{endpoint.EndpointState{Cause: "consecutive_failures", Ejections: 1, Multiplier: 1, ConsecutiveFailures: 5, Calls: 5, Failures: 5},
			"ejected (ejection 1) after 5 failures in a row; 5 of 5 attempts failed in the window"},
		{endpoint.EndpointState{Cause: "failure_rate", Ejections: 3, Multiplier: 3, Calls: 40, Failures: 30},
			"ejected (ejection 3, 3× the base ejection time) for its failure rate; 30 of 40 attempts failed in the window"},
		{endpoint.EndpointState{Cause: "local_origin", Ejections: 1, Multiplier: 1, ConsecutiveLocalFailures: 4},
			"ejected (ejection 1) after 4 local-origin failures in a row (connections refused or reset before an answer); 0 of 0 attempts failed in the window"},
		{endpoint.EndpointState{Cause: "probation", Ejections: 2, Multiplier: 2, Calls: 1, Failures: 1},
			"ejected (ejection 2, 2× the base ejection time) failed again on probation, back from its last ejection; 1 of 1 attempts failed in the window"},
	}
	for _, tt := range tests {
		if got := ejectionCause(tt.e); got != tt.want {
			t.Errorf("ejectionCause(%s) = %q, want %q", tt.e.Cause, got, tt.want)
		}
	}
}

// TestServerRateLimitsAreInTheView: a real Server's per-tenant rate limit
// refuses a tenant past its burst: the refusals are one event per tenant
// (the part PART_RATE_LIMIT, subject the limit's name) naming the limit,
// the tenant and the wait; "refusing now" lists it; the Server's row lists
// the limit with its config and the keys it remembers.
func TestServerRateLimitsAreInTheView(t *testing.T) {
	clk := newFakeClock() // the episodes' time stands still: a stalled machine splits none
	v := newView(t, WithNow(clk.now))
	ss, err := v.Server("api")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(append(ss.Options(), server.WithLimits(server.Limits{Config: serviceconfig.ServerConfig{
		RateLimits: []serviceconfig.RateLimit{{Name: "per-tenant", Rate: 1, Per: time.Hour, Burst: 1, Key: serviceconfig.KeyTenant}}},
		Tenant: server.TenantFromMetadata("x-tenant")}))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ss.Attach(srv)
	cc := testserver.StartWith(t, &holdingEcho{}, []grpc.ServerOption{grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor())})
	ec := echov1.NewEchoServiceClient(cc)
	call := func(tenant string) error {
		_, err := ec.Echo(metadata.AppendToOutgoingContext(context.Background(), "x-tenant", tenant), echoReq("now"))
		return err
	}
	for _, tenant := range []string{"acme", "acme", "acme", "globex", "globex"} {
		_ = call(tenant)
	}
	got := eventsOf(v, adminv1.Part_PART_RATE_LIMIT, adminv1.EventKind_EVENT_KIND_REFUSED)
	if len(got) != 2 {
		t.Fatalf("rate-limit events %v, want one per tenant", got)
	}
	e := got[0]
	if e.GetSubject() != "per-tenant" || e.GetReason() != "rate_limit" || e.GetTenant() != "acme" || e.GetCount() != 2 ||
		e.GetCode() != "RESOURCE_EXHAUSTED" || e.GetFullMethod() != echoMethod ||
		!strings.HasPrefix(e.GetCause(), `over the rate limit "per-tenant" for tenant "acme": refused CRITICAL call of `+echoMethod+"; told to retry after ") {
		t.Errorf("acme's event = %v", e)
	}
	if got[1].GetTenant() != "globex" || got[1].GetCount() != 1 {
		t.Errorf("globex's event = %v", got[1])
	}
	view := v.Snapshot()
	if r := refusingOf(view, adminv1.Part_PART_RATE_LIMIT); r == nil || r.GetSubject() != "per-tenant" {
		t.Errorf("refusing now = %v, want the rate limit", view.GetRefusing())
	}
	rls := view.GetServers()[0].GetRateLimits()
	if len(rls) != 1 || rls[0].GetName() != "per-tenant" || rls[0].GetKey() != "tenant" || rls[0].GetRate() != 1 ||
		rls[0].GetPer().AsDuration() != time.Hour || rls[0].GetBurst() != 1 || rls[0].GetKeys() != 2 || rls[0].GetPath() != "rateLimits[0]" {
		t.Errorf("rate limits = %v, want per-tenant with 2 keys", rls)
	}
}

// TestRateLimitKeyFloodIsBounded: a rate limit refusing 2,000 distinct
// keys makes one event per key (an episode each), but the limit's part
// keeps at most eventsPerPart of them, the newest.
func TestRateLimitKeyFloodIsBounded(t *testing.T) {
	v := newView(t)
	src, err := v.Server("api")
	if err != nil {
		t.Fatal(err)
	}
	refused := status.Error(codes.ResourceExhausted, "over the rate limit")
	for i := range 2000 {
		key := "t" + strconv.Itoa(i)
		src.OnRefusal(context.Background(), server.Refusal{FullMethod: echoMethod, Reason: server.RefusalRateLimit, Limit: "per-tenant",
			RateLimits: []string{"per-tenant"}, Key: key, Tenant: key, Wait: time.Second, Err: refused})
	}
	got := eventsOf(v, adminv1.Part_PART_RATE_LIMIT, adminv1.EventKind_EVENT_KIND_REFUSED)
	if len(got) != eventsPerPart || got[len(got)-1].GetTenant() != "t1999" {
		t.Errorf("%d events kept, the newest %v; want %d, the newest t1999's", len(got), got[len(got)-1], eventsPerPart)
	}
}

// TestPeakEWMAChannelShowsItsSettings: a channel under peak_ewma carries the
// settings in effect (decayTime, endpointConcurrency) and each endpoint's
// latency estimate and attempts in flight into the view and onto the page;
// one under round_robin carries no setting.
func TestPeakEWMAChannelShowsItsSettings(t *testing.T) {
	v, err := New()
	if err != nil {
		t.Fatal(err)
	}
	v.eps.snapshots = func(time.Time) []endpoint.Snapshot {
		return []endpoint.Snapshot{
			{Target: "dns:///orders", ChildPolicy: "peak_ewma", DecayTime: 10 * time.Second, EndpointConcurrency: 4,
				Endpoints: []endpoint.EndpointState{{Addresses: []string{"10.0.0.1:443"}, Connectivity: connectivity.Ready,
					Outstanding: 3, Latency: 6 * time.Millisecond}}},
			{Target: "dns:///users", ChildPolicy: "round_robin",
				Endpoints: []endpoint.EndpointState{{Addresses: []string{"10.0.0.2:443"}, Connectivity: connectivity.Ready}}},
		}
	}
	chs := v.Snapshot().GetChannels()
	if len(chs) != 2 {
		t.Fatalf("channels = %v, want 2", chs)
	}
	ewma, rr := chs[0], chs[1]
	if ewma.GetDecayTime().AsDuration() != 10*time.Second || ewma.GetEndpointConcurrency() != 4 {
		t.Errorf("peak_ewma channel: decay_time %v, endpoint_concurrency %d, want 10s and 4", ewma.GetDecayTime(), ewma.GetEndpointConcurrency())
	}
	if e := ewma.GetEndpoints()[0]; e.GetLatency().AsDuration() != 6*time.Millisecond || e.GetOutstanding() != 3 {
		t.Errorf("peak_ewma endpoint: latency %v, outstanding %d, want 6ms and 3", e.GetLatency(), e.GetOutstanding())
	}
	if rr.GetDecayTime() != nil || rr.GetEndpointConcurrency() != 0 {
		t.Errorf("round_robin channel: decay_time %v, endpoint_concurrency %d, want neither", rr.GetDecayTime(), rr.GetEndpointConcurrency())
	}
	_, page := getPage(t, v, "/")
	for _, want := range []string{"channel dns:///orders (peak_ewma, decayTime 10s, endpointConcurrency 4)",
		"3 in flight, latency 6ms", "channel dns:///users (round_robin)"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}
