package interceptor

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// guardedRetry gives the echo service a retry policy of 3 attempts, a
// breaker that trips on one failure and a bulkhead of one slot.
func guardedRetry() ClientOption {
	return WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: echoService}},
		RetryPolicy:    fastPolicy(3),
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 1, OpenDuration: time.Second},
		Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 1},
	})
}

// TestUnaryAttemptWithHeadersIsCommitted pins gRFC A6's commit for unary
// calls: a handler that sent its headers and then failed UNAVAILABLE ran
// three times; it runs once, and the call says it stopped committed.
func TestUnaryAttemptWithHeadersIsCommitted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome {
			return testserver.Outcome{Header: metadata.Pairs("charged", "yes"), Err: status.Error(codes.Unavailable, "after headers")}
		})
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(3)))
		var header metadata.MD
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{}, grpc.Header(&header))
		var re *RetryError
		if !errors.As(err, &re) || re.Reason != StopCommitted || re.Attempts != 1 || status.Code(err) != codes.Unavailable {
			t.Errorf("Echo() = %#v, want UNAVAILABLE stopped committed after 1 attempt", err)
		}
		if n := srv.Count("Echo"); n != 1 {
			t.Errorf("server ran the handler %d times, want 1: the attempt had sent headers", n)
		}
		if got := header.Get("charged"); len(got) != 1 {
			t.Errorf("caller's header = %v, want the committed attempt's", header)
		}
	})
}

// TestUnaryTrailersOnlyFailureIsRetried is the other side of the commit
// rule: a failure without headers (trailers only) is retried.
func TestUnaryTrailersOnlyFailureIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(2, codes.Unavailable))
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(3)))
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatalf("Echo() = %v, want success on the third attempt", err)
		}
		if n := srv.Count("Echo"); n != 3 {
			t.Errorf("server saw %d attempts, want 3", n)
		}
	})
}

// TestUnaryMessageErrorsAreNeitherRetriedNorBreakerFailures pins that a
// reply larger than the client's MaxCallRecvMsgSize, or a request larger
// than its MaxCallSendMsgSize (both RESOURCE_EXHAUSTED made by grpc on the
// client), ends the call at once and leaves the breaker closed: the reply
// was retried twice and tripped a one-failure breaker.
func TestUnaryMessageErrorsAreNeitherRetriedNorBreakerFailures(t *testing.T) {
	tests := []struct {
		name     string
		opt      grpc.CallOption
		attempts int        // the server's
		reason   StopReason // a reply comes after the headers: committed
	}{
		{"reply too large", grpc.MaxCallRecvMsgSize(64), 1, StopCommitted},
		{"request too large", grpc.MaxCallSendMsgSize(64), 0, StopNonRetryable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				c := newTestClient(t, guardedRetry())
				stub := echov1.NewEchoServiceClient(testserver.Start(t, srv, c.DialOptions()...))
				_, err := stub.Echo(t.Context(), &echov1.EchoRequest{Payload: make([]byte, 1024)}, tt.opt)
				var re *RetryError
				if status.Code(err) != codes.ResourceExhausted || !errors.As(err, &re) || re.Attempts != 1 || re.Reason != tt.reason {
					t.Errorf("Echo() = %#v, want RESOURCE_EXHAUSTED, not retried (%v)", err, tt.reason)
				}
				if n := srv.Count("Echo"); n != tt.attempts {
					t.Errorf("server ran the handler %d times, want %d", n, tt.attempts)
				}
				if st := c.Status(echoMethod).Breaker.State; st != BreakerClosed {
					t.Errorf("breaker %v after a message error, want closed", st)
				}
			})
		})
	}
}

// panicBelow is a unary interceptor installed after the client's that
// panics while armed, as a broken interceptor, codec or stats handler would.
type panicBelow struct{ armed bool }

func (p *panicBelow) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if p.armed {
		panic("below the interceptor")
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// TestUnaryPanicBelowReleasesSlotAndProbe pins that a panic below the
// interceptor, recovered by the caller, gives back the attempt's bulkhead
// slot and its half-open probe: both leaked, and with one slot every later
// call was rejected, and the breaker stayed half-open for good.
func TestUnaryPanicBelowReleasesSlotAndProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(1, codes.Unavailable))
		c := newTestClient(t, guardedRetry())
		below := &panicBelow{}
		cc := testserver.Start(t, srv, append(c.DialOptions(), grpc.WithChainUnaryInterceptor(below.intercept))...)
		stub := echov1.NewEchoServiceClient(cc)
		ctx := t.Context()

		below.armed = true
		if v := recovered(func() { _, _ = stub.Echo(ctx, &echov1.EchoRequest{}) }); v == nil {
			t.Fatal("Echo() did not panic through the interceptor")
		}
		if st := c.Status(echoMethod).Bulkhead; st.InFlight != 0 {
			t.Fatalf("bulkhead in flight %d after a panic below, want 0", st.InFlight)
		}

		// Trip the breaker, and let the panic take its half-open probe.
		below.armed = false
		if _, err := stub.Echo(ctx, &echov1.EchoRequest{}, NoRetry()); status.Code(err) != codes.Unavailable {
			t.Fatalf("Echo() = %v, want the server's UNAVAILABLE", err)
		}
		time.Sleep(time.Second)
		below.armed = true
		_ = recovered(func() { _, _ = stub.Echo(ctx, &echov1.EchoRequest{}) })
		if st := c.Status(echoMethod).Breaker; st.Probes != 0 {
			t.Fatalf("breaker %v with %d probes out after a panic below, want none", st.State, st.Probes)
		}
		below.armed = false
		if _, err := stub.Echo(ctx, &echov1.EchoRequest{}); err != nil {
			t.Errorf("Echo() after the panics = %v, want a probe that succeeds", err)
		}
		if st := c.Status(echoMethod).Breaker.State; st != BreakerClosed {
			t.Errorf("breaker %v, want closed by the probe", st)
		}
	})
}

// TestPerAttemptTimeoutWithoutARetryPolicy pins that PerAttemptTimeout
// bounds the one attempt of a method without a retry policy: a 500ms
// handler called with PerAttemptTimeout(50ms) succeeded after 500ms.
func TestPerAttemptTimeoutWithoutARetryPolicy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: 500 * time.Millisecond} })
		stub, _ := newEcho(t, srv)
		start := time.Now()
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{}, PerAttemptTimeout(50*time.Millisecond))
		if status.Code(err) != codes.DeadlineExceeded || time.Since(start) != 50*time.Millisecond {
			t.Errorf("Echo() = %v after %v, want DEADLINE_EXCEEDED after 50ms", err, time.Since(start))
		}
		var re *RetryError
		if errors.As(err, &re) {
			t.Errorf("Echo() = %#v, want the attempt's error as is: no retry policy applies", err)
		}
		if n := srv.Count("Echo"); n != 1 {
			t.Errorf("server saw %d attempts, want 1", n)
		}
	})
}
