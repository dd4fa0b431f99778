package interceptor

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// A document grpc-go would accept too, with our blocks alongside.
const e2eDocument = `{
  "methodConfig": [
    {
      "name": [{"service": "resilience.echo.v1.EchoService"}],
      "retryPolicy": {
        "maxAttempts": 4,
        "initialBackoff": "0.01s",
        "maxBackoff": "0.1s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["unavailable"],
        "jitter": "none"
      },
      "circuitBreaker": {"consecutiveFailures": 50}
    },
    {
      "name": [{"service": "resilience.echo.v1.EchoService", "method": "Echo"}],
      "timeout": "5s"
    }
  ],
  "retryBudget": {"ratio": 0.5}
}`

func TestClientBuiltFromJSONRetriesOneMethodAndNotAnother(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, err := serviceconfig.Parse([]byte(e2eDocument))
		if err != nil {
			t.Fatal(err)
		}
		srv := &testserver.Server{}
		srv.SetScript(failFirst(100, codes.Unavailable))
		stub, c := newEcho(t, srv, WithServiceConfig(cfg))
		_, lerr := stub.Lookup(t.Context(), &echov1.LookupRequest{})
		_, eerr := stub.Echo(t.Context(), &echov1.EchoRequest{})
		// Lookup takes the service's entry: 4 attempts. Echo has an exact
		// entry without a retry policy (entries do not merge): 1 attempt.
		if got := srv.Count("Lookup"); got != 4 {
			t.Errorf("server saw %d Lookup attempts, want the document's 4", got)
		}
		if got := srv.Count("Echo"); got != 1 {
			t.Errorf("server saw %d Echo attempts, want 1", got)
		}
		var re *RetryError
		if !errors.As(lerr, &re) || re.Reason != StopExhausted {
			t.Errorf("Lookup() error = %#v, want attempts exhausted", lerr)
		}
		if errors.As(eerr, &re) || status.Code(eerr) != codes.Unavailable {
			t.Errorf("Echo() error = %#v, want the plain UNAVAILABLE of a method without retry", eerr)
		}
		if st := c.Status(lookupMethod); st.Breaker == nil {
			t.Error("Lookup has no breaker, want the document's circuitBreaker block")
		}
	})
}

func TestUpdateServiceConfigLeavesCallsInFlightAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(3, codes.Unavailable))
		p := fastPolicy(5)
		p.InitialBackoff, p.MaxBackoff, p.Jitter = time.Second, time.Second, serviceconfig.JitterNone
		var once sync.Once
		updated := make(chan error, 1)
		var c *Client
		stub, c := newEcho(t, srv, WithRetryPolicy(p), WithOnRetry(func(context.Context, RetryEvent) {
			// While the first call backs off, take retries away.
			once.Do(func() { updated <- c.UpdateServiceConfig(&serviceconfig.Config{}) })
		}))
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatalf("Echo() started under the old config = %v, want success on its 4th attempt", err)
		}
		if err := <-updated; err != nil {
			t.Fatal(err)
		}
		if got := srv.Count("Echo"); got != 4 {
			t.Errorf("server saw %d attempts, want 4: the call keeps its config", got)
		}
		srv.SetScript(failFirst(100, codes.Unavailable))
		before := srv.Count("Echo")
		_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{})
		if got := srv.Count("Echo") - before; got != 1 {
			t.Errorf("a call after the update made %d attempts, want 1: no policy any more", got)
		}
	})
}

func TestUpdateServiceConfigRefusesABadConfig(t *testing.T) {
	c := newTestClient(t, WithRetryPolicy(fastPolicy(3)))
	bad := &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
		Name:     []serviceconfig.Name{{}},
		Bulkhead: &serviceconfig.Bulkhead{MaxConcurrent: 0},
	}}}
	err := c.UpdateServiceConfig(bad)
	var sce *serviceconfig.Error
	if !errors.As(err, &sce) || sce.Path != "methodConfig[0].bulkhead.maxConcurrent" {
		t.Fatalf("UpdateServiceConfig(bad) = %v, want a serviceconfig.Error at methodConfig[0].bulkhead.maxConcurrent", err)
	}
	if policyOf(c, echoMethod).retry == nil {
		t.Error("a refused config replaced the old one")
	}
}

func TestNewClientReportsBadOptions(t *testing.T) {
	tests := []struct {
		name string
		opt  ClientOption
		want string
	}{
		{"bad method name", WithRetryPolicy(fastPolicy(2), "/onlyservice"), `interceptor: WithRetryPolicy: "/onlyservice" is not a full method: want "/package.Service/Method"`},
		{"negative pushback", WithMaxServerPushback(-time.Second), "interceptor: WithMaxServerPushback(-1s): must not be negative"},
		{"nil config", WithServiceConfig(nil), "interceptor: WithServiceConfig: nil config"},
		{"duplicate names", WithMethodConfig(
			serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: "a.B"}}},
			serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: "a.B"}}},
		), "interceptor: WithMethodConfig: entry 1: Name[0]: duplicates the name at WithMethodConfig: entry 0: Name[0]"},
		{"one layer", WithOneLayerRetry(0), "interceptor: WithOneLayerRetry(0): must be at least 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewClient(tt.opt)
			if err == nil || err.Error() != tt.want || c != nil {
				t.Fatalf("NewClient() = %v, %v, want error %q", c, err, tt.want)
			}
		})
	}
}

func TestWaitForReadyFromConfig(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		wfr := true
		srv := &testserver.Server{}
		c := newTestClient(t, WithMethodConfig(serviceconfig.MethodConfig{
			Name: []serviceconfig.Name{{Service: echoService}}, WaitForReady: &wfr,
		}))
		var seen []bool
		spy := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			for _, o := range opts {
				if f, ok := o.(grpc.FailFastCallOption); ok {
					seen = append(seen, !f.FailFast)
				}
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		cc := testserver.Start(t, srv, grpc.WithChainUnaryInterceptor(c.UnaryClientInterceptor(), spy))
		if _, err := echov1.NewEchoServiceClient(cc).Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatal(err)
		}
		if len(seen) != 1 || !seen[0] {
			t.Errorf("wait-for-ready options passed on = %v, want [true]", seen)
		}
	})
}

// TestParsedMaxAttemptsAreNotCappedTwice pins one cap on MaxAttempts: a
// document parsed with WithMaxAttemptsCap(10) and maxAttempts 8 looked up
// as 8, but the client still ran 5.
func TestParsedMaxAttemptsAreNotCappedTwice(t *testing.T) {
	doc := []byte(`{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService"}],
		"retryPolicy": {"maxAttempts": 8, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
		"backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`)
	for _, tt := range []struct {
		name   string
		update bool // through UpdateServiceConfig rather than WithServiceConfig
	}{{"WithServiceConfig", false}, {"UpdateServiceConfig", true}} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg, err := serviceconfig.Parse(doc, serviceconfig.WithMaxAttemptsCap(10))
				if err != nil {
					t.Fatal(err)
				}
				srv := &testserver.Server{}
				srv.SetScript(failFirst(100, codes.Unavailable))
				var stub echov1.EchoServiceClient
				if tt.update {
					var c *Client
					stub, c = newEcho(t, srv, WithRetryBudget(nil))
					if err := c.UpdateServiceConfig(cfg); err != nil {
						t.Fatal(err)
					}
				} else {
					stub, _ = newEcho(t, srv, WithRetryBudget(nil), WithServiceConfig(cfg))
				}
				_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{})
				if n := srv.Count("Echo"); n != 8 {
					t.Errorf("server saw %d attempts, want the parsed maxAttempts of 8", n)
				}
			})
		})
	}
}

// TestEachPolicyIsCappedByWhereItCameFrom pins one cap per origin: a parsed
// config's MaxAttempts run as Parse capped them (10 here), while a policy
// built in Go is held to the client's cap (WithMaxAttemptsCap) and is
// refused, naming the option, when it asks for more. A parsed config with
// a raised cap used to lift the cap of every Go policy beside it (a Go
// policy asking for 8 made 8 attempts instead of 5), and a Go policy
// asking for 10 alone was lowered to 5 without a word.
func TestEachPolicyIsCappedByWhereItCameFrom(t *testing.T) {
	lookup := []byte(`{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService", "method": "Lookup"}],
		"retryPolicy": {"maxAttempts": 10, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
		"backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`)
	parsed, err := serviceconfig.Parse(lookup, serviceconfig.WithMaxAttemptsCap(10))
	if err != nil {
		t.Fatal(err)
	}
	hedge := serviceconfig.MethodConfig{
		Name:          []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
		HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 6, HedgingDelay: time.Millisecond},
	}
	refused := []struct {
		name string
		opts []ClientOption
		want string
	}{
		{"Go policy beside a parsed config with a raised cap",
			[]ClientOption{WithServiceConfig(parsed), WithRetryPolicy(fastPolicy(8), echoMethod)},
			"interceptor: WithRetryPolicy: MaxAttempts: 8 is above the cap of 5; raise the cap with interceptor.WithMaxAttemptsCap"},
		{"Go policy alone", []ClientOption{WithRetryPolicy(fastPolicy(10))},
			"interceptor: WithRetryPolicy: MaxAttempts: 10 is above the cap of 5; raise the cap with interceptor.WithMaxAttemptsCap"},
		{"Go hedging policy", []ClientOption{WithMethodConfig(serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: echoService, Method: "Lookup"}}}, hedge)},
			"interceptor: WithMethodConfig: entry 1: HedgingPolicy.MaxAttempts: 6 is above the cap of 5; raise the cap with interceptor.WithMaxAttemptsCap"},
		{"Go config", []ClientOption{WithServiceConfig(&serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{hedge}})},
			"interceptor: WithServiceConfig: MethodConfig[0].HedgingPolicy.MaxAttempts: 6 is above the cap of 5; raise the cap with interceptor.WithMaxAttemptsCap"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewClient(tt.opts...); err == nil || err.Error() != tt.want {
				t.Errorf("NewClient = %v, want %q", err, tt.want)
			}
		})
	}
	t.Run("UpdateServiceConfig with a Go config", func(t *testing.T) {
		c := newTestClient(t)
		err := c.UpdateServiceConfig(&serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{hedge}})
		want := "interceptor: UpdateServiceConfig: MethodConfig[0].HedgingPolicy.MaxAttempts: 6 is above the cap of 5; raise the cap with interceptor.WithMaxAttemptsCap"
		if err == nil || err.Error() != want {
			t.Errorf("UpdateServiceConfig = %v, want %q", err, want)
		}
	})
	t.Run("a raised client cap admits the Go policy; the parsed one runs as parsed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := &testserver.Server{}
			srv.SetScript(failFirst(100, codes.Unavailable))
			stub, _ := newEcho(t, srv, WithRetryBudget(nil), WithServiceConfig(parsed),
				WithRetryPolicy(fastPolicy(8), echoMethod), WithMaxAttemptsCap(8))
			_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{})
			_, _ = stub.Lookup(t.Context(), &echov1.LookupRequest{})
			if e, l := srv.Count("Echo"), srv.Count("Lookup"); e != 8 || l != 10 {
				t.Errorf("server saw %d Echo and %d Lookup attempts, want 8 (the Go policy) and 10 (the parsed one)", e, l)
			}
		})
	})
}
