package server

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestLimitsValidateAgreesWithNew pins, for each way a Limits can be wrong,
// the error that Limits.Validate and New(WithLimits(...)) both return,
// naming the field at fault; and that the Limits that are right pass both.
func TestLimitsValidateAgreesWithNew(t *testing.T) {
	top := func() *serviceconfig.ConcurrencyLimit { return &serviceconfig.ConcurrencyLimit{} }
	byKey := &serviceconfig.TenantFairness{MetadataKey: "x-tenant"}
	anyone := func(context.Context) string { return "" }
	bad := []struct {
		name string
		l    Limits
		want string
	}{
		{"Config: a limit's field", Limits{Config: serviceconfig.ServerConfig{ConcurrencyLimit: &serviceconfig.ConcurrencyLimit{MinLimit: -1}}},
			"server: Limits.Config: serviceconfig: concurrencyLimit.minLimit: must not be negative"},
		{"Config: a methodConfig entry without a limit", Limits{Config: serviceconfig.ServerConfig{MethodConfig: []serviceconfig.ServerMethodConfig{
			{Name: []serviceconfig.Name{{Service: "a.B"}}}}}},
			"server: Limits.Config: serviceconfig: methodConfig[0]: needs a concurrencyLimit or rateLimits"},
		{"Config: a bad tenant metadataKey", Limits{Config: serviceconfig.ServerConfig{ConcurrencyLimit: top(),
			TenantFairness: &serviceconfig.TenantFairness{MetadataKey: "X-Tenant"}}},
			"server: Limits.Config: serviceconfig: tenantFairness.metadataKey: must be a lower-case metadata key"},
		{"Config: a bad tenant metadataKey beside Tenant", Limits{Tenant: anyone, Config: serviceconfig.ServerConfig{ConcurrencyLimit: top(),
			TenantFairness: &serviceconfig.TenantFairness{MetadataKey: "X-Tenant"}}},
			"server: Limits.Config: serviceconfig: tenantFairness.metadataKey: must be a lower-case metadata key"},
		{"tenant fairness without a metadataKey and without Tenant", Limits{Config: serviceconfig.ServerConfig{ConcurrencyLimit: top(),
			TenantFairness: &serviceconfig.TenantFairness{MaxTenants: 10}}},
			"server: Limits: Config.TenantFairness has no metadataKey and Limits.Tenant is nil"},
		{"tenant fairness without a limit", Limits{Config: serviceconfig.ServerConfig{TenantFairness: byKey}},
			"server: Limits.Config.TenantFairness: no concurrency limit in Limits.Config to share"},
		{"Streams: a bad name", Limits{Config: serviceconfig.ServerConfig{ConcurrencyLimit: top()}, Streams: []string{"pkg.S", "/pkg.S/"}},
			"server: Limits.Streams[1]: "},
		{"Streams without any limit", Limits{Streams: []string{"pkg.S"}},
			`server: Limits.Streams[0] "pkg.S": no concurrency limit covers it`},
		{"Streams under CPU shedding only", Limits{CPU: &CPUShedding{}, Streams: []string{"pkg.S"}},
			`server: Limits.Streams[0] "pkg.S": no concurrency limit covers it`},
		// Issue 33, finding 5: settings that cannot apply were accepted in
		// silence.
		{"Streams naming a service no limit covers", Limits{Streams: []string{"/a.B/Watch", "c.D"}, Config: serviceconfig.ServerConfig{
			MethodConfig: []serviceconfig.ServerMethodConfig{methodLimitOf(t, "a.B", serviceconfig.ConcurrencyLimit{})}}},
			`server: Limits.Streams[1] "c.D": no concurrency limit covers it`},
		{"Streams naming a method no limit covers", Limits{Streams: []string{"/c.D/Watch"}, Config: serviceconfig.ServerConfig{
			MethodConfig: []serviceconfig.ServerMethodConfig{methodLimitOf(t, "/c.D/Other", serviceconfig.ConcurrencyLimit{})}}},
			`server: Limits.Streams[0] "/c.D/Watch": no concurrency limit covers it`},
		{"Tenant without TenantFairness", Limits{Tenant: anyone, Config: serviceconfig.ServerConfig{ConcurrencyLimit: top()}},
			"server: Limits.Tenant is set but Limits.Config.TenantFairness is nil"},
		{"CPU: a bad threshold", Limits{CPU: &CPUShedding{CPUThreshold: 2}}, "server: Limits.CPU: limit: cpuThreshold"},
		{"Rand: a nil pointer of a source type", Limits{Rand: (*rand.PCG)(nil), Config: serviceconfig.ServerConfig{ConcurrencyLimit: top()}},
			"server: Limits.Rand is a nil *rand.PCG"},
		{"CPU and a top-level limit at once", Limits{CPU: &CPUShedding{}, Config: serviceconfig.ServerConfig{ConcurrencyLimit: top()}},
			"server: Limits: Config.ConcurrencyLimit and CPU: choose one for the server"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) { wantLimitsError(t, tt.l, tt.want) })
	}
	good := []struct {
		name string
		l    Limits
	}{
		{"zero: no protection", Limits{}},
		{"a top-level limit", Limits{Config: serviceconfig.ServerConfig{ConcurrencyLimit: top()}}},
		{"CPU shedding beside a method's own limit", Limits{CPU: &CPUShedding{}, Config: serviceconfig.ServerConfig{
			MethodConfig: []serviceconfig.ServerMethodConfig{methodLimitOf(t, "a.B", serviceconfig.ConcurrencyLimit{})}}}},
		{"Streams under a method's limit", Limits{Streams: []string{"/a.B/Watch"}, Config: serviceconfig.ServerConfig{
			MethodConfig: []serviceconfig.ServerMethodConfig{methodLimitOf(t, "a.B", serviceconfig.ConcurrencyLimit{})}}}},
		{"Streams of a service one of whose methods has a limit", Limits{Streams: []string{"a.B", "/a.B/Watch"}, Config: serviceconfig.ServerConfig{
			MethodConfig: []serviceconfig.ServerMethodConfig{methodLimitOf(t, "/a.B/Watch", serviceconfig.ConcurrencyLimit{})}}}},
		{"Streams under the server's limit", Limits{Streams: []string{"c.D"}, Config: serviceconfig.ServerConfig{ConcurrencyLimit: top()}}},
		{"tenant fairness by metadataKey", Limits{Config: serviceconfig.ServerConfig{ConcurrencyLimit: top(), TenantFairness: byKey}}},
		// WithTenantFairness(cfg, f) took a tenant function without a
		// metadataKey; Limits must too (the document's JSON needs the key).
		{"tenant fairness by Tenant, without a metadataKey", Limits{Tenant: anyone, Config: serviceconfig.ServerConfig{
			ConcurrencyLimit: top(), TenantFairness: &serviceconfig.TenantFairness{MaxTenants: 10}}}},
	}
	for _, tt := range good {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.l.Validate(); err != nil {
				t.Errorf("Limits.Validate() = %v, want nil", err)
			}
			if _, err := New(WithLimits(tt.l)); err != nil {
				t.Errorf("New(WithLimits()) = %v, want nil", err)
			}
		})
	}
}

// TestOptionsGivenTwiceAreRefused: a second WithLimits or WithIdempotency
// is refused by New, whatever the two hold, rather than replace the first
// and drop its settings unseen (review r25: the old options translated one
// by one, WithLimits(Limits{Config: doc}), WithLimits(Limits{Criticality:
// f}), built a Server with no limit at all, and no error).
func TestOptionsGivenTwiceAreRefused(t *testing.T) {
	seven := serviceconfig.ConcurrencyLimit{InitialLimit: 7, MinLimit: 7, MaxLimit: 7}
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	idem := Idempotency{Store: store, Scope: SharedScope}
	tests := []struct {
		name string
		opts []Option
		want string
	}{
		{"a document, then a criticality function", []Option{WithLimits(limitsOf(seven)),
			WithLimits(Limits{Criticality: CapCriticality(wire.CriticalPlus)})}, "WithLimits given twice"},
		{"CPU shedding, then a top-level limit", []Option{WithLimits(Limits{CPU: &CPUShedding{}}), WithLimits(limitsOf(seven))}, "WithLimits given twice"},
		{"a limit, then Limits{}", []Option{WithLimits(limitsOf(seven)), WithHeadroom(0, 0), WithLimits(Limits{})}, "WithLimits given twice"},
		{"idempotency twice", []Option{WithIdempotency(idem), WithIdempotency(idem)}, "WithIdempotency given twice"},
		// Issue 33, finding 5: these took the last, silently.
		{"headroom twice", []Option{WithHeadroom(time.Millisecond, 0), WithHeadroom(0, 0)}, "WithHeadroom given twice"},
		{"logger twice", []Option{WithLogger(slog.Default()), WithLogger(nil)}, "WithLogger given twice"},
		{"meter provider twice", []Option{WithMeterProvider(noop.NewMeterProvider()), WithMeterProvider(noop.NewMeterProvider())},
			"WithMeterProvider given twice"},
		{"refusal hook twice", []Option{WithOnRefusal(func(context.Context, Refusal) {}), WithOnRefusal(func(context.Context, Refusal) {})},
			"WithOnRefusal given twice"},
		{"nil refusal hook", []Option{WithOnRefusal(nil)}, "WithOnRefusal: nil function"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, err := New(tt.opts...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New(...) = %v, %v; want an error containing %q", srv, err, tt.want)
			}
		})
	}
	// Each once, side by side: fine.
	if _, err := New(WithLimits(limitsOf(seven)), WithIdempotency(idem)); err != nil {
		t.Errorf("New(WithLimits, WithIdempotency) = %v, want no error", err)
	}
}

// TestWithLimitsTakesLimitsAsGiven: WithLimits, like WithIdempotency, takes
// l as it is when it is called. Limits holds pointers and slices (the
// document's limits, Streams, CPU); what they point to may change after
// WithLimits, before New (an option list built once, a document parsed
// into the same value again), and the Server must not see it: before,
// New read them only when it ran, so a limit of 1 became one of 1000.
func TestWithLimitsTakesLimitsAsGiven(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		one := serviceconfig.ConcurrencyLimit{InitialLimit: 1, MinLimit: 1, MaxLimit: 1}
		l := limitsOf(one)
		l.Streams = []string{"/resilience.echo.v1.EchoService/Watch"}
		opt := WithLimits(l)
		*l.Config.ConcurrencyLimit = serviceconfig.ConcurrencyLimit{MaxLimit: 1000, InitialLimit: 1000}
		l.Streams[0] = "/not a method/"
		srv := newServer(t, opt)

		release := make(chan struct{})
		impl := &fnEcho{fn: func(context.Context, *echov1.EchoRequest) (*echov1.EchoResponse, error) {
			<-release
			return &echov1.EchoResponse{}, nil
		}}
		client := serveLimited(t, impl, srv)
		first := make(chan error, 1)
		go func() { first <- echoWithin(client, 0, "first") }()
		synctest.Wait() // the first call holds the one slot
		if err := echoWithin(client, 0, "second"); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("a second call while the first holds the limit of 1: %v, want RESOURCE_EXHAUSTED", err)
		}
		close(release)
		if err := <-first; err != nil {
			t.Errorf("first call: %v", err)
		}
		if st := srv.LimitStatuses(); len(st) != 1 || st[0].Limit != 1 {
			t.Errorf("LimitStatuses() = %+v, want the limit of 1 given to WithLimits", st)
		}
	})
}

// newServer is New(opts...), failing t on an error.
func newServer(t *testing.T, opts ...Option) *Server {
	t.Helper()
	srv, err := New(opts...)
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	return srv
}

// TestOptionValuesHoldNoState pins finding 5 of issue 33: WithLimits built
// the limits' random source when it was called, so two Servers built from
// one Limits (or one Option) drew from one Limits.Rand at once, which the
// docs said was serialized: a data race on the source under -race. Now an
// Option holds only what it was given, and each Server seeds its own
// generator from the source when New builds it.
func TestOptionValuesHoldNoState(t *testing.T) {
	l := Limits{Config: serviceconfig.ServerConfig{ConcurrencyLimit: &serviceconfig.ConcurrencyLimit{InitialLimit: 2, MinLimit: 1}},
		Rand: rand.NewPCG(1, 2)}
	opt := WithLimits(l)
	servers := []*Server{newServer(t, opt), newServer(t, opt), newServer(t, WithLimits(l))}
	fast := &fnEcho{fn: func(context.Context, *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		return &echov1.EchoResponse{}, nil
	}}
	var wg sync.WaitGroup
	for _, srv := range servers {
		client := serveLimited(t, fast, srv)
		for range 4 {
			wg.Go(func() {
				for range 200 { // probes every limit or so of samples: each draws from the generator
					if err := echoWithin(client, 0, "m"); err != nil && status.Code(err) != codes.ResourceExhausted {
						t.Errorf("Echo: %v", err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	for i, srv := range servers {
		if st := srv.LimitStatuses()[0]; st.InFlight != 0 {
			t.Errorf("server %d: %d in flight after the calls, want 0", i, st.InFlight)
		}
	}
}
