package server

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// refusals records what a WithOnRefusal hook saw.
type refusals struct {
	mu   sync.Mutex
	got  []Refusal
	seen chan struct{} // receives, without blocking, after each refusal
}

func (r *refusals) hook(_ context.Context, x Refusal) {
	r.mu.Lock()
	r.got = append(r.got, x)
	r.mu.Unlock()
	select {
	case r.seen <- struct{}{}:
	default:
	}
}

func (r *refusals) all() []Refusal {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Refusal(nil), r.got...)
}

// holdingEcho holds each Echo until release closes, telling entered when
// it starts; other messages than "hold" answer at once.
type holdingEcho struct {
	echov1.UnimplementedEchoServiceServer
	entered chan struct{}
	release chan struct{}
}

func newHoldingEcho() *holdingEcho {
	return &holdingEcho{entered: make(chan struct{}, 64), release: make(chan struct{})}
}

func (e *holdingEcho) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	if req.GetMessage() == "hold" {
		e.entered <- struct{}{}
		select {
		case <-e.release:
		case <-ctx.Done():
		}
	}
	return &echov1.EchoResponse{Message: req.GetMessage()}, nil
}

// startRefusing serves e behind a Server of opts with a WithOnRefusal hook,
// and returns the connection and what the hook saw.
func startRefusing(t *testing.T, e echov1.EchoServiceServer, opts ...Option) (*grpc.ClientConn, *refusals) {
	t.Helper()
	rs := &refusals{seen: make(chan struct{}, 1)}
	s, err := New(append(opts, WithOnRefusal(rs.hook))...)
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	t.Cleanup(func() { s.Close() })
	cc := testserver.StartWith(t, e, []grpc.ServerOption{grpc.ChainUnaryInterceptor(s.UnaryServerInterceptor())})
	return cc, rs
}

// holdN starts n Echo calls that the handler holds (ctx carrying their
// metadata), waits until every one is in the handler, and returns a wait
// for their ends.
func holdN(t *testing.T, ctx context.Context, cc *grpc.ClientConn, e *holdingEcho, n int) func() {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { _, _ = echov1.NewEchoServiceClient(cc).Echo(ctx, &echov1.EchoRequest{Message: "hold"}) })
	}
	for range n {
		<-e.entered
	}
	return wg.Wait
}

// TestOnRefusalReportsTheLimitsShed: a call shed over a full limit reaches
// the hook with the limit's name, the reason, its criticality and its error;
// the calls admitted do not.
func TestOnRefusalReportsTheLimitsShed(t *testing.T) {
	e := newHoldingEcho()
	one := serviceconfig.ConcurrencyLimit{InitialLimit: 1, MinLimit: 1, MaxLimit: 1}
	cc, rs := startRefusing(t, e, WithLimits(Limits{Config: serviceconfig.ServerConfig{
		MethodConfig: []serviceconfig.ServerMethodConfig{methodLimitOf(t, "/resilience.echo.v1.EchoService/Echo", one)},
	}, Criticality: CapCriticality(wire.CriticalPlus)}))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	wait := holdN(t, ctx, cc, e, 1)
	crit := metadata.AppendToOutgoingContext(ctx, wire.CriticalityKey, "CRITICAL_PLUS")
	_, err := echov1.NewEchoServiceClient(cc).Echo(crit, &echov1.EchoRequest{Message: "shed"})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Echo over the limit = %v, want RESOURCE_EXHAUSTED", err)
	}
	close(e.release)
	wait()
	got := rs.all()
	if len(got) != 1 {
		t.Fatalf("hook saw %d refusals, want 1: %+v", len(got), got)
	}
	r := got[0]
	if r.FullMethod != "/resilience.echo.v1.EchoService/Echo" || r.Reason != RefusalLimit || r.Reason.String() != "limit" ||
		r.Limit != "/resilience.echo.v1.EchoService/Echo" || r.Criticality != wire.CriticalPlus ||
		r.Tenant != "" || r.Tenants != 0 || r.OverShare || status.Code(r.Err) != codes.ResourceExhausted {
		t.Errorf("refusal = %+v, want the Echo limit's shed of a CRITICAL_PLUS call, with its error", r)
	}
}

// TestOnRefusalNamesTheTenantOverItsShare: under tenant fairness, a
// shed call is reported with its tenant, the tenants sharing the limit and
// whether it was over its share, as the engine judged it (limit 10,
// CRITICAL's share 9, fairness over the tenants holding calls). quiet
// holds 1 call and noisy 8: noisy's fair share is 8, so its next call is
// shed at the limit, within its share. Once other holds 2, the heavy
// tenants share 8 (max-min): noisy's fair share is 4, and its 8 in flight
// are twice that, so its next call is shed over its share.
func TestOnRefusalNamesTheTenantOverItsShare(t *testing.T) {
	e := newHoldingEcho()
	ten := serviceconfig.ConcurrencyLimit{InitialLimit: 10, MinLimit: 10, MaxLimit: 10}
	cc, rs := startRefusing(t, e, WithLimits(fairLimitsOf(ten, serviceconfig.TenantFairness{MetadataKey: tenantKey, IdleTimeout: time.Hour}, nil)))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	as := func(tenant string) context.Context { return metadata.AppendToOutgoingContext(ctx, tenantKey, tenant) }
	ec := echov1.NewEchoServiceClient(cc)
	waits := []func(){holdN(t, as("quiet"), cc, e, 1), holdN(t, as("noisy"), cc, e, 8)}
	defer func() {
		close(e.release)
		for _, w := range waits {
			w()
		}
	}()
	if _, err := ec.Echo(as("noisy"), &echov1.EchoRequest{Message: "hello"}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("noisy's 9th call with quiet's 1 in flight: %v, want RESOURCE_EXHAUSTED", err)
	}
	waits = append(waits, holdN(t, as("other"), cc, e, 2))
	if _, err := ec.Echo(as("noisy"), &echov1.EchoRequest{Message: "hello"}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("noisy's 9th call with quiet's 1 and other's 2 in flight: %v, want RESOURCE_EXHAUSTED", err)
	}
	got := rs.all()
	if len(got) != 2 {
		t.Fatalf("hook saw %d refusals, want 2: %+v", len(got), got)
	}
	if r := got[0]; r.Reason != RefusalLimit || r.Tenant != "noisy" || r.Tenants != 2 || r.OverShare {
		t.Errorf("first refusal = %+v, want the limit's shed of tenant noisy, within its share, among 2 tenants", r)
	}
	if r := got[1]; r.Reason != RefusalLimit || r.Tenant != "noisy" || r.Tenants != 3 || !r.OverShare {
		t.Errorf("second refusal = %+v, want the limit's shed of tenant noisy, over its share, among 3 tenants", r)
	}
}

// TestOnRefusalReportsTheStore: a store that is down is reported as
// store_unavailable when the server fails closed, and as store_failed_open
// with the store's error when it fails open (the call ran).
func TestOnRefusalReportsTheStore(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		e := newHoldingEcho()
		cc, rs := startRefusing(t, e, WithIdempotency(Idempotency{Store: idemDownStore{}, Scope: SharedScope, FailOpen: failOpen}))
		ctx := metadata.AppendToOutgoingContext(t.Context(), "idempotency-key", "k1")
		_, err := echov1.NewEchoServiceClient(cc).Echo(ctx, &echov1.EchoRequest{Message: "hello"})
		got := rs.all()
		if len(got) != 1 {
			t.Fatalf("failOpen %v: hook saw %d refusals, want 1: %+v", failOpen, len(got), got)
		}
		r := got[0]
		switch {
		case !failOpen && (status.Code(err) != codes.Unavailable || r.Reason != RefusalStoreUnavailable || !errors.Is(r.Err, ErrIdempotencyStoreUnavailable)):
			t.Errorf("fail closed: call %v, refusal %+v; want UNAVAILABLE, store_unavailable", err, r)
		case failOpen && (err != nil || r.Reason != RefusalStoreFailedOpen || !errors.Is(r.Err, errIdemDown)):
			t.Errorf("fail open: call %v, refusal %+v; want OK, store_failed_open with the store's error", err, r)
		}
	}
}

// TestOnRefusalReportsTheHeadroom: a call arriving with less than the
// headroom and floor left is reported as headroom.
func TestOnRefusalReportsTheHeadroom(t *testing.T) {
	e := newHoldingEcho()
	cc, rs := startRefusing(t, e, WithHeadroom(time.Hour, 0))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err := echov1.NewEchoServiceClient(cc).Echo(ctx, &echov1.EchoRequest{Message: "hello"})
	got := rs.all()
	if status.Code(err) != codes.DeadlineExceeded || len(got) != 1 || got[0].Reason != RefusalHeadroom {
		t.Errorf("call %v, refusals %+v; want DEADLINE_EXCEEDED and one headroom refusal", err, got)
	}
}

// TestOnRefusalReportsShutdown: once Shutdown begins, the call taken out
// of the limit's queue and a call that comes after are each reported as
// shutting_down with their UNAVAILABLE; the call already running is not
// refused, and a keyed call refused the same way claims nothing.
func TestOnRefusalReportsShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newHoldingEcho()
		rs := &refusals{seen: make(chan struct{}, 1)}
		lim := WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{InitialLimit: 1, MinLimit: 1, MaxLimit: 1,
			MaxQueue: 1, MaxQueueWait: time.Hour}))
		store, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		s, cc := idemStartServer(t, e, Idempotency{Store: store}, lim, WithOnRefusal(rs.hook))
		held := make(chan idemCall, 1)
		go func() { held <- idemDo(context.Background(), cc, "", "hold") }()
		synctest.Wait()
		queued := make(chan idemCall, 1)
		go func() { queued <- idemDo(context.Background(), cc, "", "queued") }()
		synctest.Wait()
		if q := s.LimitStatuses()[0].Queued; q != 1 {
			t.Fatalf("%d queued, want 1", q)
		}
		if err := s.Shutdown(context.Background()); err != nil {
			t.Fatalf("Shutdown() = %v", err)
		}
		wantCode(t, "the queued call", (<-queued).err, codes.Unavailable, "")
		wantCode(t, "a call after Shutdown", idemDo(context.Background(), cc, "", "late").err, codes.Unavailable, "")
		wantCode(t, "a keyed call after Shutdown", idemDo(context.Background(), cc, "k", "late").err, codes.Unavailable, "")
		close(e.release)
		if r := <-held; r.err != nil {
			t.Errorf("the call running at Shutdown: %v, want it answered", r.err)
		}
		got := rs.all()
		if len(got) != 3 {
			t.Fatalf("hook saw %d refusals, want 3: %+v", len(got), got)
		}
		for _, r := range got {
			if r.Reason != RefusalShuttingDown || r.Reason.String() != "shutting_down" ||
				r.FullMethod != "/resilience.echo.v1.EchoService/Echo" || status.Code(r.Err) != codes.Unavailable {
				t.Errorf("refusal = %+v, want shutting_down of Echo with UNAVAILABLE", r)
			}
		}
	})
}

// TestRefusalReasonStrings pins the tokens, which the admin view and logs
// show.
func TestRefusalReasonStrings(t *testing.T) {
	want := map[RefusalReason]string{
		RefusalLimit: "limit", RefusalQueueTimeout: "queue_timeout", RefusalDeadline: "deadline", RefusalCPU: "cpu",
		RefusalHeadroom: "headroom", RefusalStoreUnavailable: "store_unavailable", RefusalStoreFull: "store_full",
		RefusalStoreFailedOpen: "store_failed_open", RefusalShuttingDown: "shutting_down", 0: "unknown", 200: "unknown",
	}
	for r, w := range want {
		if got := r.String(); got != w {
			t.Errorf("RefusalReason(%d).String() = %q, want %q", r, got, w)
		}
	}
}

// TestTenantStatusesListTheBusiestTenants: under tenant fairness, a limit's
// busiest tenants are listed with their calls in flight, the most first;
// an unknown limit's list is nil, and the tenants are gone once their
// calls end.
func TestTenantStatusesListTheBusiestTenants(t *testing.T) {
	e := newHoldingEcho()
	ten := serviceconfig.ConcurrencyLimit{InitialLimit: 10, MinLimit: 10, MaxLimit: 10}
	s, err := New(WithLimits(fairLimitsOf(ten, serviceconfig.TenantFairness{MetadataKey: tenantKey, IdleTimeout: time.Hour}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	cc := testserver.StartWith(t, e, []grpc.ServerOption{grpc.ChainUnaryInterceptor(s.UnaryServerInterceptor())})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	as := func(tenant string) context.Context { return metadata.AppendToOutgoingContext(ctx, tenantKey, tenant) }
	waits := []func(){holdN(t, as("quiet"), cc, e, 1), holdN(t, as("noisy"), cc, e, 3)}
	got := s.TenantStatuses("", 10)
	if len(got) != 2 || got[0].Tenant != "noisy" || got[0].InFlight != 3 || got[1].Tenant != "quiet" || got[1].InFlight != 1 {
		t.Errorf("TenantStatuses(\"\", 10) = %+v, want noisy with 3 in flight, then quiet with 1", got)
	}
	if top := s.TenantStatuses("", 1); len(top) != 1 || top[0].Tenant != "noisy" {
		t.Errorf("TenantStatuses(\"\", 1) = %+v, want noisy alone", top)
	}
	if none := s.TenantStatuses("no.Such/Limit", 10); none != nil {
		t.Errorf("TenantStatuses of an unknown limit = %+v, want nil", none)
	}
	close(e.release)
	for _, w := range waits {
		w()
	}
	if after := s.TenantStatuses("", 10); len(after) != 0 {
		t.Errorf("after the calls: TenantStatuses = %+v, want none busy", after)
	}
}

// TestOnRefusalReportsStreams: the stream interceptor reports its
// refusals as the unary one does: a stream arriving with less than the
// headroom left, and a stream arriving once Shutdown began.
func TestOnRefusalReportsStreams(t *testing.T) {
	rs := &refusals{seen: make(chan struct{}, 1)}
	s, err := New(WithHeadroom(time.Hour, 0), WithOnRefusal(rs.hook))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	cc := testserver.StartWith(t, newHoldingEcho(), []grpc.ServerOption{grpc.ChainStreamInterceptor(s.StreamServerInterceptor())})
	ec := echov1.NewEchoServiceClient(cc)
	stream := func(ctx context.Context) error {
		st, err := ec.ServerStream(ctx, &echov1.ServerStreamRequest{})
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	const method = "/resilience.echo.v1.EchoService/ServerStream"
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := stream(ctx); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a stream with less than the headroom left: %v, want DEADLINE_EXCEEDED", err)
	}
	if err := s.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := stream(t.Context()); status.Code(err) != codes.Unavailable {
		t.Errorf("a stream after Shutdown: %v, want UNAVAILABLE", err)
	}
	got := rs.all()
	if len(got) != 2 || got[0].Reason != RefusalHeadroom || got[0].FullMethod != method ||
		got[1].Reason != RefusalShuttingDown || got[1].FullMethod != method {
		t.Errorf("refusals %+v, want the stream's headroom, then its shutting_down", got)
	}
}
