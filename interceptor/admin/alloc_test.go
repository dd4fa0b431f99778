package admin

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

func okInvoker(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
	return nil
}

// TestViewAllocatesNothingOnTheSuccessPath pins what the view costs a call
// that succeeds: nothing. A Client with every guard (retry, breaker,
// bulkhead, budget, A6 throttling) allocates exactly as much with the
// source's hooks as without them, 0 per call; a Server with a limit and
// tenant fairness allocates as much with the source's WithOnRefusal as
// without.
func TestViewAllocatesNothingOnTheSuccessPath(t *testing.T) {
	if raceEnabled {
		t.Skip("exact allocation counts: sync.Pool drops items under the race detector")
	}
	v := newView(t)
	client := func(hooks bool) float64 {
		opts := []interceptor.ClientOption{
			methodConfig(serviceconfig.MethodConfig{RetryPolicy: retryUnavailable(4),
				CircuitBreaker: &serviceconfig.CircuitBreaker{}, Bulkhead: &serviceconfig.Bulkhead{MaxConcurrent: 1 << 20}}),
			interceptor.WithServiceConfig(&serviceconfig.Config{RetryThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 0.1}}),
		}
		if hooks {
			src, err := v.Client("allocs")
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			opts = append(opts, src.Options()...)
		}
		c, err := interceptor.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ic := c.UnaryClientInterceptor()
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
		static := []grpc.CallOption{grpc.StaticMethod()}
		_ = ic(ctx, echoMethod, req, reply, nil, okInvoker, static...)
		return testing.AllocsPerRun(1000, func() {
			if err := ic(ctx, echoMethod, req, reply, nil, okInvoker, static...); err != nil {
				t.Fatal(err)
			}
		})
	}
	without, with := client(false), client(true)
	if with != without || with != 0 {
		t.Errorf("client success path: %v allocs per call with the view's hooks, %v without; want 0 and 0", with, without)
	}

	srvAllocs := func(hooks bool) float64 {
		var opts []server.Option
		if hooks {
			src, err := v.Server("allocs")
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			opts = src.Options()
		}
		lim := serviceconfig.ConcurrencyLimit{}
		srv, err := server.New(append(opts, server.WithLimits(server.Limits{Config: serviceconfig.ServerConfig{
			ConcurrencyLimit: &lim, TenantFairness: &serviceconfig.TenantFairness{MetadataKey: "x-tenant"}}}))...)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		icpt := srv.UnaryServerInterceptor()
		info := &grpc.UnaryServerInfo{FullMethod: echoMethod}
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-tenant", "t1"))
		h := func(context.Context, any) (any, error) { return nil, nil }
		_, _ = icpt(ctx, nil, info, h)
		return testing.AllocsPerRun(1000, func() { _, _ = icpt(ctx, nil, info, h) })
	}
	without, with = srvAllocs(false), srvAllocs(true)
	if with != without {
		t.Errorf("server success path: %v allocs per call with the view's hook, %v without; want the same", with, without)
	}
	t.Logf("server success path: %v allocs per call either way", with)
}

// TestRefusalInAnEpisodeAllocatesNothing pins what a refused call pays the
// view while its part refuses steadily: once its episode's event exists,
// the next refusals only count, with no allocation, for the client's full
// bulkhead and spent budget and the server's limit (a tenant over its
// share) and store.
func TestRefusalInAnEpisodeAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("exact allocation counts: sync.Pool drops items under the race detector")
	}
	clk := newFakeClock() // every refusal within the episode's gap
	v := newView(t, WithNow(clk.now))
	cs, _ := v.Client("c")
	ss, _ := v.Server("s")
	ctx := context.Background()
	// The errors are built once, as the client and the server build their
	// rejections once.
	down := status.Error(codes.Unavailable, "backend down")
	full := status.Error(codes.ResourceExhausted, "bulkhead full")
	shed := status.Error(codes.ResourceExhausted, "over the limit")
	tests := []struct {
		name   string
		refuse func()
	}{
		{"client bulkhead", func() {
			cs.OnStop(ctx, interceptor.StopEvent{FullMethod: echoMethod, Attempts: 1, Reason: interceptor.StopBulkheadFull, Err: full})
		}},
		{"client budget", func() {
			cs.OnStop(ctx, interceptor.StopEvent{FullMethod: echoMethod, Attempts: 2, Reason: interceptor.StopBudget, Err: down})
		}},
		{"server limit", func() {
			ss.OnRefusal(ctx, server.Refusal{FullMethod: echoMethod, Reason: server.RefusalLimit, Criticality: wire.Sheddable,
				Tenant: "noisy", Tenants: 2, OverShare: true, Err: shed})
		}},
		{"server store", func() {
			ss.OnRefusal(ctx, server.Refusal{FullMethod: echoMethod, Reason: server.RefusalStoreUnavailable, Err: down})
		}},
	}
	for _, tt := range tests {
		tt.refuse() // the episode's event
		if n := testing.AllocsPerRun(1000, tt.refuse); n != 0 {
			t.Errorf("%s: %v allocations per refusal in an episode, want 0", tt.name, n)
		}
	}
	all, _ := v.Events(0, 0)
	if len(all) != len(tests) {
		t.Errorf("%d events, want one episode per part: %v", len(all), all)
	}
}

// TestOpenBreakerRefusalAllocatesNothingAndKeepsNothing pins what a call
// refused by an open breaker, or ending another way the view does not
// record (cancelled, committed), costs the view: no event, no failure, no
// allocation, not even a read of its clock, so that callers spinning on
// an open breaker pay nothing more (the opening's event says why).
func TestOpenBreakerRefusalAllocatesNothingAndKeepsNothing(t *testing.T) {
	var reads atomic.Int64
	clk := newFakeClock()
	v := newView(t, WithNow(func() time.Time { reads.Add(1); return clk.now() }))
	cs, _ := v.Client("c")
	ctx := context.Background()
	open := status.Error(codes.Unavailable, "circuit open")
	for _, reason := range []interceptor.StopReason{interceptor.StopCircuitOpen, interceptor.StopCancelled, interceptor.StopCommitted} {
		stop := func() {
			cs.OnStop(ctx, interceptor.StopEvent{FullMethod: echoMethod, Attempts: 1, Reason: reason, Err: open})
		}
		stop()
		if !raceEnabled {
			if n := testing.AllocsPerRun(1000, stop); n != 0 {
				t.Errorf("OnStop(%v): %v allocations per call, want 0", reason, n)
			}
		}
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("the view's clock was read %d times, want none", n)
	}
	if all, _ := v.Events(0, 0); len(all) != 0 {
		t.Errorf("events %v, want none", all)
	}
	if fs := cs.fails.recent(echoMethod); len(fs) != 0 {
		t.Errorf("failures kept %v, want none", fs)
	}
}
