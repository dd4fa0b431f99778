package interceptor

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// slowOrders executes Echo as an order with side effects: it counts
// executions, and takes 300ms whatever the caller does.
type slowOrders struct {
	echov1.UnimplementedEchoServiceServer
	mu   sync.Mutex
	runs int
	keys []string
}

func (s *slowOrders) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	s.mu.Lock()
	s.runs++
	s.mu.Unlock()
	time.Sleep(300 * time.Millisecond) // fake time: the order is placed, slowly
	return &echov1.EchoResponse{Message: "order " + req.GetMessage()}, nil
}

// keySpy records the idempotency key of every attempt that reaches the
// server, before the idempotency interceptor.
func (s *slowOrders) spy(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = append(s.keys, md.Get(wire.IdempotencyKeyHeader)...)
}

// TestKeyedRetryOfANonIdempotentCallExecutesOnce: an attempt of a call with
// side effects times out on the client while the server goes on; the retry
// carries the same key, waits for the first execution and gets its reply.
func TestKeyedRetryOfANonIdempotentCallExecutesOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := memoryIdemServer(t)
		p := fastPolicy(3)
		p.PerAttemptRecvTimeout = 200 * time.Millisecond
		c := newTestClient(t, WithRetryPolicy(p), WithIdempotencyKeys(echoMethod))
		orders := &slowOrders{}
		spy := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			orders.spy(ctx)
			return h(ctx, req)
		}
		cc := testserver.StartWith(t, orders, []grpc.ServerOption{grpc.ChainUnaryInterceptor(spy, srv.UnaryServerInterceptor())}, c.DialOptions()...)
		resp, err := echov1.NewEchoServiceClient(cc).Echo(t.Context(), &echov1.EchoRequest{Message: "42"})
		if err != nil || resp.GetMessage() != "order 42" {
			t.Fatalf("Echo() = %v, %v, want order 42", resp, err)
		}
		if orders.runs != 1 {
			t.Errorf("the order was placed %d times, want once", orders.runs)
		}
		if len(orders.keys) != 2 || orders.keys[0] != orders.keys[1] || len(orders.keys[0]) != 32 {
			t.Errorf("keys sent = %q, want the same 32-hex-digit key on both attempts", orders.keys)
		}
	})
}

func TestCallersOwnKeyAndBadKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(2)))
		ctx := ContextWithIdempotencyKey(t.Context(), "order-42")
		if _, err := stub.Echo(ctx, &echov1.EchoRequest{}); err != nil {
			t.Fatal(err)
		}
		if got := srv.Attempts()[0].MD.Get(wire.IdempotencyKeyHeader); len(got) != 1 || got[0] != "order-42" {
			t.Errorf("server saw keys %q, want [order-42]", got)
		}
		for _, bad := range []string{"", "naïve", string(make([]byte, 256))} {
			_, err := stub.Echo(ContextWithIdempotencyKey(t.Context(), bad), &echov1.EchoRequest{})
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("Echo() with key %q = %v, want INVALID_ARGUMENT before sending", bad, err)
			}
		}
		if got := srv.Count("Echo"); got != 1 {
			t.Errorf("server saw %d attempts, want 1: bad keys are refused locally", got)
		}
	})
}

func TestAutomaticKeysSkipIdempotentMethods(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(1, codes.Aborted))
		stub, _ := newEcho(t, srv, WithAutomaticIdempotencyKeys(), WithRetryPolicy(fastPolicy(3)))
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Errorf("Echo() = %v, want success: a keyed call retries ABORTED", err)
		}
		if _, err := stub.Lookup(t.Context(), &echov1.LookupRequest{}); err != nil {
			t.Errorf("Lookup() = %v, want success: NO_SIDE_EFFECTS retries ABORTED", err)
		}
		for _, a := range srv.Attempts() {
			keys := a.MD.Get(wire.IdempotencyKeyHeader)
			if a.Method == echoMethod && len(keys) != 1 || a.Method == lookupMethod && len(keys) != 0 {
				t.Errorf("%s attempt %d carried keys %q", a.Method, a.N, keys)
			}
		}
		var re *RetryError
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{}, NoRetry())
		if err != nil && !errors.As(err, &re) {
			t.Error(err)
		}
	})
}

func TestCallersOwnKeyOnAMethodWithoutPolicy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		stub, _ := newEcho(t, srv) // no policy: calls pass straight through
		ctx := ContextWithIdempotencyKey(t.Context(), "order-7")
		if _, err := stub.Echo(ctx, &echov1.EchoRequest{}); err != nil {
			t.Fatal(err)
		}
		stream, err := stub.ServerStream(ctx, &echov1.ServerStreamRequest{Count: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, _ = stream.Recv()
		for _, a := range srv.Attempts() {
			if got := a.MD.Get(wire.IdempotencyKeyHeader); len(got) != 1 || got[0] != "order-7" {
				t.Errorf("%s carried keys %q, want [order-7]", a.Method, got)
			}
		}
	})
}
