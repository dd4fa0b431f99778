package interceptor

import (
	"testing"
	"testing/synctest"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// resolverConfig is a document the resolver delivers: a retry policy of
// maxAttempts attempts for the echo service.
func resolverConfig(maxAttempts string) string {
	return `{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService"}],
		"retryPolicy": {"maxAttempts": ` + maxAttempts + `, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
		                "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`
}

// resolverEnv is a connection whose resolver is a manual one, through the
// client's WrapResolver when wrap is set.
type resolverEnv struct {
	t    *testing.T
	r    *manual.Resolver
	srv  *testserver.Server
	stub echov1.EchoServiceClient
	addr []resolver.Address
}

func newResolverEnv(t *testing.T, c *Client, wrap bool) *resolverEnv {
	t.Helper()
	e := &resolverEnv{t: t, r: manual.NewBuilderWithScheme("wrapped"), srv: &testserver.Server{},
		addr: []resolver.Address{{Addr: "bufnet"}}}
	e.r.InitialState(resolver.State{Addresses: e.addr})
	dial, stop := testserver.Listen(func(gs *grpc.Server) { echov1.RegisterEchoServiceServer(gs, e.srv) })
	var b resolver.Builder = e.r
	if wrap {
		b = c.WrapResolver(e.r)
	}
	cc, err := grpc.NewClient("wrapped:///echo", append(append(dial, grpc.WithResolvers(b)), c.DialOptions()...)...)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		stop()
	})
	e.stub = echov1.NewEchoServiceClient(cc)
	if _, err := e.stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil { // builds the resolver
		t.Fatal(err)
	}
	return e
}

// deliver makes the resolver deliver doc ("" for no service config).
func (e *resolverEnv) deliver(doc string) {
	s := resolver.State{Addresses: e.addr}
	if doc != "" {
		s.ServiceConfig = e.r.CC().ParseServiceConfig(doc)
	}
	e.r.UpdateState(s)
}

// attempts makes one call to a server failing every attempt with
// UNAVAILABLE and returns how many attempts the server saw.
func (e *resolverEnv) attempts() int {
	before := e.srv.Count("Echo")
	e.srv.SetScript(failFirst(1<<20, codes.Unavailable))
	_, _ = e.stub.Echo(e.t.Context(), &echov1.EchoRequest{})
	e.srv.SetScript(nil)
	return e.srv.Count("Echo") - before
}

// TestResolverConfigReachesTheClient pins that a service config the
// resolver delivers, then changes, then withdraws, drives the client when
// its resolver is wrapped. Before WrapResolver (the connection as
// DialOptions makes it, second half of the test): the resolver's
// maxAttempts 3 gave 1 attempt per failing call, since grpc's retry is off
// and the client never saw the config; after, 3.
func TestResolverConfigReachesTheClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(4), echoService))
		e := newResolverEnv(t, c, true)
		steps := []struct {
			what, doc string
			want      int
		}{
			{"before any config: the client's own (maxAttempts 4)", "", 4},
			{"the resolver's maxAttempts 3", resolverConfig("3"), 3},
			{"the resolver changes it to 2", resolverConfig("2"), 2},
			{"the same config again", resolverConfig("2"), 2},
			{"a config grpc takes but Parse refuses: the previous stays",
				`{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService"}], "bulkhead": {"maxConcurent": 1}}]}`, 2},
			{"a config with nothing for the client (load balancing only): the client's own",
				`{"loadBalancingConfig": [{"round_robin": {}}]}`, 4},
			{"the resolver's maxAttempts 3 again", resolverConfig("3"), 3},
			{"no config at all: the client's own", "", 4},
		}
		for _, s := range steps {
			e.deliver(s.doc)
			if got := e.attempts(); got != s.want {
				t.Errorf("%s: %d attempts, want %d", s.what, got, s.want)
			}
		}
	})
}

// TestResolverConfigIgnoredWithoutWrapResolver pins the behaviour
// WrapResolver changes: without it, the resolver's retry policy reaches
// neither grpc (DialOptions turns its retry off) nor the client.
func TestResolverConfigIgnoredWithoutWrapResolver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t)
		e := newResolverEnv(t, c, false)
		e.deliver(resolverConfig("3"))
		if got := e.attempts(); got != 1 {
			t.Errorf("unwrapped resolver's maxAttempts 3: %d attempts, want 1", got)
		}
	})
}

// TestWrapResolverNilIsDNS pins that WrapResolver(nil) wraps grpc's dns
// resolver, grpc.NewClient's default.
func TestWrapResolverNilIsDNS(t *testing.T) {
	c := newTestClient(t)
	if got := c.WrapResolver(nil).Scheme(); got != "dns" {
		t.Errorf("WrapResolver(nil).Scheme() = %q, want dns", got)
	}
}
