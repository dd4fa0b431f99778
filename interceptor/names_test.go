package interceptor

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestNameOptionsQuoteMalformedNames pins that the options taking names
// refuse one that can never match a call, quoting it and saying what is
// wrong. Before, "//shop.Orders/Pay" and "shop.Orders " were accepted and
// applied to nothing, and "shop.Orders/Pay" was refused as a service
// without saying it lacked its leading slash.
func TestNameOptionsQuoteMalformedNames(t *testing.T) {
	p := fastPolicy(3)
	tests := []struct {
		name    string
		opt     ClientOption
		wantErr string
	}{
		{"full method without its slash", WithRetryPolicy(p, "shop.Orders/Pay"),
			`interceptor: WithRetryPolicy: "shop.Orders/Pay": a full method starts with a slash: "/shop.Orders/Pay"`},
		{"two leading slashes", WithIdempotencyKeys("//shop.Orders/Pay"),
			`interceptor: WithIdempotencyKeys: "//shop.Orders/Pay": service "/shop.Orders" holds a slash: write "shop.Orders"`},
		{"a trailing space", WithRetryPolicy(p, "shop.Orders "),
			`interceptor: WithRetryPolicy: "shop.Orders ": service "shop.Orders " holds a space or control character`},
		{"protoc's leading dot", WithExemptMethods(".shop.Orders"),
			`interceptor: WithExemptMethods: ".shop.Orders": service ".shop.Orders" has an empty part: write it as "shop.Orders", package and service`},
		{"no method", WithIdempotentMethods("/shop.Orders/"),
			`interceptor: WithIdempotentMethods: "/shop.Orders/" is not a full method: want "/package.Service/Method"`},
		{"empty", WithFallback(func(_ context.Context, _ string, _, _ any, err error) error { return err }, ""),
			`interceptor: WithFallback: "": want a full method "/package.Service/Method" or a service "package.Service"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewClient(tt.opt)
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("NewClient() = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestBreakerControlsFindTheCallsBreaker pins that ForceOpen and Status
// given a method without its leading slash act on the breaker the calls
// use. Before, they made a breaker of their own under that name: the
// forced-open breaker rejected no call, and Status showed a closed breaker
// while the calls' was open.
func TestBreakerControlsFindTheCallsBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		stub, c := newEcho(t, srv, WithMethodConfig(serviceconfig.MethodConfig{
			Name:           []serviceconfig.Name{{Service: echoService}},
			CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 3},
		}))
		bare := strings.TrimPrefix(echoMethod, "/")
		if err := c.ForceOpen(bare); err != nil {
			t.Fatal(err)
		}
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); status.Code(err) != codes.Unavailable {
			t.Errorf("Echo() after ForceOpen(%q) = %v, want UNAVAILABLE from the open breaker", bare, err)
		}
		if st := c.Status(bare).Breaker; st == nil || st.State != BreakerForcedOpen {
			t.Errorf("Status(%q).Breaker = %+v, want forced open", bare, st)
		}
		if err := c.ResetBreaker(bare); err != nil {
			t.Fatal(err)
		}
	})
}

// TestBreakerControlsQuoteMalformedNames pins the errors of ForceOpen,
// ForceClosed and ResetBreaker for a name that is not a full method, and
// that Status of one resolves nothing.
func TestBreakerControlsQuoteMalformedNames(t *testing.T) {
	// A default breaker, so that any method the client resolves shows in
	// Statuses.
	c := newTestClient(t, WithMethodConfig(serviceconfig.MethodConfig{
		Name: []serviceconfig.Name{{}}, CircuitBreaker: &serviceconfig.CircuitBreaker{},
	}))
	tests := []struct {
		op      func(string) error
		name    string
		wantErr string
	}{
		{c.ForceOpen, "shop.Orders", `interceptor: ForceOpen: "shop.Orders" is not a full method: want "/package.Service/Method"`},
		{c.ForceClosed, "/shop.Orders/Pay ", `interceptor: ForceClosed: "/shop.Orders/Pay ": method "Pay " holds a space or control character`},
		{c.ResetBreaker, "//shop.Orders/Pay", `interceptor: ResetBreaker: "//shop.Orders/Pay": service "/shop.Orders" holds a slash: write "shop.Orders"`},
	}
	for _, tt := range tests {
		if err := tt.op(tt.name); err == nil || err.Error() != tt.wantErr {
			t.Errorf("(%q) = %v, want %q", tt.name, err, tt.wantErr)
		}
	}
	if st := c.Status("shop.Orders"); st.FullMethod != "shop.Orders" || st.Breaker != nil || st.Bulkhead != nil {
		t.Errorf("Status(%q) = %+v, want an empty status", "shop.Orders", st)
	}
	if st := c.Statuses(); len(st) != 0 {
		t.Errorf("the client resolved %d methods for malformed names, want none: %+v", len(st), st)
	}
}
