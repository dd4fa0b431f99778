package resiliencetest_test

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

func TestScriptsAreConsumedPerMethodThenEcho(t *testing.T) {
	srv := resiliencetest.NewServer()
	srv.Script(resiliencetest.EchoMethod, resiliencetest.FailTimes(2, codes.Unavailable)...)
	srv.Script(resiliencetest.LookupMethod, resiliencetest.Step{Code: codes.NotFound, Trailer: metadata.Pairs("grpc-retry-pushback-ms", "5")})
	ec := echov1.NewEchoServiceClient(resiliencetest.Start(t, srv, nil))
	var got []codes.Code
	for range 3 {
		_, err := ec.Echo(t.Context(), &echov1.EchoRequest{Message: "m"})
		got = append(got, status.Code(err))
	}
	if want := []codes.Code{codes.Unavailable, codes.Unavailable, codes.OK}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Echo codes = %v, want %v", got, want)
	}
	var trailer metadata.MD
	_, err := ec.Lookup(t.Context(), &echov1.LookupRequest{}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.NotFound || fmt.Sprint(trailer.Get("grpc-retry-pushback-ms")) != "[5]" {
		t.Errorf("Lookup = %v with trailer %v, want NOT_FOUND with pushback 5", err, trailer)
	}
	resiliencetest.RequireAttempts(t, srv, resiliencetest.EchoMethod, 3)
	resiliencetest.RequirePreviousAttempts(t, srv, resiliencetest.EchoMethod, -1, -1, -1) // no retrying client
	if n := len(srv.Attempts("")); n != 4 {
		t.Errorf("Attempts(\"\") has %d attempts, want 4", n)
	}
}

func TestServerStreamFailsAfterMessages(t *testing.T) {
	srv := resiliencetest.NewServer()
	srv.Script(resiliencetest.ServerStreamMethod, resiliencetest.Step{Code: codes.Unavailable, After: 2})
	ec := echov1.NewEchoServiceClient(resiliencetest.Start(t, srv, nil))
	st, err := ec.ServerStream(t.Context(), &echov1.ServerStreamRequest{Count: 5})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		if _, err = st.Recv(); err != nil {
			break
		}
		n++
	}
	if n != 2 || status.Code(err) != codes.Unavailable {
		t.Errorf("ServerStream: %d responses then %v, want 2 then UNAVAILABLE", n, err)
	}
	st, err = ec.ServerStream(t.Context(), &echov1.ServerStreamRequest{Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	for n = 0; ; n++ {
		if _, err = st.Recv(); err != nil {
			break
		}
	}
	if n != 3 || err != io.EOF {
		t.Errorf("unscripted ServerStream: %d responses then %v, want 3 then EOF", n, err)
	}
}

func TestLatenciesRunOnTheBubblesClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := resiliencetest.NewServer()
		srv.Script(resiliencetest.EchoMethod, resiliencetest.Latencies(3*time.Second, time.Second)...)
		ec := echov1.NewEchoServiceClient(resiliencetest.Start(t, srv, nil))
		for _, want := range []time.Duration{3 * time.Second, time.Second, 0} {
			start := time.Now()
			if _, err := ec.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
				t.Fatal(err)
			}
			if got := time.Since(start); got != want {
				t.Errorf("Echo took %v, want %v", got, want)
			}
		}
	})
}

// fatalTB records Fatalf instead of stopping the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (*fatalTB) Helper()                             {}
func (f *fatalTB) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }

func TestAssertionsFail(t *testing.T) {
	srv := resiliencetest.NewServer()
	ec := echov1.NewEchoServiceClient(resiliencetest.Start(t, srv, nil))
	if _, err := ec.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
		t.Fatal(err)
	}
	var f fatalTB
	resiliencetest.RequireAttempts(&f, srv, resiliencetest.EchoMethod, 2)
	if want := "server saw 1 attempts of /resilience.echo.v1.EchoService/Echo, want 2"; f.msg != want {
		t.Errorf("RequireAttempts failed with %q, want %q", f.msg, want)
	}
	f.msg = ""
	resiliencetest.RequirePreviousAttempts(&f, srv, resiliencetest.EchoMethod, -1, 1)
	if want := "grpc-previous-rpc-attempts of /resilience.echo.v1.EchoService/Echo = [-1], want [-1 1]"; f.msg != want {
		t.Errorf("RequirePreviousAttempts failed with %q, want %q", f.msg, want)
	}
}

// TestAttemptsAbortedByAnInterceptorCount pins that a Server started by
// Start records the attempts a server interceptor ends before its handler
// (here faultinject aborting every other one): RequireAttempts counts what
// the client sent, and only the handled attempts take script steps.
// Before, the aborted attempt was invisible: RequireAttempts saw 2 of the
// client's 3 attempts.
func TestAttemptsAbortedByAnInterceptorCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := resiliencetest.NewServer()
		srv.Script(resiliencetest.EchoMethod, resiliencetest.Step{Code: codes.Unavailable})
		var aborted atomic.Int32
		abortEveryOther := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("grpc-previous-rpc-attempts")) == 0 {
				aborted.Add(1)
				return nil, status.Error(codes.Unavailable, "aborted before the handler")
			}
			return handler(ctx, req)
		}
		client, err := interceptor.NewClient(interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{
			MaxAttempts: 3, InitialBackoff: time.Second, RetryableStatusCodes: []codes.Code{codes.Unavailable},
		}))
		if err != nil {
			t.Fatal(err)
		}
		conn := resiliencetest.Start(t, srv, client.DialOptions(), grpc.ChainUnaryInterceptor(abortEveryOther))
		if _, err := echov1.NewEchoServiceClient(conn).Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatalf("Echo() = %v, want success on the third attempt", err)
		}
		resiliencetest.RequireAttempts(t, srv, resiliencetest.EchoMethod, 3)
		resiliencetest.RequirePreviousAttempts(t, srv, resiliencetest.EchoMethod, -1, 1, 2)
		var handled []bool
		for _, a := range srv.Attempts(resiliencetest.EchoMethod) {
			handled = append(handled, a.Handled)
		}
		if want := []bool{false, true, true}; !slices.Equal(handled, want) || aborted.Load() != 1 {
			t.Errorf("Handled = %v (aborted %d), want %v: the second attempt took the scripted failure", handled, aborted.Load(), want)
		}
	})
}

// TestAttemptsAbortedCountWithTheSingleInterceptorOptions pins that the
// attempts a server interceptor ends count however it is installed:
// grpc.UnaryInterceptor and grpc.StreamInterceptor run before every
// chained interceptor, so recording in a chained one missed what they
// aborted. Before: RequireAttempts saw 2 of the client's 3 unary attempts
// and 1 of the stream's 2; after, 3 and 2.
func TestAttemptsAbortedCountWithTheSingleInterceptorOptions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		first := func(ctx context.Context) bool {
			md, _ := metadata.FromIncomingContext(ctx)
			return len(md.Get("grpc-previous-rpc-attempts")) == 0
		}
		abortUnary := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if first(ctx) {
				return nil, status.Error(codes.Unavailable, "aborted before the handler")
			}
			return handler(ctx, req)
		}
		abortStream := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if first(ss.Context()) {
				return status.Error(codes.Unavailable, "aborted before the handler")
			}
			return handler(srv, ss)
		}
		srv := resiliencetest.NewServer()
		srv.Script(resiliencetest.EchoMethod, resiliencetest.Step{Code: codes.Unavailable})
		client, err := interceptor.NewClient(interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{
			MaxAttempts: 3, InitialBackoff: time.Second, RetryableStatusCodes: []codes.Code{codes.Unavailable},
		}))
		if err != nil {
			t.Fatal(err)
		}
		conn := resiliencetest.Start(t, srv, client.DialOptions(), grpc.UnaryInterceptor(abortUnary), grpc.StreamInterceptor(abortStream))
		stub := echov1.NewEchoServiceClient(conn)
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatalf("Echo() = %v, want success on the third attempt", err)
		}
		stream, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for err == nil {
			_, err = stream.Recv()
		}
		if err != io.EOF {
			t.Fatalf("ServerStream: %v, want success on the second attempt", err)
		}
		resiliencetest.RequireAttempts(t, srv, resiliencetest.EchoMethod, 3)
		resiliencetest.RequireAttempts(t, srv, resiliencetest.ServerStreamMethod, 2)
	})
}
