package interceptor

import (
	"errors"

	"testing"
	"testing/synctest"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
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
// resolver delivers, then changes, drives the client when its resolver is
// wrapped, by grpc-go's rule for which config is in force, and compares it
// step by step with grpc's own retry on a connection of its own, given the
// client's config as its default (grpc.WithDefaultServiceConfig). Before
// WrapResolver (the connection as DialOptions makes it, second half of the
// test): the resolver's maxAttempts 3 gave 1 attempt per failing call,
// since grpc's retry is off and the client never saw the config; after, 3.
//
// The steps with no service config are what grpc's DNS resolver delivers
// when its TXT lookup fails or finds nothing (lookupTXT returns nil in
// grpc's internal/resolver/dns/dns_resolver.go, and lookup sends the
// addresses alone): grpc keeps the resolver's last config
// (ClientConn.updateResolverStateAndUnlock → maybeApplyDefaultServiceConfig
// re-applies cc.sc), and so does the client. It used to go back to its own
// config: 4 attempts where grpc makes 3.
func TestResolverConfigReachesTheClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(4), echoService))
		e := newResolverEnv(t, c, true)
		own := newGRPCRetryEnv(t, resolverConfig("4"))
		steps := []struct {
			what, doc string
			want      int
			grpc      int // grpc's own retry, when it differs
		}{
			{what: "before any config: the client's own (maxAttempts 4)", want: 4},
			{what: "the resolver's maxAttempts 3", doc: resolverConfig("3"), want: 3},
			{what: "addresses alone (DNS: the TXT lookup failed): the resolver's last stays", want: 3},
			{what: "a config grpc refuses (ServiceConfig.Err): the resolver's last stays", doc: "{not json", want: 3},
			{what: "the resolver changes it to 2", doc: resolverConfig("2"), want: 2},
			{what: "the same config again", doc: resolverConfig("2"), want: 2},
			{what: "a config grpc takes but Parse refuses: the previous stays (grpc: it applies, with no retry policy)",
				doc: `{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService"}], "bulkhead": {"maxConcurent": 1}}]}`, want: 2, grpc: 1},
			{what: "the resolver's maxAttempts 3 again", doc: resolverConfig("3"), want: 3},
			{what: "a config with nothing for the client (load balancing only): it replaces the client's config",
				doc: `{"loadBalancingConfig": [{"round_robin": {}}]}`, want: 1},
			{what: "addresses alone again: the load-balancing config stays", want: 1},
			{what: "the resolver's maxAttempts 3 once more", doc: resolverConfig("3"), want: 3},
		}
		for _, s := range steps {
			e.deliver(s.doc)
			own.deliver(s.doc)
			if got := e.attempts(); got != s.want {
				t.Errorf("%s: %d attempts, want %d", s.what, got, s.want)
			}
			want := s.want
			if s.grpc != 0 {
				want = s.grpc
			}
			if got := own.attempts(); got != want {
				t.Errorf("%s: grpc's own retry made %d attempts, want %d", s.what, got, want)
			}
		}
	})
}

// newGRPCRetryEnv is a connection through a manual resolver with grpc's own
// retry, and def as its default service config: no Client.
func newGRPCRetryEnv(t *testing.T, def string) *resolverEnv {
	t.Helper()
	e := &resolverEnv{t: t, r: manual.NewBuilderWithScheme("grpcown"), srv: &testserver.Server{},
		addr: []resolver.Address{{Addr: "bufnet"}}}
	e.r.InitialState(resolver.State{Addresses: e.addr})
	dial, stop := testserver.Listen(func(gs *grpc.Server) { echov1.RegisterEchoServiceServer(gs, e.srv) })
	cc, err := grpc.NewClient("grpcown:///echo", append(dial, grpc.WithResolvers(e.r), grpc.WithDefaultServiceConfig(def))...)
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

// TestWrapResolverKeepsAnUpdateUntilTheResolverChanges pins the rule
// between the resolver's configs and UpdateServiceConfig: a config the
// resolver delivers again unchanged (a periodic re-resolution) is not
// applied again, so an UpdateServiceConfig made since stays in force
// until the resolver delivers a different config; a resolver error
// (ReportError) changes nothing, as grpc keeps its config on one.
func TestWrapResolverKeepsAnUpdateUntilTheResolverChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(4), echoService))
		e := newResolverEnv(t, c, true)
		steps := []struct {
			what string
			do   func()
			want int
		}{
			{"the resolver's maxAttempts 3", func() { e.deliver(resolverConfig("3")) }, 3},
			{"UpdateServiceConfig's maxAttempts 2", func() {
				if err := c.UpdateServiceConfig(&serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
					Name: []serviceconfig.Name{{Service: echoService}}, RetryPolicy: fastPolicy(2)}}}); err != nil {
					t.Fatal(err)
				}
			}, 2},
			{"the resolver's 3 again, unchanged: the update stays", func() { e.deliver(resolverConfig("3")) }, 2},
			{"addresses alone: the update stays", func() { e.deliver("") }, 2},
			{"a resolver error: the update stays", func() { e.r.CC().ReportError(errors.New("lookup failed")) }, 2},
			{"the resolver changes its config to 5", func() { e.deliver(resolverConfig("5")) }, 5},
			{"a resolver error: the resolver's last stays", func() { e.r.CC().ReportError(errors.New("lookup failed")) }, 5},
		}
		for _, s := range steps {
			s.do()
			if got := e.attempts(); got != s.want {
				t.Errorf("%s: %d attempts, want %d", s.what, got, s.want)
			}
		}
	})
}
