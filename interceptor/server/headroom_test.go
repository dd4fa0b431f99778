package server

import (
	"context"
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// serveEcho serves impl behind the interceptors of srv over bufconn until
// the test ends, and returns a connection to it dialed with opts.
func serveEcho(t *testing.T, impl echov1.EchoServiceServer, srv *Server, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	return serveEchoWith(t, impl, srv, nil, opts...)
}

// serveEchoWith is serveEcho with spy called on every unary call's context
// before srv's interceptor.
func serveEchoWith(t *testing.T, impl echov1.EchoServiceServer, srv *Server, spy func(context.Context), opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	var unary []grpc.UnaryServerInterceptor
	if spy != nil {
		unary = append(unary, func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			spy(ctx)
			return h(ctx, req)
		})
	}
	var sopts []grpc.ServerOption
	if srv != nil {
		unary = append(unary, srv.UnaryServerInterceptor())
		sopts = append(sopts, grpc.ChainStreamInterceptor(srv.StreamServerInterceptor()))
	}
	return testserver.StartWith(t, impl, append(sopts, grpc.ChainUnaryInterceptor(unary...)), opts...)
}

// deadlineEcho reports the time its handler's context has left, and whether
// the caller retries.
type deadlineEcho struct {
	echov1.UnimplementedEchoServiceServer
	left    chan time.Duration
	retries chan bool
}

func (d *deadlineEcho) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	dl, _ := ctx.Deadline()
	d.left <- time.Until(dl)
	d.retries <- wire.CallerRetries(ctx)
	return &echov1.EchoResponse{}, nil
}

func (d *deadlineEcho) ServerStream(req *echov1.ServerStreamRequest, ss grpc.ServerStreamingServer[echov1.ServerStreamResponse]) error {
	dl, _ := ss.Context().Deadline()
	d.left <- time.Until(dl)
	d.retries <- wire.CallerRetries(ss.Context())
	return nil
}

func TestServerHeadroomShortensTheHandlersDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		impl := &deadlineEcho{left: make(chan time.Duration, 1), retries: make(chan bool, 1)}
		srv, err := New(WithHeadroom(30*time.Millisecond, 20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		stub := echov1.NewEchoServiceClient(serveEcho(t, impl, srv))
		tests := []struct {
			name     string
			deadline time.Duration
			wantLeft time.Duration
			wantCode codes.Code
		}{
			{"headroom taken", 200 * time.Millisecond, 170 * time.Millisecond, codes.OK},
			{"the handler's floor exactly", 50 * time.Millisecond, 20 * time.Millisecond, codes.OK},
			{"below the handler's floor", 49 * time.Millisecond, 0, codes.DeadlineExceeded},
			{"no more than the headroom", 30 * time.Millisecond, 0, codes.DeadlineExceeded},
		}
		for _, tt := range tests {
			ctx, cancel := context.WithTimeout(t.Context(), tt.deadline)
			_, err := stub.Echo(ctx, &echov1.EchoRequest{})
			cancel()
			if status.Code(err) != tt.wantCode {
				t.Errorf("%s: Echo() error = %v, want %v", tt.name, err, tt.wantCode)
				continue
			}
			if tt.wantCode != codes.OK {
				continue
			}
			// The server's view of the deadline comes from grpc-timeout, which
			// is rounded to the microsecond or better.
			if left := <-impl.left; left < tt.wantLeft-time.Millisecond || left > tt.wantLeft {
				t.Errorf("%s: handler had %v left, want %v", tt.name, left, tt.wantLeft)
			}
			<-impl.retries
		}
		// Streams get the same deadline.
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		stream, err := stub.ServerStream(ctx, &echov1.ServerStreamRequest{})
		if err != nil {
			t.Fatal(err)
		}
		_, _ = stream.Recv()
		if left := <-impl.left; left > 170*time.Millisecond || left < 169*time.Millisecond {
			t.Errorf("stream handler had %v left, want 170ms", left)
		}
		<-impl.retries
	})
}

// TestServerHeadroomFloorIsTheHandlersLeastTime pins the floor as the
// least time a handler gets after the headroom, so that neither argument
// is ever dead. Before, a call was refused only below max(floor, headroom):
// with (20ms, 5ms), as README has it, the floor never mattered and a call
// arriving with 22ms left started with 2ms for its handler; with (10ms,
// 20ms) a call with 25ms left started with 15ms, under the 20ms floor.
func TestServerHeadroomFloorIsTheHandlersLeastTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tests := []struct {
			headroom, floor, deadline time.Duration
			wantCode                  codes.Code
		}{
			{20 * time.Millisecond, 5 * time.Millisecond, 22 * time.Millisecond, codes.DeadlineExceeded},
			{20 * time.Millisecond, 5 * time.Millisecond, 25 * time.Millisecond, codes.OK},
			{10 * time.Millisecond, 20 * time.Millisecond, 25 * time.Millisecond, codes.DeadlineExceeded},
			{10 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond, codes.OK},
			{0, 20 * time.Millisecond, 19 * time.Millisecond, codes.DeadlineExceeded},
			{20 * time.Millisecond, 0, 20 * time.Millisecond, codes.DeadlineExceeded},
			{20 * time.Millisecond, 0, 21 * time.Millisecond, codes.OK},
			{time.Duration(math.MaxInt64), time.Hour, time.Hour, codes.DeadlineExceeded}, // no overflow
		}
		for _, tt := range tests {
			impl := &deadlineEcho{left: make(chan time.Duration, 1), retries: make(chan bool, 1)}
			srv, err := New(WithHeadroom(tt.headroom, tt.floor))
			if err != nil {
				t.Fatal(err)
			}
			stub := echov1.NewEchoServiceClient(serveEcho(t, impl, srv))
			ctx, cancel := context.WithTimeout(t.Context(), tt.deadline)
			_, err = stub.Echo(ctx, &echov1.EchoRequest{})
			cancel()
			if status.Code(err) != tt.wantCode {
				t.Errorf("WithHeadroom(%v, %v), a call with %v left: %v, want %v", tt.headroom, tt.floor, tt.deadline, err, tt.wantCode)
			}
		}
	})
}

func TestServerRejectsBadHeadroom(t *testing.T) {
	if _, err := New(WithHeadroom(-time.Second, 0)); err == nil {
		t.Error("New(WithHeadroom(-1s, 0)) succeeded, want an error")
	}
}

// forwarder is service B of a chain A → B → C: its Echo calls C.
type forwarder struct {
	echov1.UnimplementedEchoServiceServer
	next echov1.EchoServiceClient
}

func (f *forwarder) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	return f.next.Echo(ctx, req)
}

// TestOneLayerRetryAcrossTwoHops sends calls A → B → C, each client retrying
// up to 3 attempts, against a C that always fails: with one-layer retry only
// A retries, so C sees 3 attempts per call instead of 9.
func TestOneLayerRetryAcrossTwoHops(t *testing.T) {
	for _, tt := range []struct {
		name  string
		opts  []interceptor.ClientOption
		wantC int
	}{
		{"plain retry multiplies", nil, 9},
		{"one layer", []interceptor.ClientOption{interceptor.WithOneLayerRetry(1)}, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				newClient := func() *interceptor.Client {
					return newTestClient(t, append([]interceptor.ClientOption{interceptor.WithRetryPolicy(fastPolicy(3)), interceptor.WithRetryBudget(nil)}, tt.opts...)...)
				}
				c := &testserver.Server{}
				c.SetScript(failFirst(1000, codes.Unavailable))
				toC := echov1.NewEchoServiceClient(testserver.Start(t, c, newClient().DialOptions()...))
				srvB, err := New()
				if err != nil {
					t.Fatal(err)
				}
				toB := echov1.NewEchoServiceClient(serveEcho(t, &forwarder{next: toC}, srvB, newClient().DialOptions()...))
				_, err = toB.Echo(t.Context(), &echov1.EchoRequest{})
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("A's call = %v, want C's UNAVAILABLE", err)
				}
				if got := c.Count("Echo"); got != tt.wantC {
					t.Errorf("C saw %d attempts for one call, want %d", got, tt.wantC)
				}
			})
		})
	}
}

// TestOverloadedServerStopsRetries: a handler that calls SetRetryPushback(-1)
// stops its caller's retries.
func TestOverloadedServerStopsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		impl := &overloaded{calls: &calls}
		c := newTestClient(t, interceptor.WithRetryPolicy(fastPolicy(5)))
		stub := echov1.NewEchoServiceClient(serveEcho(t, impl, nil, c.DialOptions()...))
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
		var re *interceptor.RetryError
		if !errors.As(err, &re) || re.Reason != interceptor.StopPushback || calls != 1 {
			t.Errorf("Echo() = %v after %d server calls, want one call stopped by pushback", err, calls)
		}
	})
}

type overloaded struct {
	echov1.UnimplementedEchoServiceServer
	calls *int
}

func (o *overloaded) Echo(ctx context.Context, _ *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	*o.calls++
	if err := SetRetryPushback(ctx, -1); err != nil {
		return nil, err
	}
	return nil, status.Error(codes.Unavailable, "overloaded: do not retry")
}
