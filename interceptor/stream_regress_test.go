package interceptor

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

const (
	serverStreamMethod = "/resilience.echo.v1.EchoService/ServerStream"
	clientStreamMethod = "/resilience.echo.v1.EchoService/ClientStream"
	bidiStreamMethod   = "/resilience.echo.v1.EchoService/BidiStream"
)

// tripClientStream opens the ClientStream breaker of c: the server fails
// the first attempt, and the breaker opens at the first failure. It then
// waits out the open duration, so that the next stream is a probe.
func tripClientStream(t *testing.T, stub echov1.EchoServiceClient, c *Client) {
	t.Helper()
	stream, err := stub.ClientStream(t.Context())
	if err != nil {
		t.Fatalf("ClientStream() error = %v", err)
	}
	_ = stream.Send(&echov1.ClientStreamRequest{Message: "trip"})
	if _, err := stream.CloseAndRecv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("CloseAndRecv() error = %v, want UNAVAILABLE to trip the breaker", err)
	}
	if st := c.Status(clientStreamMethod).Breaker; st == nil || st.State != BreakerOpen {
		t.Fatalf("breaker after the failure = %+v, want open", st)
	}
	time.Sleep(time.Second) // fake time: the open duration
}

// clientStreamWorks fails t unless a ClientStream call succeeds on stub: a
// leaked slot or probe would have it rejected.
func clientStreamWorks(t *testing.T, stub echov1.EchoServiceClient) {
	t.Helper()
	stream, err := stub.ClientStream(t.Context())
	if err != nil {
		t.Fatalf("ClientStream() after the end = %v, want a stream", err)
	}
	if err := stream.Send(&echov1.ClientStreamRequest{Message: "after"}); err != nil {
		t.Fatalf("Send() after the end = %v", err)
	}
	if resp, err := stream.CloseAndRecv(); err != nil || strings.Join(resp.GetMessages(), ",") != "after" {
		t.Fatalf("CloseAndRecv() after the end = %v, %v, want [after]", resp, err)
	}
}

// failsFirst fails the first attempt of every method with UNAVAILABLE.
var failsFirst = failFirst(1, codes.Unavailable)

// Issue 9, item 5: grpc-go ends a stream on ClientConn.Close and on a
// non-EOF error from SendMsg or Header; the stream's bulkhead slot and
// breaker probe must be given back then, with no RecvMsg and no
// cancellation by the caller.
func TestStreamReleasesGuardsWhenGRPCEndsTheStream(t *testing.T) {
	tests := []struct {
		name   string
		retry  *serviceconfig.RetryPolicy
		trip   bool              // the stream under test is a half-open probe
		script testserver.Script // for the stream under test; nil: echo
		end    func(t *testing.T, ctx context.Context, stub echov1.EchoServiceClient, cc *grpc.ClientConn)
	}{
		{name: "SendMsg size error, probe", trip: true, end: endBySendSizeError},
		{name: "SendMsg size error, before commit", retry: fastPolicy(3), end: endBySendSizeError},
		{name: "ClientConn closed, probe", trip: true, end: endByClose},
		{name: "ClientConn closed, before commit", retry: fastPolicy(3), end: endByClose},
		{name: "Header error, probe", trip: true, end: endByHeaderError},
		{name: "Header error, before commit", retry: fastPolicy(3), end: endByHeaderError},
		{name: "Header of a failed stream, probe", trip: true, script: failFirst(100, codes.Unavailable), end: endByHeaderOfFailure},
		{name: "caller's context cancelled, probe", trip: true, end: endByCancel},
		{name: "caller's context cancelled, before commit", retry: fastPolicy(3), end: endByCancel},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(failsFirst)
				c := newTestClient(t, WithMethodConfig(guardedConfig(tt.retry, 1)))
				stub, cc := startWithFaults(t, srv, c)
				if tt.trip {
					tripClientStream(t, stub, c)
				}
				srv.SetScript(tt.script)
				tt.end(t, t.Context(), stub, cc)
				synctest.Wait()
				assertNothingHeld(t, c, clientStreamMethod, "after the stream ended")
				srv.SetScript(nil)
				stub2, _ := startWithFaults(t, srv, c)
				clientStreamWorks(t, stub2)
			})
		})
	}
}

// endBySendSizeError sends a message over the call's send limit: SendMsg
// fails RESOURCE_EXHAUSTED on the client.
func endBySendSizeError(t *testing.T, ctx context.Context, stub echov1.EchoServiceClient, _ *grpc.ClientConn) {
	stream, err := stub.ClientStream(ctx, grpc.MaxCallSendMsgSize(10))
	if err != nil {
		t.Fatalf("ClientStream() error = %v", err)
	}
	err = stream.Send(&echov1.ClientStreamRequest{Message: "big", Payload: make([]byte, 100)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Send(100 bytes) with a 10-byte limit = %v, want RESOURCE_EXHAUSTED", err)
	}
}

// endByClose closes the connection under a stream waiting for messages.
func endByClose(t *testing.T, ctx context.Context, stub echov1.EchoServiceClient, cc *grpc.ClientConn) {
	stream, err := stub.ClientStream(ctx)
	if err != nil {
		t.Fatalf("ClientStream() error = %v", err)
	}
	if err := stream.Send(&echov1.ClientStreamRequest{Message: "a"}); err != nil {
		t.Fatalf("Send() error = %v", err)
	}
	synctest.Wait() // the server has the message and waits for more
	if err := cc.Close(); err != nil {
		t.Fatalf("Close() error = %v", err)
	}
}

// endByHeaderError has the interceptor below fail Header.
func endByHeaderError(t *testing.T, ctx context.Context, stub echov1.EchoServiceClient, _ *grpc.ClientConn) {
	stream, err := stub.ClientStream(withFault(ctx, faultErrHeader))
	if err != nil {
		t.Fatalf("ClientStream() error = %v", err)
	}
	if _, err := stream.Header(); status.Code(err) != codes.Internal {
		t.Fatalf("Header() error = %v, want the injected INTERNAL", err)
	}
}

// endByHeaderOfFailure calls only Header on a stream whose server fails
// without headers: grpc's Header finishes the stream and returns nil, nil.
func endByHeaderOfFailure(t *testing.T, ctx context.Context, stub echov1.EchoServiceClient, _ *grpc.ClientConn) {
	stream, err := stub.ClientStream(ctx)
	if err != nil {
		t.Fatalf("ClientStream() error = %v", err)
	}
	_ = stream.Send(&echov1.ClientStreamRequest{Message: "a"})
	_ = stream.CloseSend()
	if md, err := stream.Header(); md != nil || err != nil {
		t.Fatalf("Header() = %v, %v, want nil, nil from a stream that failed", md, err)
	}
}

// endByCancel cancels the stream's context and makes no further call.
func endByCancel(t *testing.T, ctx context.Context, stub echov1.EchoServiceClient, _ *grpc.ClientConn) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := stub.ClientStream(ctx)
	if err != nil {
		t.Fatalf("ClientStream() error = %v", err)
	}
	if err := stream.Send(&echov1.ClientStreamRequest{Message: "a"}); err != nil {
		t.Fatalf("Send() error = %v", err)
	}
	synctest.Wait()
	cancel()
}

// Issue 9, item 6: a panic below the interceptor (a later interceptor, a
// codec, a stats handler), recovered above it by the caller, must not leak
// the stream's bulkhead slot or breaker probe.
func TestStreamReleasesGuardsOnPanicBelow(t *testing.T) {
	tests := []struct {
		fault string
		trip  bool // the stream under test is a half-open probe
	}{
		{fault: faultPanicStreamer, trip: true},
		{fault: faultPanicStreamerRetry},
		{fault: faultPanicSend, trip: true},
		{fault: faultPanicRecv, trip: true},
		{fault: faultPanicHeader, trip: true},
	}
	for _, tt := range tests {
		t.Run(tt.fault, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(failsFirst)
				failures := 100
				if tt.trip {
					failures = 1
				}
				c := newTestClient(t, WithMethodConfig(guardedConfig(fastPolicy(3), failures)))
				stub, _ := startWithFaults(t, srv, c)
				if tt.trip {
					tripClientStream(t, stub, c)
					srv.SetScript(nil)
				}
				p := recovered(func() {
					stream, err := stub.ClientStream(withFault(t.Context(), tt.fault))
					if err != nil {
						t.Errorf("ClientStream() error = %v", err)
						return
					}
					if tt.fault == faultPanicHeader {
						_, _ = stream.Header()
					}
					_ = stream.Send(&echov1.ClientStreamRequest{Message: "a"})
					_, _ = stream.CloseAndRecv()
				})
				if p != errInjected {
					t.Fatalf("the caller recovered %v, want the injected panic", p)
				}
				synctest.Wait()
				assertNothingHeld(t, c, clientStreamMethod, "after the panic")
				clientStreamWorks(t, stub)
			})
		})
	}
}

// Issue 9, item 7: after a stream failed before commit, RecvMsg returns the
// same error again, as grpc does, instead of panicking.
func TestStreamRecvAfterFailureReturnsTheSameError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(100, codes.Unavailable))
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(2)))
		stream, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Count: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, first := stream.Recv()
		if status.Code(first) != codes.Unavailable {
			t.Fatalf("Recv() error = %v, want UNAVAILABLE", first)
		}
		var again error
		if p := recovered(func() { _, again = stream.Recv() }); p != nil {
			t.Fatalf("second Recv() panicked: %v", p)
		}
		if again != first {
			t.Errorf("second Recv() = %v, want the first error again: %v", again, first)
		}
	})
}

// blockSecondSend makes SendMsg of the message "2" on a stream's first
// attempt wait until the attempt has ended: a send held by flow control on
// an attempt that fails meanwhile.
func blockSecondSend(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	return &blockingSend{ClientStream: cs, first: len(md.Get(previousAttemptsKey)) == 0}, nil
}

// blockingSend is the stream blockSecondSend returns.
type blockingSend struct {
	grpc.ClientStream
	first bool
}

// SendMsg holds "2" on the first attempt until the attempt has ended.
func (b *blockingSend) SendMsg(m any) error {
	if r, ok := m.(*echov1.BidiStreamRequest); ok && b.first && r.GetMessage() == "2" {
		<-b.Context().Done()
	}
	return b.ClientStream.SendMsg(m)
}

// Issue 9, item 8: a send that was blocked on a failing attempt, and that
// the retry replayed on the next, has succeeded: SendMsg returns nil, not
// io.EOF, and the caller goes on sending on a healthy stream.
func TestStreamSendReplayedOnRetryReturnsNil(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(1, codes.Unavailable)) // at the first message
		c := newTestClient(t, WithRetryPolicy(fastPolicy(3)))
		opts := append(c.DialOptions(), grpc.WithChainStreamInterceptor(blockSecondSend))
		stub := echov1.NewEchoServiceClient(testserver.Start(t, srv, opts...))
		stream, err := stub.BidiStream(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan []string, 1)
		go func() {
			var msgs []string
			for {
				resp, err := stream.Recv()
				if err != nil {
					if !errors.Is(err, io.EOF) {
						msgs = append(msgs, "error: "+err.Error())
					}
					got <- msgs
					return
				}
				msgs = append(msgs, resp.GetMessage())
			}
		}()
		for _, m := range []string{"1", "2", "3"} {
			if err := stream.Send(&echov1.BidiStreamRequest{Message: m}); err != nil {
				t.Fatalf("Send(%s) error = %v, want nil: the message was replayed", m, err)
			}
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if msgs := strings.Join(<-got, ","); msgs != "1,2,3" {
			t.Errorf("received %s, want 1,2,3", msgs)
		}
		if a := srv.Attempts(); len(a) != 2 || strings.Join(a[1].Messages, ",") != "1,2,3" {
			t.Errorf("server saw %+v, want a second attempt receiving 1,2,3", a)
		}
	})
}

// Issue 15: Header on a stream whose first attempt failed before its headers
// returns the headers of the attempt that answers, as grpc-go does.
func TestStreamHeaderReturnsTheHeadersOfTheAttemptThatAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.N == 1 {
				return testserver.Outcome{Err: status.Error(codes.Unavailable, "no headers")}
			}
			return testserver.Outcome{Header: metadata.Pairs("x-attempt", strconv.Itoa(a.N))}
		})
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(3)))
		stream, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Count: 2})
		if err != nil {
			t.Fatal(err)
		}
		md, err := stream.Header()
		if err != nil || strings.Join(md.Get("x-attempt"), ",") != "2" {
			t.Fatalf("Header() = %v, %v, want x-attempt: 2", md, err)
		}
		n := 0
		for {
			_, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("Recv() error = %v", err)
			}
			n++
		}
		if n != 2 || srv.Count("ServerStream") != 2 {
			t.Errorf("got %d messages over %d attempts, want 2 over 2", n, srv.Count("ServerStream"))
		}
	})
}

// Issue 15: a send that outgrows the replay buffer after the current
// attempt has already failed, before the receiver learnt it, is still
// retried: the failure came before the commit, as in grpc-go.
func TestStreamSendOverflowingAfterAFailedAttemptIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.N == 1 {
				return testserver.Outcome{Err: status.Error(codes.Unavailable, "after one"), After: 1}
			}
			return testserver.Outcome{}
		})
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(3)), WithStreamReplayBuffer(1000))
		stream, err := stub.ClientStream(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		payload := make([]byte, 400)
		for i, m := range []string{"a", "b", "c"} { // c outgrows 1000 bytes
			if err := stream.Send(&echov1.ClientStreamRequest{Message: m, Payload: payload}); err != nil {
				t.Fatalf("Send(%q) error = %v", m, err)
			}
			if i == 0 {
				synctest.Wait() // the first attempt has failed, and the client knows it
			}
		}
		resp, err := stream.CloseAndRecv()
		if err != nil || strings.Join(resp.GetMessages(), "") != "abc" {
			t.Fatalf("CloseAndRecv() = %v, %v, want abc", resp, err)
		}
		if a := srv.Attempts(); len(a) != 2 || strings.Join(a[1].Messages, "") != "abc" {
			t.Errorf("server saw %+v, want a second attempt receiving abc", a)
		}
	})
}

// The replay bound counts each message as grpc-go does: its encoded size
// plus the 5-byte message prefix (proto.Size(m) + 5).
func TestStreamReplayBoundCountsMessagePrefix(t *testing.T) {
	msgs := []*echov1.ClientStreamRequest{
		{Message: "a", Payload: make([]byte, 100)},
		{Message: "b", Payload: make([]byte, 100)},
	}
	total := 0
	for _, m := range msgs {
		total += proto.Size(m) + 5
	}
	tests := []struct {
		name     string
		bound    int
		attempts int
	}{
		{name: "both fit exactly", bound: total, attempts: 2},
		{name: "one byte short", bound: total - 1, attempts: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(failsFirst)
				stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(3)), WithStreamReplayBuffer(tt.bound))
				stream, err := stub.ClientStream(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range msgs {
					if err := stream.Send(m); err != nil {
						t.Fatalf("Send(%q) error = %v", m.GetMessage(), err)
					}
				}
				_, err = stream.CloseAndRecv()
				if got := srv.Count("ClientStream"); got != tt.attempts {
					t.Errorf("bound %d for %d bytes: server saw %d attempts (last error %v), want %d",
						tt.bound, total, got, err, tt.attempts)
				}
			})
		})
	}
}

// Issue 9, item 12: an idempotency key does not widen the codes a stream
// retries: a keyed stream is not retried on ABORTED under the default rules.
func TestKeyedStreamDoesNotRetryAborted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(1, codes.Aborted))
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(3)))
		ctx := ContextWithIdempotencyKey(t.Context(), "key-1")
		stream, err := stub.ServerStream(ctx, &echov1.ServerStreamRequest{Count: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); status.Code(err) != codes.Aborted {
			t.Errorf("Recv() error = %v, want ABORTED, not retried", err)
		}
		if got := srv.Count("ServerStream"); got != 1 {
			t.Errorf("server saw %d attempts, want 1", got)
		}
		if md := srv.Attempts()[0].MD.Get(wire.IdempotencyKeyHeader); len(md) != 1 || md[0] != "key-1" {
			t.Errorf("server saw idempotency keys %q, want [key-1]", md)
		}
	})
}

// TestWireSizeCountsWhatTheCallsCodecSends pins the replay buffer's one
// rule (wireSizer): a message counts its encoding by the call's codec plus
// gRPC's 5-byte prefix, proto.Size for a proto message under the default
// codec, and limit + 1, past the bound, when no codec can encode it.
func TestWireSizeCountsWhatTheCallsCodecSends(t *testing.T) {
	m := &echov1.ClientStreamRequest{Message: "abc", Payload: make([]byte, 10)}
	raw := &rawMessage{b: make([]byte, 40)}
	tests := []struct {
		name  string
		sizer wireSizer
		m     any
		want  int
	}{
		{"proto", wireSizer{}, m, proto.Size(m) + 5},
		{"empty proto", wireSizer{}, &echov1.ClientStreamRequest{}, 5},
		{"proto, subtype proto", wireSizer{subtype: "proto"}, m, proto.Size(m) + 5},
		{"not proto, default codec", wireSizer{}, "raw", 1001},
		{"not proto, subtype's codec", wireSizer{subtype: rawCodecName}, raw, 45},
		{"not proto, forced codec", wireSizer{forced: rawCodec{}}, raw, 45},
		{"proto, forced codec", wireSizer{forced: rawCodec{}}, m, proto.Size(m) + 5},
		{"proto, forced v2 codec", wireSizer{forced: encoding.GetCodecV2("proto")}, m, proto.Size(m) + 5},
		{"unknown subtype", wireSizer{subtype: "no-such-codec"}, raw, 1001},
	}
	for _, tt := range tests {
		if got := tt.sizer.size(tt.m, 1000); got != tt.want {
			t.Errorf("%s: size(%T, 1000) = %d, want %d", tt.name, tt.m, got, tt.want)
		}
	}
}

// Found by TestStreamStress: when a send finds the attempt ended, the
// stream learns its status with a receive, which is safe only when Header
// shows that no headers, so no message, came. A Header that fails says
// nothing of them, and the receive swallowed a response the caller should
// have read: now a failing Header ends the stream, as grpc documents, and a
// response the server sent is either read by the caller or the stream ends
// with Header's error.
func TestStreamSendOnEndedAttemptNeverSwallowsAResponse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		p := fastPolicy(3)
		p.PerAttemptRecvTimeout = 100 * time.Millisecond
		c := newTestClient(t, WithRetryPolicy(p))
		stub, _ := startWithFaults(t, srv, c)
		stream, err := stub.BidiStream(withFault(t.Context(), faultErrHeader))
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&echov1.BidiStreamRequest{Message: "0"}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()                    // the response to 0 waits in the client, unread
		time.Sleep(200 * time.Millisecond) // fake time: the attempt times out, uncommitted
		_ = stream.Send(&echov1.BidiStreamRequest{Message: "1"})
		resp, err := stream.Recv()
		if err == nil && resp.GetMessage() == "0" {
			return
		}
		if st := status.Convert(err); st.Code() != codes.Internal || st.Message() != "injected header error" {
			t.Errorf("Recv() = %v, %v: want the response to 0, or the stream ended by Header's error", resp, err)
		}
	})
}

// Issue 15, an intended difference from grpc-go: the stream's Context does
// not commit it (gRFC A6 commits on headers, a message or the replay bound).
func TestStreamContextDoesNotCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failsFirst)
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(3)))
		stream, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Count: 1})
		if err != nil {
			t.Fatal(err)
		}
		_ = stream.Context()
		if _, err := stream.Recv(); err != nil {
			t.Fatalf("Recv() after Context() = %v, want the retried attempt's message", err)
		}
		if got := srv.Count("ServerStream"); got != 2 {
			t.Errorf("server saw %d attempts, want 2", got)
		}
	})
}
