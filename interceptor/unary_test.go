package interceptor

import (
	"context"
	"errors"
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

const (
	echoMethod   = "/resilience.echo.v1.EchoService/Echo"
	lookupMethod = "/resilience.echo.v1.EchoService/Lookup"
)

// newEcho starts srv, any echo server, and returns a stub whose connection runs through a
// client built with opts.
func newEcho(t *testing.T, srv echov1.EchoServiceServer, opts ...ClientOption) (echov1.EchoServiceClient, *Client) {
	t.Helper()
	c := newTestClient(t, opts...)
	cc := testserver.Start(t, srv, c.DialOptions()...)
	return echov1.NewEchoServiceClient(cc), c
}

// failFirst fails the first n attempts of every method with code.
func failFirst(n int, code codes.Code) testserver.Script {
	return func(a testserver.Attempt) testserver.Outcome {
		if a.N <= n {
			return testserver.Outcome{Err: status.Errorf(code, "attempt %d fails", a.N)}
		}
		return testserver.Outcome{}
	}
}

// stallFirst makes the first attempt of every method hang for an hour (of
// fake time) and the others succeed.
func stallFirst() testserver.Script {
	return func(a testserver.Attempt) testserver.Outcome {
		if a.N == 1 {
			return testserver.Outcome{Delay: time.Hour}
		}
		return testserver.Outcome{}
	}
}

func fastPolicy(maxAttempts int) *serviceconfig.RetryPolicy {
	return &serviceconfig.RetryPolicy{
		MaxAttempts:       maxAttempts,
		InitialBackoff:    10 * time.Millisecond,
		MaxBackoff:        100 * time.Millisecond,
		BackoffMultiplier: 2,
	}
}

func TestUnaryRetriesTransientCodesAndSendsPreviousAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(2, codes.Unavailable))
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(4)))
		resp, err := stub.Echo(t.Context(), &echov1.EchoRequest{Message: "hi"})
		if err != nil || resp.GetMessage() != "hi" {
			t.Fatalf("Echo() = %v, %v, want hi, nil", resp, err)
		}
		var prev []int
		for _, a := range srv.Attempts() {
			prev = append(prev, a.Previous)
		}
		if want := []int{-1, 1, 2}; !equalInts(prev, want) {
			t.Errorf("grpc-previous-rpc-attempts seen = %v, want %v (-1: absent)", prev, want)
		}
	})
}

func TestUnaryNonRetryableCodesRunOnceAndComeBackUnchanged(t *testing.T) {
	for _, code := range []codes.Code{
		codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.Unauthenticated, codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented,
		codes.Internal, codes.Unknown, codes.DataLoss, codes.Aborted, codes.DeadlineExceeded,
	} {
		t.Run(code.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(func(testserver.Attempt) testserver.Outcome {
					return testserver.Outcome{Err: status.Error(code, "nope: "+code.String())}
				})
				stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(5)))
				_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
				if got := srv.Count("Echo"); got != 1 {
					t.Errorf("server saw %d attempts, want 1", got)
				}
				st := status.Convert(err)
				if st.Code() != code || st.Message() != "nope: "+code.String() {
					t.Errorf("Echo() error = %v, want code %v and the server's message", err, code)
				}
				var re *RetryError
				if !errors.As(err, &re) || re.Attempts != 1 || re.Reason != StopNonRetryable {
					t.Errorf("errors.As(RetryError) = %+v, want 1 attempt, non-retryable", re)
				}
			})
		})
	}
}

func TestUnaryExhaustedKeepsLastCode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(100, codes.ResourceExhausted))
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(3)))
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
		var re *RetryError
		if !errors.As(err, &re) || re.Attempts != 3 || re.Reason != StopExhausted {
			t.Fatalf("Echo() error = %#v, want RetryError with 3 attempts, exhausted", err)
		}
		if got := status.Code(err); got != codes.ResourceExhausted {
			t.Errorf("status.Code(err) = %v, want ResourceExhausted", got)
		}
		if got := srv.Count("Echo"); got != 3 {
			t.Errorf("server saw %d attempts, want 3", got)
		}
	})
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

var _ = context.Background
var _ grpc.CallOption
