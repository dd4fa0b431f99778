package interceptor

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

func TestStreamPastReplayBufferCommits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(1, codes.Unavailable))
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(3)), WithStreamReplayBuffer(1000))
		stream, err := stub.ClientStream(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		payload := make([]byte, 400)
		for _, m := range []string{"a", "b", "c"} { // the third outgrows 1000 bytes
			if err := stream.Send(&echov1.ClientStreamRequest{Message: m, Payload: payload}); err != nil {
				t.Fatalf("Send(%q) error = %v", m, err)
			}
		}
		_, err = stream.CloseAndRecv()
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("CloseAndRecv() error = %v, want the first attempt's UNAVAILABLE", err)
		}
		if got := srv.Count("ClientStream"); got != 1 {
			t.Errorf("server saw %d attempts, want 1: past its buffer a stream commits", got)
		}
	})
}

func TestStreamWithinReplayBufferIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(1, codes.Unavailable))
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(3)), WithStreamReplayBuffer(2000))
		stream, err := stub.ClientStream(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		payload := make([]byte, 400)
		for _, m := range []string{"a", "b", "c"} {
			if err := stream.Send(&echov1.ClientStreamRequest{Message: m, Payload: payload}); err != nil {
				t.Fatalf("Send(%q) error = %v", m, err)
			}
		}
		resp, err := stream.CloseAndRecv()
		if err != nil || strings.Join(resp.GetMessages(), "") != "abc" {
			t.Fatalf("CloseAndRecv() = %v, %v, want abc", resp, err)
		}
	})
}

func TestStreamHeadersCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			return testserver.Outcome{Header: metadata.Pairs("x-served-by", "a"), Err: status.Error(codes.Unavailable, "after headers")}
		})
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(3)))
		stream, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Count: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, err = stream.Recv()
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("Recv() error = %v, want UNAVAILABLE", err)
		}
		if got := srv.Count("ServerStream"); got != 1 {
			t.Errorf("server saw %d attempts, want 1: headers commit a stream", got)
		}
		var re *RetryError
		if !errors.As(err, &re) || re.Reason != StopCommitted {
			t.Errorf("Recv() error = %#v, want reason committed", err)
		}
	})
}

func TestStreamPerAttemptTimeoutRetriesUntilCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(stallFirst())
		p := fastPolicy(3)
		p.PerAttemptRecvTimeout = 100 * time.Millisecond
		stub, _ := newEcho(t, srv, WithRetryPolicy(p))
		stream, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Count: 2})
		if err != nil {
			t.Fatal(err)
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
			time.Sleep(time.Second) // fake time: a committed stream has no attempt timeout
		}
		if n != 2 || srv.Count("ServerStream") != 2 {
			t.Errorf("got %d messages over %d attempts, want 2 over 2", n, srv.Count("ServerStream"))
		}
	})
}

// failingStreamer fails the first n stream creations with UNAVAILABLE, as a
// connection that is not ready does.
func failingStreamer(n int) grpc.StreamClientInterceptor {
	var mu sync.Mutex
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		mu.Lock()
		n--
		fail := n >= 0
		mu.Unlock()
		if fail {
			return nil, status.Error(codes.Unavailable, "no connection")
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
}

func TestStreamCreationFailuresAreRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		c := newTestClient(t, WithRetryPolicy(fastPolicy(4)))
		cc := testserver.Start(t, srv, grpc.WithChainStreamInterceptor(c.StreamClientInterceptor(), failingStreamer(2)))
		stub := echov1.NewEchoServiceClient(cc)
		stream, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Count: 1})
		if err != nil {
			t.Fatalf("ServerStream() error = %v", err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatalf("Recv() error = %v", err)
		}
		a := srv.Attempts()
		if len(a) != 1 || a[0].Previous != 2 {
			t.Errorf("server saw %+v, want one attempt with grpc-previous-rpc-attempts 2", a)
		}
	})
}

func TestBidiConcurrentSendAndRecvAcrossRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		// The first two attempts fail a moment after their first message,
		// while the client goes on sending into them.
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.N <= 2 {
				return testserver.Outcome{Delay: time.Millisecond, Err: status.Error(codes.Unavailable, "x")}
			}
			return testserver.Outcome{}
		})
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(4)))
		stream, err := stub.BidiStream(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		done := make(chan error, 1)
		go func() {
			for {
				resp, err := stream.Recv()
				if err != nil {
					if errors.Is(err, io.EOF) {
						err = nil
					}
					done <- err
					return
				}
				got = append(got, resp.GetMessage())
			}
		}()
		for _, m := range []string{"1", "2", "3", "4", "5"} {
			if err := stream.Send(&echov1.BidiStreamRequest{Message: m}); err != nil {
				t.Fatalf("Send(%s) error = %v", m, err)
			}
			time.Sleep(time.Millisecond / 2) // fake time: spread the sends over the failures
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("Recv() error = %v", err)
		}
		if strings.Join(got, "") != "12345" {
			t.Errorf("responses %q, want 12345, each once and in order", got)
		}
		a := srv.Attempts()
		if len(a) != 3 || strings.Join(a[2].Messages, "") != "12345" {
			t.Errorf("server saw %d attempts, the last receiving %q; want 3, the last receiving 12345", len(a), a[len(a)-1].Messages)
		}
	})
}
