package interceptor

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/synctest"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

func TestServerStreamRetriesBeforeFirstMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(2, codes.Unavailable))
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(4)))
		stream, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Message: "m", Count: 3})
		if err != nil {
			t.Fatalf("ServerStream() error = %v", err)
		}
		var got []int32
		for {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("Recv() error = %v", err)
			}
			got = append(got, resp.GetIndex())
		}
		if fmt.Sprint(got) != "[0 1 2]" {
			t.Errorf("received indexes %v, want [0 1 2]", got)
		}
		var prev []int
		for _, a := range srv.Attempts() {
			prev = append(prev, a.Previous)
			if len(a.Messages) != 1 || a.Messages[0] != "m" {
				t.Errorf("attempt %d saw request messages %q, want [m]", a.N, a.Messages)
			}
		}
		if want := []int{-1, 1, 2}; !equalInts(prev, want) {
			t.Errorf("grpc-previous-rpc-attempts seen = %v, want %v", prev, want)
		}
	})
}

func TestServerStreamCommittedAfterFirstMessageIsNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			return testserver.Outcome{Err: status.Error(codes.Unavailable, "mid-stream"), After: 2}
		})
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(4)))
		stream, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Message: "m", Count: 5})
		if err != nil {
			t.Fatalf("ServerStream() error = %v", err)
		}
		n := 0
		for {
			_, err = stream.Recv()
			if err != nil {
				break
			}
			n++
		}
		if n != 2 {
			t.Errorf("received %d messages, want 2 (none twice)", n)
		}
		if status.Code(err) != codes.Unavailable {
			t.Errorf("Recv() error = %v, want the server's UNAVAILABLE unchanged", err)
		}
		if got := srv.Count("ServerStream"); got != 1 {
			t.Errorf("server saw %d attempts, want 1: a committed stream is never retried", got)
		}
	})
}

func TestClientStreamReplaysSentMessagesOnRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		// The first attempt fails after reading two of the three messages;
		// the second fails once all are read; the third succeeds.
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			switch a.N {
			case 1:
				return testserver.Outcome{Err: status.Error(codes.Unavailable, "after two"), After: 2}
			case 2:
				return testserver.Outcome{Err: status.Error(codes.Unavailable, "at the end")}
			}
			return testserver.Outcome{}
		})
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(4)))
		stream, err := stub.ClientStream(t.Context())
		if err != nil {
			t.Fatalf("ClientStream() error = %v", err)
		}
		for _, m := range []string{"a", "b", "c"} {
			if err := stream.Send(&echov1.ClientStreamRequest{Message: m}); err != nil {
				t.Fatalf("Send(%q) error = %v", m, err)
			}
		}
		resp, err := stream.CloseAndRecv()
		if err != nil {
			t.Fatalf("CloseAndRecv() error = %v", err)
		}
		if got := strings.Join(resp.GetMessages(), ","); got != "a,b,c" {
			t.Errorf("server answered %q, want a,b,c", got)
		}
		att := srv.Attempts()
		if len(att) != 3 {
			t.Fatalf("server saw %d attempts, want 3", len(att))
		}
		for i, want := range []string{"a,b", "a,b,c", "a,b,c"} {
			if got := strings.Join(att[i].Messages, ","); got != want {
				t.Errorf("attempt %d received %q, want %q", i+1, got, want)
			}
		}
	})
}

func TestBidiStreamReplaysUntilFirstResponse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(1, codes.Unavailable))
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(3)))
		stream, err := stub.BidiStream(t.Context())
		if err != nil {
			t.Fatalf("BidiStream() error = %v", err)
		}
		if err := stream.Send(&echov1.BidiStreamRequest{Message: "one"}); err != nil {
			t.Fatalf("Send(one) error = %v", err)
		}
		resp, err := stream.Recv()
		if err != nil || resp.GetMessage() != "one" {
			t.Fatalf("Recv() = %v, %v, want one", resp, err)
		}
		if err := stream.Send(&echov1.BidiStreamRequest{Message: "two"}); err != nil {
			t.Fatalf("Send(two) error = %v", err)
		}
		if resp, err := stream.Recv(); err != nil || resp.GetMessage() != "two" {
			t.Fatalf("Recv() = %v, %v, want two", resp, err)
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatalf("CloseSend() error = %v", err)
		}
		if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("Recv() after CloseSend = %v, want io.EOF", err)
		}
		att := srv.Attempts()
		if len(att) != 2 {
			t.Fatalf("server saw %d attempts, want 2", len(att))
		}
		if got := strings.Join(att[1].Messages, ","); got != "one,two" {
			t.Errorf("second attempt received %q, want one,two", got)
		}
	})
}
