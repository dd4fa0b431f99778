package interceptor

import (
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// dialWrapped dials a connection to srv whose resolver is r wrapped by c,
// with extra dial options; the connection is closed after the test.
func dialWrapped(t *testing.T, c *Client, r *manual.Resolver, srv *testserver.Server, extra ...grpc.DialOption) (*resolverEnv, *grpc.ClientConn) {
	t.Helper()
	addr := []resolver.Address{{Addr: "bufnet"}}
	r.InitialState(resolver.State{Addresses: addr})
	dial, stop := testserver.Listen(func(gs *grpc.Server) { echov1.RegisterEchoServiceServer(gs, srv) })
	opts := append(append(append(dial, grpc.WithResolvers(c.WrapResolver(r))), extra...), c.DialOptions()...)
	cc, err := grpc.NewClient(r.Scheme()+":///echo", opts...)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		stop()
	})
	return &resolverEnv{t: t, r: r, srv: srv, stub: echov1.NewEchoServiceClient(cc), addr: addr}, cc
}

// TestWrapResolverIgnoresAClosedResolversUpdates pins that a resolver still
// delivering after its connection closed (a control plane's watch racing
// Close; grpc ignores such updates) does not change the client's config,
// which other connections use. Before: the closed connection's maxAttempts
// 2 became the client's (2 attempts on the other connection); after, 4.
func TestWrapResolverIgnoresAClosedResolversUpdates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(4), echoService))
		other := newResolverEnv(t, c, false)
		closing, cc := dialWrapped(t, c, manual.NewBuilderWithScheme("closing"), other.srv)
		cc.Connect()
		synctest.Wait()
		if err := cc.Close(); err != nil {
			t.Fatal(err)
		}
		closing.deliver(resolverConfig("2"))
		if got := other.attempts(); got != 4 {
			t.Errorf("after a closed connection's resolver delivered maxAttempts 2: %d attempts, want the client's own 4", got)
		}
	})
}

// TestWrapResolverConfigCarriesOverIdle pins that the resolver's config in
// force outlives the resolver: grpc closes a channel's resolver when the
// channel goes idle and builds another when a call wakes it, keeping the
// config in force (enterIdleMode leaves cc.sc as it is). The new resolver's
// update with no config (a DNS TXT lookup that fails) keeps it, as grpc
// does; its next config replaces it.
func TestWrapResolverConfigCarriesOverIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(4), echoService))
		e, cc := dialWrapped(t, c, manual.NewBuilderWithScheme("idle"), &testserver.Server{}, grpc.WithIdleTimeout(time.Minute))
		e.attempts() // builds the resolver
		e.deliver(resolverConfig("2"))
		if got := e.attempts(); got != 2 {
			t.Fatalf("the resolver's maxAttempts 2: %d attempts", got)
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if s := cc.GetState().String(); s != "IDLE" {
			t.Fatalf("after two idle minutes the channel is %s, want IDLE", s)
		}
		if got := e.attempts(); got != 2 { // wakes the channel: a new resolver, the same config
			t.Errorf("after idle, the same config: %d attempts, want 2", got)
		}
		e.deliver("")
		if got := e.attempts(); got != 2 {
			t.Errorf("after idle, an update with no config: %d attempts, want the resolver's last, 2", got)
		}
		e.deliver(resolverConfig("3"))
		if got := e.attempts(); got != 3 {
			t.Errorf("after idle, the resolver's maxAttempts 3: %d attempts, want 3", got)
		}
	})
}

// TestWrapResolverHonoursDisableServiceConfig pins that with
// grpc.WithDisableServiceConfig, which makes grpc ignore the resolver's
// configs, the client ignores them too. Before: the resolver's maxAttempts
// 2 drove the client (2 attempts); after, the client's own 4.
func TestWrapResolverHonoursDisableServiceConfig(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(4), echoService))
		e, _ := dialWrapped(t, c, manual.NewBuilderWithScheme("disabled"), &testserver.Server{}, grpc.WithDisableServiceConfig())
		e.attempts()
		e.deliver(resolverConfig("2"))
		if got := e.attempts(); got != 4 {
			t.Errorf("WithDisableServiceConfig, the resolver's maxAttempts 2: %d attempts, want the client's own 4", got)
		}
	})
}

// TestWrapResolverConcurrentDeliveries runs a resolver delivering configs
// and withdrawing them from many goroutines, beside calls and the user's
// own UpdateServiceConfig, under the race detector; nothing is held after.
func TestWrapResolverConcurrentDeliveries(t *testing.T) {
	c := newTestClient(t, WithRetryPolicy(fastPolicy(4), echoService))
	e := newResolverEnv(t, c, true)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				switch (g + i) % 4 {
				case 0:
					e.deliver(resolverConfig(strconv.Itoa(2 + i%3)))
				case 1:
					e.deliver("")
				case 2:
					if err := c.UpdateServiceConfig(&serviceconfig.Config{}); err != nil {
						t.Error(err)
					}
				case 3:
					_, _ = e.stub.Echo(t.Context(), &echov1.EchoRequest{})
				}
			}
		})
	}
	wg.Wait()
}
