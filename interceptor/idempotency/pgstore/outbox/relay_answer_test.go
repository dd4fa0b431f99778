package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/outbox"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// fieldErrors is an error whose type == cannot compare, as a validation
// library's list of field errors is: a slice.
type fieldErrors []string

func (e fieldErrors) Error() string { return "invalid fields: " + e[0] }

// GRPCStatus makes it a refusal for good (INVALID_ARGUMENT).
func (e fieldErrors) GRPCStatus() *status.Status { return status.New(codes.InvalidArgument, e.Error()) }

// TestRelayTakesAnUncomparableErrorOfAnAttemptWithoutPanicking: an
// interceptor of the relay's conn (a client-side validation, say) fails an
// attempt with an error of a type that == cannot compare; the relay's
// client returns it unchanged (no retry policy) or in its RetryError. The
// relay must tell it is an attempt's answer without ==, which panics on two
// such values and, in a delivery's goroutine, crashed the process; and
// without errors.Is alone, which never matches such a value (the message
// was retried for ever). It is an attempt's INVALID_ARGUMENT: marked dead.
func TestRelayTakesAnUncomparableErrorOfAnAttemptWithoutPanicking(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []interceptor.ClientOption
	}{
		{name: "returned unchanged"},
		{name: "in a RetryError", opts: []interceptor.ClientOption{interceptor.WithMethodConfig(serviceconfig.MethodConfig{
			Name: []serviceconfig.Name{{}},
			RetryPolicy: &serviceconfig.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
				RetryableStatusCodes: []codes.Code{codes.Unavailable}},
		})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.enqueue(t, true, "invalid")
			cc, err := grpc.NewClient("passthrough:///"+e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDisableRetry(),
				grpc.WithChainUnaryInterceptor(func(context.Context, string, any, any, *grpc.ClientConn, grpc.UnaryInvoker, ...grpc.CallOption) error {
					return fieldErrors{"message"}
				}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cc.Close() })
			client, err := interceptor.NewClient(tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = client.Close() })
			var dead atomic.Int32
			r, err := outbox.NewRelay(e.ob, e.pool, cc, client, outbox.RelayConfig{OnDead: func(outbox.Message, error) { dead.Add(1) }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.Close() })
			if n, err := r.Once(context.Background()); n != 1 || err != nil {
				t.Fatalf("Once = %d, %v, want 1 answered (refused for good), nil", n, err)
			}
			if dead.Load() != 1 {
				t.Errorf("OnDead called %d times, want 1: an attempt's INVALID_ARGUMENT", dead.Load())
			}
		})
	}
}
