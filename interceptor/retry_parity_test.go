package interceptor

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The tests of this file pin the rows of issue 15 where grpc-go's built-in
// retry was right and the unary path was not; the differential test
// (parity_test.go) runs them all against grpc-go.

// throttleTokens returns the token count of c's A6 throttle.
func throttleTokens(t *testing.T, c *Client) float64 {
	t.Helper()
	th := c.state.Load().storm.throttle
	if th == nil {
		t.Fatal("the client has no A6 throttle")
	}
	return th.Tokens()
}

// a6Config is an A6 service config: Echo retries UNAVAILABLE and extra,
// up to 3 attempts, 1ms apart; Lookup has no policy; the throttle holds 10
// tokens and a success adds 1.
func a6Config(extra ...string) string {
	list := `"UNAVAILABLE"`
	for _, c := range extra {
		list += `, "` + c + `"`
	}
	return `{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService", "method": "Echo"}],
		"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.001s", "maxBackoff": "0.001s",
			"backoffMultiplier": 1, "retryableStatusCodes": [` + list + `]}}],
		"retryThrottling": {"maxTokens": 10, "tokenRatio": 1}}`
}

// newA6Echo is newEcho under the service config doc, with the retry budget
// off, as grpc-go has none.
func newA6Echo(t *testing.T, srv *testserver.Server, doc string, opts ...ClientOption) (echov1.EchoServiceClient, *Client) {
	t.Helper()
	cfg, err := serviceconfig.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse(%s) = %v", doc, err)
	}
	return newEcho(t, srv, append([]ClientOption{WithServiceConfig(cfg), WithRetryBudget(nil)}, opts...)...)
}

// TestUnaryRequestOverReplayBufferIsNotRetried pins that a unary request
// whose message (with gRPC's 5-byte prefix) outgrows the replay buffer
// commits its attempt, as grpc-go's per-RPC retry buffer does: a failure
// is final and, being committed, not counted by the throttle. It used to
// be retried.
func TestUnaryRequestOverReplayBufferIsNotRetried(t *testing.T) {
	const limit = 100
	// sized returns a request whose encoded size plus the prefix is n.
	sized := func(n int) *echov1.EchoRequest {
		req := &echov1.EchoRequest{Payload: make([]byte, n-5-2)}
		if got := proto.Size(req) + 5; got != n {
			t.Fatalf("request of %d bytes on the wire, want %d", got, n)
		}
		return req
	}
	tests := []struct {
		name     string
		wire     int
		attempts int
		reason   StopReason
		tokens   float64
	}{
		{"at the bound: retried", limit, 3, StopExhausted, 7},
		{"one byte over: committed", limit + 1, 1, StopCommitted, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := &testserver.Server{}
			srv.SetScript(failFirst(10, codes.Unavailable))
			stub, c := newA6Echo(t, srv, a6Config(), WithStreamReplayBuffer(limit))
			_, err := stub.Echo(t.Context(), sized(tt.wire))
			var re *RetryError
			if !errors.As(err, &re) || re.Reason != tt.reason || status.Code(err) != codes.Unavailable {
				t.Fatalf("Echo(%d bytes) = %v, want UNAVAILABLE stopped by %v", tt.wire, err, tt.reason)
			}
			if n := srv.Count("Echo"); n != tt.attempts {
				t.Errorf("server saw %d attempts, want %d", n, tt.attempts)
			}
			if got := throttleTokens(t, c); got != tt.tokens {
				t.Errorf("throttle tokens = %v, want %v", got, tt.tokens)
			}
		})
	}
}

// TestDontRetryPushbackCountsAsThrottleFailure pins grpc-go's order
// (csAttempt.shouldRetry): a pushback that says not to retry is a throttle
// failure whatever the code, on methods with a retry policy and without;
// an attempt that answered with headers is committed and counts nothing.
// It used to be counted only with a retryable code and a policy.
func TestDontRetryPushbackCountsAsThrottleFailure(t *testing.T) {
	tests := []struct {
		name     string
		method   string
		code     codes.Code
		pushback []string
		header   bool
		tokens   float64
	}{
		{"negative, non-retryable code", "Echo", codes.InvalidArgument, []string{"-1"}, false, 9},
		{"malformed, non-retryable code", "Echo", codes.Internal, []string{"soon"}, false, 9},
		{"repeated, non-retryable code", "Echo", codes.Internal, []string{"1", "2"}, false, 9},
		{"negative, retryable code", "Echo", codes.Unavailable, []string{"-1"}, false, 9},
		{"negative, no retry policy", "Lookup", codes.Unavailable, []string{"-1"}, false, 9},
		{"repeated, no retry policy", "Lookup", codes.InvalidArgument, []string{"3", "4"}, false, 9},
		{"valid pushback, no retry policy", "Lookup", codes.Unavailable, []string{"1"}, false, 10},
		{"no pushback, no retry policy", "Lookup", codes.Unavailable, nil, false, 10},
		{"negative after headers: committed", "Echo", codes.InvalidArgument, []string{"-1"}, true, 10},
		{"negative after headers, no retry policy", "Lookup", codes.InvalidArgument, []string{"-1"}, true, 10},
		{"negative, stream without a retry policy", "ServerStream", codes.Unavailable, []string{"-1"}, false, 9},
		{"valid pushback, stream without a retry policy", "ServerStream", codes.Unavailable, []string{"1"}, false, 10},
		{"negative after headers, stream without a retry policy", "ServerStream", codes.Unavailable, []string{"-1"}, true, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := &testserver.Server{}
			srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
				o := testserver.Outcome{Err: status.Error(tt.code, "no")}
				if tt.pushback != nil {
					o.Trailer = metadata.MD{pushbackKey: tt.pushback}
				}
				if tt.header {
					o.Header = metadata.Pairs("answered", "yes")
				}
				return o
			})
			stub, c := newA6Echo(t, srv, a6Config())
			var err error
			switch tt.method {
			case "Echo":
				_, err = stub.Echo(t.Context(), &echov1.EchoRequest{})
			case "Lookup":
				_, err = stub.Lookup(t.Context(), &echov1.LookupRequest{})
			default:
				var st grpc.ServerStreamingClient[echov1.ServerStreamResponse]
				if st, err = stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Count: 1}); err == nil {
					for err == nil {
						_, err = st.Recv()
					}
				}
			}
			if status.Code(err) != tt.code {
				t.Fatalf("%s = %v, want %v", tt.method, err, tt.code)
			}
			if n := srv.Count(""); n != 1 {
				t.Errorf("server saw %d attempts, want 1", n)
			}
			if got := throttleTokens(t, c); got != tt.tokens {
				t.Errorf("throttle tokens = %v, want %v", got, tt.tokens)
			}
		})
	}
}

// TestCallerDeadlineExceededCountsAsThrottleFailure pins that an attempt
// cut by the caller's deadline (or the config's timeout), when
// DEADLINE_EXCEEDED is listed as retryable, is a throttle failure, as in
// grpc-go, though it is not retried. It used to count nothing.
func TestCallerDeadlineExceededCountsAsThrottleFailure(t *testing.T) {
	withTimeout := strings.Replace(a6Config("DEADLINE_EXCEEDED"), `"retryPolicy"`, `"timeout": "0.05s", "retryPolicy"`, 1)
	tests := []struct {
		name     string
		doc      string
		deadline time.Duration // the caller's; 0: none
		tokens   float64
	}{
		{"caller's deadline, listed", a6Config("DEADLINE_EXCEEDED"), 50 * time.Millisecond, 9},
		{"config timeout, listed", withTimeout, 0, 9},
		{"caller's deadline, not listed", a6Config(), 50 * time.Millisecond, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: time.Hour} })
				stub, c := newA6Echo(t, srv, tt.doc)
				ctx := t.Context()
				if tt.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.deadline)
					defer cancel()
				}
				_, err := stub.Echo(ctx, &echov1.EchoRequest{})
				if status.Code(err) != codes.DeadlineExceeded {
					t.Fatalf("Echo = %v, want DEADLINE_EXCEEDED", err)
				}
				if n := srv.Count("Echo"); n != 1 {
					t.Errorf("server saw %d attempts, want 1", n)
				}
				if got := throttleTokens(t, c); got != tt.tokens {
					t.Errorf("throttle tokens = %v, want %v", got, tt.tokens)
				}
			})
		})
	}
}

// TestZeroTimeoutFailsCallsAtOnce pins the choice for "timeout": "0s",
// which gRFC A6 leaves undefined: as in grpc-go, every call fails at once
// with DEADLINE_EXCEEDED and no attempt reaches the server, unary or
// stream, on any clock (synctest's does not move). It used to mean no
// timeout.
func TestZeroTimeoutFailsCallsAtOnce(t *testing.T) {
	doc := `{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService"}], "timeout": "0s",
		"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.001s", "maxBackoff": "0.001s",
			"backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE", "DEADLINE_EXCEEDED"]}}]}`
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		stub, _ := newA6Echo(t, srv, doc)
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("Echo = %v, want DEADLINE_EXCEEDED", err)
		}
		stream, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Count: 1})
		if err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("ServerStream = %v, want DEADLINE_EXCEEDED", err)
		}
		if n := srv.Count(""); n != 0 {
			t.Errorf("server saw %d attempts, want 0", n)
		}
	})
}

// TestStreamWithoutPolicyChargesTheThrottleAsGRPCDoes pins the A6 throttle
// accounting of a server stream that never retries and fails with a
// pushback that says not to retry: as in grpc-go, a request that outgrew
// the replay buffer committed the stream as it was sent, so its failure is
// not charged; one within the bound is, and so is one whose only attempt
// has a timeout of its own (PerAttemptTimeout). The differential test found
// the first charged by us only; the last was charged by neither path.
func TestStreamWithoutPolicyChargesTheThrottleAsGRPCDoes(t *testing.T) {
	const limit = 100
	tests := []struct {
		name     string
		wire     int // the request's size on the wire
		callOpts []grpc.CallOption
		tokens   float64
	}{
		{"within the bound", limit, nil, 9},
		{"one byte over the bound: committed", limit + 1, nil, 10},
		{"five bytes over the bound: committed", limit + 5, nil, 10},
		{"per-attempt timeout, within the bound", limit, []grpc.CallOption{PerAttemptTimeout(time.Hour)}, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := &testserver.Server{}
			srv.SetScript(func(testserver.Attempt) testserver.Outcome {
				return testserver.Outcome{Err: status.Error(codes.Unavailable, "no"), Trailer: metadata.Pairs(pushbackKey, "-1")}
			})
			stub, c := newA6Echo(t, srv, a6Config(), WithStreamReplayBuffer(limit))
			req := &echov1.ServerStreamRequest{Count: 1}
			sizeTo(req, tt.wire, func(b []byte) { req.Message = string(b) })
			if got := proto.Size(req) + grpcMessagePrefix; got != tt.wire {
				t.Fatalf("request of %d bytes on the wire, want %d", got, tt.wire)
			}
			st, err := stub.ServerStream(t.Context(), req, tt.callOpts...)
			if err == nil {
				_, err = st.Recv()
			}
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("ServerStream = %v, want UNAVAILABLE", err)
			}
			if got := throttleTokens(t, c); got != tt.tokens {
				t.Errorf("throttle tokens = %v, want %v", got, tt.tokens)
			}
		})
	}
}
