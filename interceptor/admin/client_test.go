package admin

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

const (
	echoService = "resilience.echo.v1.EchoService"
	echoMethod  = "/resilience.echo.v1.EchoService/Echo"
)

func newView(t *testing.T, opts ...Option) *View {
	t.Helper()
	v, err := New(append([]Option{WithoutEndpoints()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// startClient registers a Client named name in v, built with the source's
// hooks and opts, over bufconn to srv.
func startClient(t *testing.T, v *View, name string, srv *testserver.Server, opts ...interceptor.ClientOption) (echov1.EchoServiceClient, *interceptor.Client, *ClientSource) {
	t.Helper()
	src, err := v.Client(name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := interceptor.NewClient(append(opts, src.Options()...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	src.Attach(c)
	cc := testserver.Start(t, srv, c.DialOptions()...)
	return echov1.NewEchoServiceClient(cc), c, src
}

func methodConfig(mc serviceconfig.MethodConfig) interceptor.ClientOption {
	mc.Name = []serviceconfig.Name{{Service: echoService}}
	return interceptor.WithMethodConfig(mc)
}

func retryUnavailable(n int) *serviceconfig.RetryPolicy {
	return &serviceconfig.RetryPolicy{MaxAttempts: n, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
		BackoffMultiplier: 1, RetryableStatusCodes: []codes.Code{codes.Unavailable}}
}

func eventsOf(v *View, part adminv1.Part, kind adminv1.EventKind) []*adminv1.Event {
	all, _ := v.Events(0, 0)
	var out []*adminv1.Event
	for _, e := range all {
		if e.GetPart() == part && e.GetKind() == kind {
			out = append(out, e)
		}
	}
	return out
}

func refusingOf(view *adminv1.View, part adminv1.Part) *adminv1.Refusing {
	for _, r := range view.GetRefusing() {
		if r.GetPart() == part {
			return r
		}
	}
	return nil
}

// TestBreakerOpeningShowsTheFailuresThatOpenedIt: a backend failing with
// UNAVAILABLE opens the breaker (3 failures in a row); the view's event is
// closed → open with those failures, counted by code with the latest's
// message, the breaker is first in "refusing now" with that cause, and the
// method's row shows it open with its recent failures.
func TestBreakerOpeningShowsTheFailuresThatOpenedIt(t *testing.T) {
	srv := &testserver.Server{}
	srv.SetScript(func(testserver.Attempt) testserver.Outcome {
		return testserver.Outcome{Err: status.Error(codes.Unavailable, "backend down for maintenance")}
	})
	v := newView(t)
	ec, _, _ := startClient(t, v, "orders", srv, methodConfig(serviceconfig.MethodConfig{
		RetryPolicy:    retryUnavailable(2),
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 3, OpenDuration: time.Hour},
	}), interceptor.WithRetryBudget(nil))
	ctx := context.Background()
	for range 3 { // 2 attempts each: the breaker opens on the 3rd failure
		_, _ = ec.Echo(ctx, &echov1.EchoRequest{})
	}
	_, err := ec.Echo(ctx, &echov1.EchoRequest{})
	if !strings.Contains(err.Error(), "circuit breaker open") {
		t.Fatalf("after 3 failures, Echo = %v, want the open breaker's rejection", err)
	}
	opened := eventsOf(v, adminv1.Part_PART_BREAKER, adminv1.EventKind_EVENT_KIND_BREAKER_STATE)
	if len(opened) != 1 {
		t.Fatalf("breaker events: %v, want one", opened)
	}
	e := opened[0]
	if e.GetFrom() != "closed" || e.GetTo() != "open" || e.GetSubject() != echoMethod || e.GetSource() != "orders" ||
		!strings.Contains(e.GetCause(), "UNAVAILABLE ×2") || !strings.Contains(e.GetCause(), `"backend down for maintenance"`) ||
		len(e.GetFailures()) != 2 || !strings.Contains(e.GetCause(), "open until") || e.GetUntil() == nil {
		t.Errorf("opening event = %v; want closed → open of %s with the 2 UNAVAILABLE failures heard of before it, the latest's message, until when", e, echoMethod)
	}
	view := v.Snapshot()
	r := refusingOf(view, adminv1.Part_PART_BREAKER)
	if r == nil || r.GetSubject() != echoMethod || !strings.Contains(r.GetCause(), "breaker open: opened on failures; the 2 failed attempts heard of before it: UNAVAILABLE ×2") || r.GetSequence() != e.GetSequence() {
		t.Errorf("refusing now = %v, want the open breaker with the opening's cause", view.GetRefusing())
	}
	m := view.GetClients()[0].GetMethods()[0]
	if m.GetBreaker().GetState() != adminv1.BreakerState_BREAKER_STATE_OPEN || m.GetBreaker().GetTrips() != 1 || len(m.GetRecentFailures()) != 3 ||
		m.GetRecentFailures()[2].GetMessage() != "backend down for maintenance" {
		t.Errorf("method row = %v, want the breaker open after 1 trip, the 3 failures heard of", m)
	}
}

// TestClientRefusalsAreEvents: a full bulkhead, adaptive throttling, a
// spent retry budget and A6 throttling each refuse a call; each is one
// event of its part with its reason, and in "refusing now".
func TestClientRefusalsAreEvents(t *testing.T) {
	unavailable := func(testserver.Attempt) testserver.Outcome {
		return testserver.Outcome{Err: status.Error(codes.Unavailable, "down")}
	}
	tests := []struct {
		name   string
		script testserver.Script
		opts   []interceptor.ClientOption
		drive  func(ec echov1.EchoServiceClient, srv *testserver.Server)
		part   adminv1.Part
		reason string
	}{
		{"bulkhead full", nil, []interceptor.ClientOption{methodConfig(serviceconfig.MethodConfig{
			RetryPolicy: retryUnavailable(2), Bulkhead: &serviceconfig.Bulkhead{MaxConcurrent: 1}})},
			func(ec echov1.EchoServiceClient, srv *testserver.Server) {
				release := make(chan struct{})
				entered := make(chan struct{})
				srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
					if a.N == 1 {
						close(entered)
						<-release
					}
					return testserver.Outcome{}
				})
				var wg sync.WaitGroup
				wg.Go(func() { _, _ = ec.Echo(context.Background(), &echov1.EchoRequest{}) })
				<-entered
				_, _ = ec.Echo(context.Background(), &echov1.EchoRequest{}) // refused: the one slot is held
				close(release)
				wg.Wait()
			}, adminv1.Part_PART_BULKHEAD, "bulkhead_full"},
		{"adaptive throttling", unavailable, []interceptor.ClientOption{methodConfig(serviceconfig.MethodConfig{
			RetryPolicy: retryUnavailable(2), CircuitBreaker: &serviceconfig.CircuitBreaker{Mode: "adaptive", K: 1.1}})},
			func(ec echov1.EchoServiceClient, _ *testserver.Server) {
				for range 200 {
					_, _ = ec.Echo(context.Background(), &echov1.EchoRequest{})
				}
			}, adminv1.Part_PART_ADAPTIVE, "adaptive_throttle"},
		{"retry budget", unavailable, []interceptor.ClientOption{methodConfig(serviceconfig.MethodConfig{RetryPolicy: retryUnavailable(5)}),
			interceptor.WithRetryBudget(&serviceconfig.RetryBudget{Ratio: 0.01, MinRetriesPerSecond: 1})},
			func(ec echov1.EchoServiceClient, _ *testserver.Server) {
				for range 5 {
					_, _ = ec.Echo(context.Background(), &echov1.EchoRequest{})
				}
			}, adminv1.Part_PART_RETRY_BUDGET, "retry_budget"},
		{"retry throttling", unavailable, []interceptor.ClientOption{methodConfig(serviceconfig.MethodConfig{RetryPolicy: retryUnavailable(5)}),
			interceptor.WithRetryBudget(nil), interceptor.WithServiceConfig(&serviceconfig.Config{
				RetryThrottling: &serviceconfig.RetryThrottling{MaxTokens: 4, TokenRatio: 0.1}})},
			func(ec echov1.EchoServiceClient, _ *testserver.Server) {
				for range 3 {
					_, _ = ec.Echo(context.Background(), &echov1.EchoRequest{})
				}
			}, adminv1.Part_PART_RETRY_THROTTLING, "retry_throttling"},
		{"rate limited", nil, []interceptor.ClientOption{methodConfig(serviceconfig.MethodConfig{
			RetryPolicy: retryUnavailable(2), RateLimit: &serviceconfig.ClientRateLimit{Rate: 1, Per: time.Hour, Burst: 1}})},
			func(ec echov1.EchoServiceClient, _ *testserver.Server) {
				for range 3 {
					_, _ = ec.Echo(context.Background(), &echov1.EchoRequest{})
				}
			}, adminv1.Part_PART_RATE_LIMIT, "rate_limited"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := &testserver.Server{}
			srv.SetScript(tt.script)
			v := newView(t)
			ec, _, _ := startClient(t, v, "c", srv, tt.opts...)
			tt.drive(ec, srv)
			got := eventsOf(v, tt.part, adminv1.EventKind_EVENT_KIND_REFUSED)
			if len(got) != 1 || got[0].GetReason() != tt.reason || got[0].GetSubject() != echoMethod || got[0].GetCount() < 1 {
				all, _ := v.Events(0, 0)
				t.Fatalf("events of %v: %v, want one %s refusal of %s; all: %v", tt.part, got, tt.reason, echoMethod, all)
			}
			found := false
			for _, r := range v.Snapshot().GetRefusing() {
				found = found || r.GetPart() == tt.part && strings.Contains(r.GetCause(), "refused, the latest at")
			}
			if !found {
				t.Errorf("refusing now = %v, want the %v with its count", v.Snapshot().GetRefusing(), tt.part)
			}
		})
	}
}

// TestClientPacingShowsInTheMethodAndItsRefusals: a server's
// RESOURCE_EXHAUSTED with a pushback paces the method: its row shows the
// pace (period, next slot), "refusing now" lists it, and a call the pace
// refuses locally is a rate_limited event whose cause names the pacing.
func TestClientPacingShowsInTheMethodAndItsRefusals(t *testing.T) {
	srv := &testserver.Server{}
	srv.SetScript(func(testserver.Attempt) testserver.Outcome {
		return testserver.Outcome{Err: status.Error(codes.ResourceExhausted, "over the rate limit"),
			Trailer: metadata.Pairs("grpc-retry-pushback-ms", "60000")}
	})
	v := newView(t)
	ec, _, _ := startClient(t, v, "c", srv, methodConfig(serviceconfig.MethodConfig{
		RetryPolicy: retryUnavailable(2), RateLimit: &serviceconfig.ClientRateLimit{}}))
	if _, err := ec.Echo(context.Background(), &echov1.EchoRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("first call: %v, want the server's RESOURCE_EXHAUSTED", err)
	}
	_, _ = ec.Echo(context.Background(), &echov1.EchoRequest{}) // takes the paced slot, or is refused
	_, err := ec.Echo(context.Background(), &echov1.EchoRequest{})
	if !errors.Is(err, interceptor.ErrRateLimited) {
		t.Fatalf("paced call: %v, want ErrRateLimited", err)
	}
	view := v.Snapshot()
	rl := view.GetClients()[0].GetMethods()[0].GetRateLimit()
	if rl == nil || rl.GetPeriod().AsDuration() != 30*time.Second || rl.GetPacedUntil() == nil {
		t.Errorf("method's rate limit = %v, want paced by 30s (the minute capped by WithMaxServerPushback's default)", rl)
	}
	var paced bool
	for _, r := range view.GetRefusing() {
		paced = paced || r.GetPart() == adminv1.Part_PART_RATE_LIMIT && strings.Contains(r.GetCause(), "paced by the server's pushback: one attempt per 30s")
	}
	if !paced {
		t.Errorf("refusing now = %v, want the method paced", view.GetRefusing())
	}
	got := eventsOf(v, adminv1.Part_PART_RATE_LIMIT, adminv1.EventKind_EVENT_KIND_REFUSED)
	if len(got) == 0 { // one episode, or more if the machine stalled a second between the refusals
		t.Fatal("no rate-limit event")
	}
	for _, e := range got {
		if e.GetReason() != "rate_limited" || !strings.Contains(e.GetCause(), "paced by the server's pushback: one attempt per 30s") {
			t.Errorf("rate-limit event = %v, want one naming the pacing", e)
		}
	}
}

// TestClientNamesAreChecked: an empty, repeated or unprintable name is
// refused with the reason; a closed source frees its name.
func TestClientNamesAreChecked(t *testing.T) {
	v := newView(t)
	src, err := v.Client("a")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", "a", "x\ny", strings.Repeat("n", maxText+1)} {
		if _, err := v.Client(name); err == nil {
			t.Errorf("Client(%q) = nil error, want a refusal", name)
		}
	}
	src.Close()
	if _, err := v.Client("a"); err != nil {
		t.Errorf("Client(a) after Close = %v, want it free", err)
	}
	if _, err := v.Server("a"); err != nil {
		t.Errorf("Server(a) = %v: Servers and Clients have names of their own", err)
	}
}

// TestMethodsShowTheirPolicyAndWhereItCameFrom: a method with a breaker,
// and one with only a retry policy once it failed, are each listed with
// the entry in force (as service-config JSON) and the option it came from;
// the page and the CLI's JSON carry both.
func TestMethodsShowTheirPolicyAndWhereItCameFrom(t *testing.T) {
	srv := &testserver.Server{}
	srv.SetScript(func(testserver.Attempt) testserver.Outcome {
		return testserver.Outcome{Err: status.Error(codes.Unavailable, "down")}
	})
	v := newView(t)
	lookup := "/" + echoService + "/Lookup"
	ec, _, _ := startClient(t, v, "orders", srv,
		interceptor.WithMethodConfig(serviceconfig.MethodConfig{
			Name:           []serviceconfig.Name{{Service: echoService, Method: "Lookup"}},
			CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5},
		}),
		interceptor.WithRetryPolicy(retryUnavailable(2), echoService),
		interceptor.WithRetryBudget(nil))
	view := v.Snapshot()
	if ms := view.GetClients()[0].GetMethods(); len(ms) != 1 || ms[0].GetFullMethod() != lookup ||
		ms[0].GetPolicySource() != "WithMethodConfig: entry 0" || !strings.Contains(ms[0].GetPolicy(), `"consecutiveFailures":5`) {
		t.Fatalf("methods before any call = %v, want Lookup with its breaker entry from WithMethodConfig", ms)
	}
	_, _ = ec.Echo(context.Background(), &echov1.EchoRequest{})
	ms := v.Snapshot().GetClients()[0].GetMethods()
	if len(ms) != 2 || ms[0].GetFullMethod() != echoMethod || ms[1].GetFullMethod() != lookup {
		t.Fatalf("methods after Echo failed = %v, want Echo (its failures) and Lookup, sorted", ms)
	}
	if m := ms[0]; m.GetPolicySource() != "WithRetryPolicy" || !strings.Contains(m.GetPolicy(), `"maxAttempts":2`) ||
		len(m.GetRecentFailures()) != 2 || m.GetBreaker() != nil {
		t.Errorf("Echo's row = %v, want its retry policy from WithRetryPolicy and its 2 failed attempts", m)
	}
	rec := httptest.NewRecorder()
	v.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if body := rec.Body.String(); !strings.Contains(body, "from WithMethodConfig: entry 0") || !strings.Contains(body, "from WithRetryPolicy") {
		t.Errorf("the page does not name where the policies came from:\n%s", body)
	}
}
