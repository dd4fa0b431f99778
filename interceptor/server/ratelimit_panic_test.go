package server

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestRateLimitTokensRefundedWhenCriticalityPanicsPastTheRateGate pins the
// refund on a panic between the gates: the rate limit admits a call (its
// one token taken), then the concurrency limit's call of the user's
// CriticalityFunc panics. The panic goes on up, the handler never runs,
// and the token goes back, once: the next call is admitted, and the one
// after it, on an empty bucket, refused. Before the refund was deferred,
// the panicking call kept its token and the next call was refused: a
// caller that could make the hook panic emptied every bucket it reached.
// Unary calls and streams alike.
func TestRateLimitTokensRefundedWhenCriticalityPanicsPastTheRateGate(t *testing.T) {
	var calls int
	panicNext := false
	crit := func(_ context.Context, sent wire.Criticality, _ bool) wire.Criticality {
		calls++
		// The rate gate asks first, the concurrency limit second: panic
		// on the second ask of a call that is told to.
		if panicNext && calls%2 == 0 {
			panic("criticality hook panic")
		}
		return sent
	}
	l := rateLimits(serviceconfig.RateLimit{Name: "r", Rate: 1, Per: time.Hour, Burst: 1, Key: serviceconfig.KeyShared})
	l.Tenant = nil
	l.Criticality = crit
	l.Config.ConcurrencyLimit = &serviceconfig.ConcurrencyLimit{InitialLimit: 4, MinLimit: 1, MaxLimit: 4}
	l.Streams = []string{"pkg.S"}
	var srv *Server
	ran := 0
	unary := func() error {
		calls = 0
		_, err := srv.UnaryServerInterceptor()(t.Context(), nil, &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"},
			func(context.Context, any) (any, error) { ran++; return nil, nil })
		return err
	}
	stream := func() error {
		calls = 0
		return srv.StreamServerInterceptor()(nil, &srvStream{ctx: t.Context()}, &grpc.StreamServerInfo{FullMethod: "/pkg.S/W"},
			func(any, grpc.ServerStream) error { ran++; return nil })
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{{"unary", unary}, {"stream", stream}} {
		t.Run(tc.name, func(t *testing.T) {
			srv, ran = newRateServer(t, l), 0 // a full bucket of one token
			func() {
				panicNext = true
				defer func() {
					panicNext = false
					if recover() == nil {
						t.Fatal("the hook's panic did not go on up")
					}
				}()
				_ = tc.call()
			}()
			if ran != 0 {
				t.Fatalf("the handler ran %d times past a panic before it", ran)
			}
			if err := tc.call(); err != nil {
				t.Fatalf("the call after the panic: %v, want admitted on the refunded token", err)
			}
			if err := tc.call(); status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("a call on the empty bucket: %v, want RESOURCE_EXHAUSTED (the token was given back once only)", err)
			}
			if ran != 1 {
				t.Errorf("the handler ran %d times, want 1", ran)
			}
		})
	}
}
