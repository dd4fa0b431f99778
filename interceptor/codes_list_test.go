package interceptor

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestGoPolicyTakesGRPCCodes pins the natural Go form of a code list,
// grpc's own codes in a slice: INTERNAL, which the default rules never
// retry, is retried when the list names it, and DATA_LOSS, which the list
// leaves out, is not.
func TestGoPolicyTakesGRPCCodes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(2, codes.Internal))
		p := fastPolicy(4)
		p.RetryableStatusCodes = []codes.Code{codes.Internal, codes.Unavailable}
		stub, _ := newEcho(t, srv, WithRetryPolicy(p))
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{Message: "a"}); err != nil {
			t.Fatalf("Echo() = %v, want success on the third attempt", err)
		}
		if n := srv.Count("Echo"); n != 3 {
			t.Errorf("server saw %d attempts, want 3 (INTERNAL listed, so retried)", n)
		}

		srv2 := &testserver.Server{}
		srv2.SetScript(failFirst(2, codes.DataLoss))
		stub2, _ := newEcho(t, srv2, WithRetryPolicy(p))
		if _, err := stub2.Echo(t.Context(), &echov1.EchoRequest{}); status.Code(err) != codes.DataLoss {
			t.Fatalf("Echo() = %v, want DATA_LOSS, not retried", err)
		}
		if n := srv2.Count("Echo"); n != 1 {
			t.Errorf("server saw %d attempts of a code the list leaves out, want 1", n)
		}
	})
}

// TestConfigUpdateKeepsBreakerWhenFailureCodesReordered pins that a
// breaker block whose failure codes are the same set in another order is
// the same block: the breaker and its forced state carry over (a changed
// block changes the breaker in place, which keeps the forced state too:
// breaker.Reconfigure).
func TestConfigUpdateKeepsBreakerWhenFailureCodesReordered(t *testing.T) {
	block := func(cs ...codes.Code) *serviceconfig.Config {
		return &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
			Name:           []serviceconfig.Name{{Service: echoService}},
			CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 3, FailureStatusCodes: cs},
		}}}
	}
	c := newTestClient(t, WithServiceConfig(block(codes.Unavailable, codes.Internal)))
	if err := c.ForceOpen(echoMethod); err != nil {
		t.Fatal(err)
	}
	if err := c.UpdateServiceConfig(block(codes.Internal, codes.Unavailable, codes.Internal)); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(echoMethod).Breaker; st.State != BreakerForcedOpen {
		t.Errorf("breaker after an update with the same codes reordered = %v, want forced-open kept", st.State)
	}
	if err := c.UpdateServiceConfig(block(codes.Internal)); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(echoMethod).Breaker; st.State != BreakerForcedOpen {
		t.Errorf("breaker after an update with other codes = %v, want the breaker, reconfigured, with the forced state kept", st.State)
	}
}

// TestCodeListsAllocateNothing pins that code lists cost a call nothing:
// the client turns them into bitmasks when it resolves the method.
func TestCodeListsAllocateNothing(t *testing.T) {
	p := fastPolicy(4)
	p.RetryableStatusCodes = []codes.Code{codes.Unavailable, codes.Internal, codes.Aborted}
	ic := newTestClient(t, WithMethodConfig(serviceconfig.MethodConfig{
		Name:        []serviceconfig.Name{{Service: echoService}},
		RetryPolicy: p,
		CircuitBreaker: &serviceconfig.CircuitBreaker{
			FailureStatusCodes: []codes.Code{codes.Unavailable, codes.DataLoss},
		},
	})).UnaryClientInterceptor()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
	_ = ic(ctx, echoMethod, req, reply, nil, okInvoker) // resolve the method's policy once
	allocs := testing.AllocsPerRun(1000, func() {
		if err := ic(ctx, echoMethod, req, reply, nil, okInvoker); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("success path with code lists: %v allocs per call, want 0", allocs)
	}
}
