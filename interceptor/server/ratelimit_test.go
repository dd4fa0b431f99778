package server

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/internal/pushback"
	quota "github.com/grpc-resilience/resilience/interceptor/ratelimit"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

const rateTenantKey = "x-tenant"

// countEcho counts the handler's runs; its streams answer one message.
type countEcho struct {
	echov1.UnimplementedEchoServiceServer
	runs atomic.Int64
}

func (e *countEcho) Echo(context.Context, *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	e.runs.Add(1)
	return &echov1.EchoResponse{}, nil
}

func (e *countEcho) ServerStream(_ *echov1.ServerStreamRequest, ss grpc.ServerStreamingServer[echov1.ServerStreamResponse]) error {
	e.runs.Add(1)
	return ss.Send(&echov1.ServerStreamResponse{})
}

// rateLimits is a Limits with the top-level rate limits rl, tenants named
// by the x-tenant metadata.
func rateLimits(rl ...serviceconfig.RateLimit) Limits {
	return Limits{Config: serviceconfig.ServerConfig{RateLimits: rl}, Tenant: TenantFromMetadata(rateTenantKey)}
}

func newRateServer(t testing.TB, l Limits, opts ...Option) *Server {
	t.Helper()
	srv, err := New(append([]Option{WithLimits(l)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

func tenantCtx(tenant string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), rateTenantKey, tenant)
}

// refusal is what a rate-limited answer carried.
type refusal struct {
	code       codes.Code
	retryInfo  time.Duration
	violations []string
	pushback   time.Duration
}

func refusalOf(err error, trailer metadata.MD) refusal {
	st := status.Convert(err)
	r := refusal{code: st.Code(), retryInfo: -1, pushback: -1}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			r.retryInfo = d.GetRetryDelay().AsDuration()
		case *errdetails.QuotaFailure:
			for _, v := range d.GetViolations() {
				r.violations = append(r.violations, v.GetSubject())
			}
		}
	}
	if h, ok, _ := pushback.Hint(nil, trailer); ok {
		r.pushback = h
	}
	return r
}

// TestRateLimitRefusalCarriesExactRetryInfoQuotaFailureAndPushback: a call
// over its tenant's limit gets RESOURCE_EXHAUSTED with the exact wait in a
// RetryInfo, the same wait (in whole milliseconds, rounded up) in the A6
// trailer, and a QuotaFailure naming the limit; its handler does not run;
// another tenant is untouched; after the wait, the tenant is admitted again.
func TestRateLimitRefusalCarriesExactRetryInfoQuotaFailureAndPushback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		impl := &countEcho{}
		srv := newRateServer(t, rateLimits(serviceconfig.RateLimit{Name: "per-tenant", Rate: 3, Burst: 2, Key: serviceconfig.KeyTenant}))
		client := echov1.NewEchoServiceClient(serveEcho(t, impl, srv))
		a := tenantCtx("a")
		for i := range 2 {
			if _, err := client.Echo(a, &echov1.EchoRequest{}); err != nil {
				t.Fatalf("call %d of the burst: %v", i, err)
			}
		}
		var trailer metadata.MD
		_, err := client.Echo(a, &echov1.EchoRequest{}, grpc.Trailer(&trailer))
		got := refusalOf(err, trailer)
		interval := time.Second / 3 // 333.333333ms, the emission interval
		want := refusal{code: codes.ResourceExhausted, retryInfo: interval, violations: []string{"ratelimit:per-tenant"}, pushback: 334 * time.Millisecond}
		if got.code != want.code || got.retryInfo != want.retryInfo || strings.Join(got.violations, ",") != "ratelimit:per-tenant" || got.pushback != want.pushback {
			t.Fatalf("third call: %+v, want %+v", got, want)
		}
		if n := impl.runs.Load(); n != 2 {
			t.Errorf("handler ran %d times, want 2", n)
		}
		if _, err := client.Echo(tenantCtx("b"), &echov1.EchoRequest{}); err != nil {
			t.Errorf("another tenant: %v, want admitted", err)
		}
		time.Sleep(got.retryInfo - time.Nanosecond)
		if _, err := client.Echo(a, &echov1.EchoRequest{}); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("a nanosecond before the wait: %v, want RESOURCE_EXHAUSTED", err)
		}
		time.Sleep(time.Nanosecond)
		if _, err := client.Echo(a, &echov1.EchoRequest{}); err != nil {
			t.Errorf("after the wait: %v, want admitted", err)
		}
	})
}

// TestRateLimitAdmitsExactlyTheRateOverRealGRPC: a tenant offering three
// times its rate for 10 s of fake time gets exactly the burst and the rate
// (GCRA), over real grpc.
func TestRateLimitAdmitsExactlyTheRateOverRealGRPC(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		impl := &countEcho{}
		srv := newRateServer(t, rateLimits(serviceconfig.RateLimit{Name: "r", Rate: 10, Burst: 2, Key: serviceconfig.KeyTenant}))
		client := echov1.NewEchoServiceClient(serveEcho(t, impl, srv))
		ctx := tenantCtx("a")
		var admitted, refused int
		step := time.Second / 30
		for range 300 { // 10 s at 30/s
			if _, err := client.Echo(ctx, &echov1.EchoRequest{}); err == nil {
				admitted++
			} else if status.Code(err) == codes.ResourceExhausted {
				refused++
			} else {
				t.Fatal(err)
			}
			time.Sleep(step)
		}
		// Over [0, 10s − step]: the burst, then one token per 100ms.
		if want := 2 + 99; admitted != want || admitted+refused != 300 {
			t.Errorf("admitted %d, refused %d of 300 in 10 s, want %d admitted (burst 2 + 10/s)", admitted, refused, want)
		}
		if int(impl.runs.Load()) != admitted {
			t.Errorf("handler ran %d times for %d admitted", impl.runs.Load(), admitted)
		}
	})
}

// TestRateRefusedCallHoldsNoConcurrencySlot: the rate limit decides before
// the concurrency limit, so a call it refuses never reaches the limit (the
// limit sheds nothing and counts nothing); and a call the concurrency limit
// sheds after the rate admitted it gets its token back.
func TestRateRefusedCallHoldsNoConcurrencySlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		impl := &blockingEcho{started: make(chan struct{}, 1), release: make(chan struct{})}
		l := rateLimits(serviceconfig.RateLimit{Name: "shared", Rate: 1, Per: time.Hour, Burst: 2, Key: serviceconfig.KeyShared})
		l.Tenant = nil
		l.Config.ConcurrencyLimit = &serviceconfig.ConcurrencyLimit{InitialLimit: 1, MinLimit: 1, MaxLimit: 1}
		srv := newRateServer(t, l)
		client := echov1.NewEchoServiceClient(serveEcho(t, impl, srv))
		done := make(chan error)
		go func() {
			_, err := client.Echo(context.Background(), &echov1.EchoRequest{Message: "first"})
			done <- err
		}()
		<-impl.started // holds the only slot and one of the two tokens
		// Takes the second token, is shed by the concurrency limit, gets
		// the token back.
		_, err := client.Echo(context.Background(), &echov1.EchoRequest{})
		if r := refusalOf(err, nil); r.code != codes.ResourceExhausted || len(r.violations) != 0 {
			t.Fatalf("second call: %v, want shed by the concurrency limit (no QuotaFailure)", err)
		}
		close(impl.release)
		if err := <-done; err != nil {
			t.Fatalf("first call: %v", err)
		}
		impl.release = make(chan struct{})
		close(impl.release)
		if _, err := client.Echo(context.Background(), &echov1.EchoRequest{}); err != nil {
			t.Fatalf("third call, on the refunded token: %v", err)
		}
		// The bucket is empty now: refused by the rate, never seen by the
		// concurrency limit.
		before := srv.LimitStatuses()[0]
		_, err = client.Echo(context.Background(), &echov1.EchoRequest{})
		if r := refusalOf(err, nil); r.code != codes.ResourceExhausted || len(r.violations) != 1 {
			t.Fatalf("fourth call: %v, want refused by the rate limit", err)
		}
		after := srv.LimitStatuses()[0]
		if after.Admitted != before.Admitted || after.ShedLimit != before.ShedLimit || after.InFlight != 0 {
			t.Errorf("the concurrency limit saw the rate-refused call: before %+v, after %+v", before, after)
		}
	})
}

// TestRateLimitDuplicateReplaySpendsNoToken: a keyed call spends a token
// when its handler runs; a duplicate that replays its stored outcome is no
// work, spends none and is not refused however empty the bucket; a new key
// is refused, and its claim released (a later retry runs it).
func TestRateLimitDuplicateReplaySpendsNoToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		impl := &countEcho{}
		l := rateLimits(serviceconfig.RateLimit{Name: "per-scope", Rate: 1, Per: time.Second, Burst: 1, Key: serviceconfig.KeyIdempotencyScope})
		l.Tenant = nil
		srv := newRateServer(t, l, sharedIdempotency(store))
		client := echov1.NewEchoServiceClient(serveEcho(t, impl, srv))
		keyed := func(k string) context.Context {
			return metadata.AppendToOutgoingContext(context.Background(), wire.IdempotencyKeyHeader, k)
		}
		for i := range 5 {
			if _, err := client.Echo(keyed("k1"), &echov1.EchoRequest{Message: "m"}); err != nil {
				t.Fatalf("call %d with k1: %v", i, err)
			}
		}
		if _, err := client.Echo(keyed("k2"), &echov1.EchoRequest{Message: "m"}); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("k2: %v, want RESOURCE_EXHAUSTED", err)
		}
		if n := impl.runs.Load(); n != 1 {
			t.Errorf("handler ran %d times, want 1", n)
		}
		time.Sleep(time.Second)
		if _, err := client.Echo(keyed("k2"), &echov1.EchoRequest{Message: "m"}); err != nil {
			t.Fatalf("k2 retried after the wait: %v (its refusal must not be stored)", err)
		}
	})
}

// TestRateLimitStreams: a stream spends a token when it opens, and one
// over the limit is refused before its handler runs, with the same
// details as a unary call.
func TestRateLimitStreams(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		impl := &countEcho{}
		srv := newRateServer(t, rateLimits(serviceconfig.RateLimit{Name: "r", Rate: 10, Burst: 1, Key: serviceconfig.KeyTenant}))
		client := echov1.NewEchoServiceClient(serveEcho(t, impl, srv))
		open := func() (refusal, error) {
			st, err := client.ServerStream(tenantCtx("a"), &echov1.ServerStreamRequest{})
			if err != nil {
				return refusal{}, err
			}
			for {
				if _, err = st.Recv(); err != nil {
					break
				}
			}
			if errors.Is(err, io.EOF) {
				return refusal{}, nil
			}
			return refusalOf(err, st.Trailer()), nil
		}
		if r, err := open(); err != nil || r.code != codes.OK {
			t.Fatalf("first stream: %+v, %v", r, err)
		}
		r, err := open()
		if err != nil || r.code != codes.ResourceExhausted || r.retryInfo != 100*time.Millisecond || r.pushback != 100*time.Millisecond || len(r.violations) != 1 {
			t.Fatalf("second stream: %+v, %v; want refused, told 100ms", r, err)
		}
		if n := impl.runs.Load(); n != 1 {
			t.Errorf("handler ran %d times, want 1", n)
		}
	})
}

// TestRateLimitExemptsHealthUnlessNamed: the server's limits do not reach
// health checks; an entry that names the health service does.
func TestRateLimitExemptsHealthUnlessNamed(t *testing.T) {
	one := serviceconfig.RateLimit{Name: "one", Rate: 1, Per: time.Hour, Burst: 1, Key: serviceconfig.KeyShared}
	for _, named := range []bool{false, true} {
		t.Run("named="+strconv.FormatBool(named), func(t *testing.T) {
			l := Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{one}}}
			if named {
				h := one
				h.Name = "health"
				l.Config.MethodConfig = []serviceconfig.ServerMethodConfig{{Name: []serviceconfig.Name{{Service: "grpc.health.v1.Health"}}, RateLimits: []serviceconfig.RateLimit{h}}}
			}
			srv := newRateServer(t, l)
			icpt := srv.UnaryServerInterceptor()
			info := &grpc.UnaryServerInfo{FullMethod: healthpb.Health_Check_FullMethodName}
			h := func(context.Context, any) (any, error) { return nil, nil }
			var refused int
			for range 5 {
				if _, err := icpt(context.Background(), nil, info, h); err != nil {
					refused++
				}
			}
			if want := map[bool]int{false: 0, true: 4}[named]; refused != want {
				t.Errorf("health checks refused: %d of 5, want %d", refused, want)
			}
		})
	}
}

// TestRateLimitTenantFloodIsBounded: a caller naming a new tenant on every
// call makes the limit remember at most MaxKeys of them; the names beyond
// share one bucket, so the flood is limited too, and a tenant remembered
// before it keeps its own bucket.
func TestRateLimitTenantFloodIsBounded(t *testing.T) {
	l := rateLimits(serviceconfig.RateLimit{Name: "r", Rate: 1, Per: time.Hour, Burst: 3, Key: serviceconfig.KeyTenant, MaxKeys: 16})
	srv := newRateServer(t, l)
	icpt := srv.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: echoMethod}
	h := func(context.Context, any) (any, error) { return nil, nil }
	call := func(tenant string) error {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(rateTenantKey, tenant))
		_, err := icpt(ctx, nil, info, h)
		return err
	}
	if err := call("early"); err != nil {
		t.Fatal(err)
	}
	var admitted int
	for i := range 2_000 {
		if call("t"+strconv.Itoa(i)+strings.Repeat("x", i%300)) == nil {
			admitted++
		}
	}
	lim := srv.rates.top.list[0].local
	if st := lim.Stats(); st.Keys > 16 {
		t.Errorf("keys remembered: %d, want at most 16", st.Keys)
	}
	// 15 new names got their own burst of 3 (one each), the rest share
	// the overflow bucket's 3.
	if admitted > 15+3 {
		t.Errorf("admitted %d of 2,000 new names, want at most 18", admitted)
	}
	for range 2 {
		if err := call("early"); err != nil {
			t.Errorf("the tenant remembered first: %v, want its own bucket", err)
		}
	}
}

// TestRateLimitHugeRate: a rate of a call per nanosecond, the most a
// limit takes, admits a flood; one beyond it is refused with its JSON path.
func TestRateLimitHugeRate(t *testing.T) {
	srv := newRateServer(t, Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{
		{Name: "r", Rate: 1e9, Burst: 1 << 20, Key: serviceconfig.KeyShared}}}})
	icpt := srv.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: echoMethod}
	h := func(context.Context, any) (any, error) { return nil, nil }
	for i := range 10_000 {
		if _, err := icpt(context.Background(), nil, info, h); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	wantLimitsError(t, Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{
		{Name: "r", Rate: 2e9, Burst: 1, Key: serviceconfig.KeyShared}}}}, "rateLimits[0].rate")
}

// TestRateLimitOptionErrors: what a rate limit needs and does not have is
// refused, naming it.
func TestRateLimitOptionErrors(t *testing.T) {
	tenant := serviceconfig.RateLimit{Name: "t", Rate: 1, Burst: 1, Key: serviceconfig.KeyTenant}
	dist := serviceconfig.RateLimit{Name: "d", Rate: 1, Burst: 1, Key: serviceconfig.KeyShared, Distributed: true}
	wantLimitsError(t, Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{tenant}}},
		`rateLimits[0] "t" keys by tenant, but nothing names the tenants`)
	wantLimitsError(t, Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{dist}}},
		`rateLimits[0] is distributed, but Limits.Quota is nil`)
	wantLimitsError(t, Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{{Name: "s", Rate: 1, Burst: 1, Key: serviceconfig.KeyShared}}},
		Quota: quotaStub{}}, "Limits.Quota is set, but no rate limit")
	wantLimitsError(t, Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{{Name: "s", Rate: 1, Burst: 0, Key: serviceconfig.KeyShared}}}},
		"rateLimits[0].burst")
	scoped := Limits{Config: serviceconfig.ServerConfig{MethodConfig: []serviceconfig.ServerMethodConfig{{
		Name:       []serviceconfig.Name{{Service: "pkg.S"}},
		RateLimits: []serviceconfig.RateLimit{{Name: "s", Rate: 1, Burst: 1, Key: serviceconfig.KeyIdempotencyScope}}}}}}
	if _, err := New(WithLimits(scoped)); err == nil || !strings.Contains(err.Error(), `methodConfig[0].rateLimits[0] "s" keys by idempotencyScope`) {
		t.Errorf("New with an idempotencyScope limit and no idempotency: %v", err)
	}
	// A tenant-keyed rate limit is what tenantFairness names tenants for,
	// with no concurrency limit; Limits.Tenant alone names them too.
	for _, l := range []Limits{
		{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{tenant}, TenantFairness: &serviceconfig.TenantFairness{MetadataKey: "x-t"}}},
		{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{tenant}}, Tenant: TenantFromMetadata("x-t")},
	} {
		if _, err := New(WithLimits(l)); err != nil {
			t.Errorf("New(%+v): %v", l.Config, err)
		}
	}
}

// quotaStub is a Quota that is never asked (a configuration refused first).
type quotaStub struct{}

func (quotaStub) RateLimiter(serviceconfig.RateLimit) (quota.Limiter, error) {
	return nil, errors.New("quotaStub: not for use")
}

// TestRateLimitsAddUp: a call passes every limit of its method's entry and
// of the top level, whose bucket every method shares; a method no entry
// names has the top level's only; a call refused by two limits is told
// the longer wait and names both.
func TestRateLimitsAddUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := Limits{Config: serviceconfig.ServerConfig{
			RateLimits: []serviceconfig.RateLimit{{Name: "server", Rate: 1, Burst: 3, Key: serviceconfig.KeyShared}},
			MethodConfig: []serviceconfig.ServerMethodConfig{{
				Name:       []serviceconfig.Name{{Service: "pkg.S", Method: "A"}},
				RateLimits: []serviceconfig.RateLimit{{Name: "a", Rate: 2, Burst: 1, Key: serviceconfig.KeyShared}},
			}},
		}}
		srv := newRateServer(t, l)
		icpt := srv.UnaryServerInterceptor()
		h := func(context.Context, any) (any, error) { return nil, nil }
		call := func(m string) error {
			_, err := icpt(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: m}, h)
			return err
		}
		if err := call("/pkg.S/A"); err != nil {
			t.Fatal(err)
		}
		// A's own limit (burst 1) refuses; the server's got its token back.
		if err := call("/pkg.S/A"); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("second A: %v, want refused by its own limit", err)
		}
		for i := range 2 {
			if err := call("/pkg.S/B"); err != nil {
				t.Fatalf("B %d: %v (the server's burst has 2 left)", i, err)
			}
		}
		err := call("/pkg.S/A")
		r := refusalOf(err, nil)
		if r.code != codes.ResourceExhausted || strings.Join(r.violations, ",") != "ratelimit:a,ratelimit:server" || r.retryInfo != time.Second {
			t.Errorf("A with both spent: %+v, want both named, the server's wait (1s)", r)
		}
	})
}

// TestRateLimitAdmittedCallAllocatesNothing pins the hot path: a call
// admitted under a local rate limit (shared, and by tenant with a tenant
// already remembered) allocates nothing beyond the call without it.
func TestRateLimitAdmittedCallAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	tenant := func(context.Context) string { return "tenant-a" }
	for _, key := range []serviceconfig.RateLimitKey{serviceconfig.KeyShared, serviceconfig.KeyTenant, serviceconfig.KeyPeer} {
		t.Run(string(key), func(t *testing.T) {
			l := Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{
				{Name: "r", Rate: 1e9, Burst: 1 << 30, Key: key}}}}
			if key == serviceconfig.KeyTenant {
				l.Tenant = tenant
			}
			// With a WithOnRefusal hook: only the refusal path reaches it.
			srv := newRateServer(t, l, WithOnRefusal(func(context.Context, Refusal) { t.Error("an admitted call reached the refusal hook") }))
			icpt := srv.UnaryServerInterceptor()
			info := &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"}
			h := func(context.Context, any) (any, error) { return nil, nil }
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-other", "v"))
			// A TCP peer, as grpc gives it (the same Addr for every call
			// of a connection).
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 1000}})
			if _, err := icpt(ctx, nil, info, h); err != nil { // remembers the key
				t.Fatal(err)
			}
			if n := testing.AllocsPerRun(1000, func() {
				if _, err := icpt(ctx, nil, info, h); err != nil {
					t.Fatal(err)
				}
			}); n != 0 {
				t.Errorf("allocs per admitted call = %v, want 0", n)
			}
		})
	}
}

// TestRateLimitMetrics: each limit counts the calls it admitted and
// refused by criticality, and a refused call counts once among the
// server's sheds, with reason ratelimit, beside the concurrency limit's.
func TestRateLimitMetrics(t *testing.T) {
	r, mp := newMeterReader()
	l := Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{{Name: "one", Rate: 1, Per: time.Hour, Burst: 2, Key: serviceconfig.KeyShared}}}}
	srv := newRateServer(t, l, WithMeterProvider(mp))
	icpt := srv.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"}
	h := func(context.Context, any) (any, error) { return nil, nil }
	sheddable := metadata.NewIncomingContext(context.Background(), metadata.Pairs(wire.CriticalityKey, "SHEDDABLE"))
	for range 2 {
		_, _ = icpt(context.Background(), nil, info, h)
	}
	_, _ = icpt(context.Background(), nil, info, h)
	_, _ = icpt(sheddable, nil, info, h)
	got := collect(t, r)
	got.Expect(t, metricSrvRateAdmitted, "{call}", map[string]float64{"resilience.criticality=CRITICAL,resilience.ratelimit=one": 2})
	got.Expect(t, metricSrvRateLimited, "{call}", map[string]float64{
		"resilience.criticality=CRITICAL,resilience.ratelimit=one":  1,
		"resilience.criticality=SHEDDABLE,resilience.ratelimit=one": 1,
	})
	got.Expect(t, metricSrvLimitShed, "{call}", map[string]float64{
		"grpc.method=pkg.S/M,resilience.criticality=CRITICAL,resilience.reason=ratelimit":  1,
		"grpc.method=pkg.S/M,resilience.criticality=SHEDDABLE,resilience.reason=ratelimit": 1,
	})
}

// TestRateLimitPeerKeyIsTheIPWithoutPort: callers from one IP share a
// bucket whatever their port (and an IPv4 address is one key however it is
// written); another IP has its own.
func TestRateLimitPeerKeyIsTheIPWithoutPort(t *testing.T) {
	l := Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{{Name: "p", Rate: 1, Per: time.Hour, Burst: 1, Key: serviceconfig.KeyPeer}}}}
	srv := newRateServer(t, l)
	icpt := srv.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: echoMethod}
	h := func(context.Context, any) (any, error) { return nil, nil }
	from := func(ip string, port int) error {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: port}})
		_, err := icpt(ctx, nil, info, h)
		return err
	}
	if err := from("10.0.0.1", 1000); err != nil {
		t.Fatal(err)
	}
	if err := from("::ffff:10.0.0.1", 2000); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("the same IP from another port: %v, want refused", err)
	}
	if err := from("10.0.0.2", 1000); err != nil {
		t.Errorf("another IP: %v, want admitted", err)
	}
}

// TestRateLimitScopeErrorReturnedAndNotStored: a limit keyed by the
// idempotency scope returns the scope's error as is when the scope cannot
// name the caller, and the handler does not run.
func TestRateLimitScopeErrorReturnedAndNotStored(t *testing.T) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	scope := func(ctx context.Context) (string, error) {
		if v := metadata.ValueFromIncomingContext(ctx, "x-user"); len(v) > 0 {
			return v[0], nil
		}
		return "", status.Error(codes.Unauthenticated, "who are you")
	}
	l := Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{{Name: "s", Rate: 1, Burst: 1, Key: serviceconfig.KeyIdempotencyScope}}}}
	srv := newRateServer(t, l, WithIdempotency(Idempotency{Store: store, Scope: scope}))
	icpt := srv.UnaryServerInterceptor()
	var runs int
	h := func(context.Context, any) (any, error) { runs++; return nil, nil }
	_, err = icpt(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: echoMethod}, h)
	if status.Code(err) != codes.Unauthenticated || runs != 0 {
		t.Errorf("no user: %v, %d runs; want UNAUTHENTICATED, none", err, runs)
	}
}

// TestRateLimitSheddableRefusedBeforeCriticalTakesTheLastTokens: a burst's
// reserve is kept for the more critical calls: SHEDDABLE calls (as sent in
// metadata) are refused while tokens are left, which CRITICAL calls then
// take, down to the last.
func TestRateLimitSheddableRefusedBeforeCriticalTakesTheLastTokens(t *testing.T) {
	l := Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{{Name: "r", Rate: 1, Per: time.Hour, Burst: 5, Key: serviceconfig.KeyShared}}}}
	srv := newRateServer(t, l)
	icpt := srv.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: echoMethod}
	h := func(context.Context, any) (any, error) { return nil, nil }
	admitted := func(ctx context.Context) (n int) {
		for range 10 {
			if _, err := icpt(ctx, nil, info, h); err == nil {
				n++
			}
		}
		return n
	}
	sheddable := admitted(metadata.NewIncomingContext(context.Background(), metadata.Pairs(wire.CriticalityKey, "SHEDDABLE")))
	critical := admitted(context.Background())
	// Sheddable leaves half the burst above one token: (5 − 1) / 2 = 2.
	if sheddable != 3 || critical != 2 {
		t.Errorf("admitted: SHEDDABLE %d, then CRITICAL %d; want 3, then the 2 kept for it", sheddable, critical)
	}
}

// TestRateLimitRefusalReachesOnRefusal: a call the rate limits refuse is
// reported to WithOnRefusal once, as RefusalRateLimit naming every
// refusing limit (the most specific first), the tenant, the key and the
// wait the caller was told; an admitted call, and a limit that admitted,
// are not reported; a refused stream is reported the same way.
func TestRateLimitRefusalReachesOnRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := rateLimits(serviceconfig.RateLimit{Name: "per-tenant", Rate: 10, Burst: 1, Key: serviceconfig.KeyTenant},
			serviceconfig.RateLimit{Name: "roomy", Rate: 1000, Burst: 100, Key: serviceconfig.KeyShared})
		l.Config.MethodConfig = []serviceconfig.ServerMethodConfig{{Name: []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService", Method: "Echo"}},
			RateLimits: []serviceconfig.RateLimit{{Name: "echo", Rate: 10, Burst: 1, Key: serviceconfig.KeyShared}}}}
		rs := &refusals{seen: make(chan struct{}, 1)}
		srv := newRateServer(t, l, WithOnRefusal(rs.hook))
		client := echov1.NewEchoServiceClient(serveEcho(t, &countEcho{}, srv))
		if _, err := client.Echo(tenantCtx("a"), &echov1.EchoRequest{}); err != nil {
			t.Fatal(err)
		}
		if got := rs.all(); len(got) != 0 {
			t.Fatalf("admitted call reported: %+v", got)
		}
		_, err := client.Echo(tenantCtx("a"), &echov1.EchoRequest{})
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("second call: %v, want RESOURCE_EXHAUSTED", err)
		}
		got := rs.all()
		if len(got) != 1 {
			t.Fatalf("hook saw %d refusals, want 1: %+v", len(got), got)
		}
		r := got[0]
		if r.Reason != RefusalRateLimit || r.Reason.String() != "rate_limit" || r.FullMethod != echoMethod || r.Limit != "echo" ||
			strings.Join(r.RateLimits, ",") != "echo,per-tenant" || r.Key != "" || r.Tenant != "a" || r.Wait != 100*time.Millisecond ||
			status.Code(r.Err) != codes.ResourceExhausted || r.Criticality != wire.Critical {
			t.Errorf("refusal: %+v", r)
		}
		st, err := client.ServerStream(tenantCtx("b"), &echov1.ServerStreamRequest{})
		if err == nil {
			for err == nil {
				_, err = st.Recv()
			}
		}
		if !errors.Is(err, io.EOF) {
			t.Fatalf("tenant b's first stream: %v", err)
		}
		st, _ = client.ServerStream(tenantCtx("b"), &echov1.ServerStreamRequest{})
		for err = nil; err == nil; {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("tenant b's second stream: %v", err)
		}
		got = rs.all()
		if len(got) != 2 || got[1].Reason != RefusalRateLimit || got[1].Tenant != "b" || got[1].Key != "b" || got[1].Limit != "per-tenant" {
			t.Errorf("stream refusal: %+v", got[len(got)-1])
		}
	})
}

// TestRateLimitRefusalNamesThePeerAsAnAddress: a limit keyed by peer
// reports the caller's IP address as text, not its 16-byte key.
func TestRateLimitRefusalNamesThePeerAsAnAddress(t *testing.T) {
	rs := &refusals{seen: make(chan struct{}, 1)}
	srv := newRateServer(t, Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{
		{Name: "per-peer", Rate: 1, Per: time.Hour, Burst: 1, Key: serviceconfig.KeyPeer}}}}, WithOnRefusal(rs.hook))
	icpt := srv.UnaryServerInterceptor()
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 5555}})
	h := func(context.Context, any) (any, error) { return nil, nil }
	info := &grpc.UnaryServerInfo{FullMethod: echoMethod}
	for range 2 {
		_, _ = icpt(ctx, nil, info, h)
	}
	if got := rs.all(); len(got) != 1 || got[0].Key != "192.0.2.7" || got[0].Limit != "per-peer" || got[0].Tenant != "" {
		t.Errorf("refusals: %+v, want one naming 192.0.2.7", got)
	}
}

// TestRateLimitStatusesListEveryLimit: RateLimitStatuses lists each limit
// in document order with its config and the keys it remembers; a Server
// without rate limits has none.
func TestRateLimitStatusesListEveryLimit(t *testing.T) {
	l := rateLimits(serviceconfig.RateLimit{Name: "per-tenant", Rate: 5, Burst: 2, Key: serviceconfig.KeyTenant})
	l.Config.MethodConfig = []serviceconfig.ServerMethodConfig{{Name: []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService"}},
		RateLimits: []serviceconfig.RateLimit{{Name: "echo", Rate: 1, Per: time.Minute, Burst: 3, Key: serviceconfig.KeyShared}}}}
	srv := newRateServer(t, l)
	icpt := srv.UnaryServerInterceptor()
	h := func(context.Context, any) (any, error) { return nil, nil }
	for _, tenant := range []string{"a", "b", "a"} {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(rateTenantKey, tenant))
		_, _ = icpt(ctx, nil, &grpc.UnaryServerInfo{FullMethod: echoMethod}, h)
	}
	got := srv.RateLimitStatuses()
	want := []RateLimitStatus{
		{Name: "per-tenant", Path: "rateLimits[0]", Key: serviceconfig.KeyTenant, Rate: 5, Per: time.Second, Burst: 2, Keys: 2},
		{Name: "echo", Path: "methodConfig[0].rateLimits[0]", Key: serviceconfig.KeyShared, Rate: 1, Per: time.Minute, Burst: 3},
	}
	if len(got) != len(want) {
		t.Fatalf("RateLimitStatuses() = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	if st := newRateServer(t, Limits{}).RateLimitStatuses(); st != nil {
		t.Errorf("without rate limits: %+v, want nil", st)
	}
}
