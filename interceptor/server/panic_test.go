package server

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestIdempotencyHandlerPanicReleasesClaimAndRepanics pins, against every
// store, that a panic in the handler below the unary interceptor releases
// the claim (run settles it in a defer) and goes on with the same value: a
// duplicate that was waiting in process, and one that comes later, run the
// handler at once instead of waiting for the lease (30 s) to end.
func TestIdempotencyHandlerPanicReleasesClaimAndRepanics(t *testing.T) {
	forEachStore(t, []idemCase{{"PanicReleasesAndRepanics", testIdemPanicRepanics}})
}

// idemPanicValue is what the handler panics with.
type idemPanicValue struct{ msg string }

func testIdemPanicRepanics(t *testing.T, env *idemEnv) {
	s, err := New(WithIdempotency(Idempotency{Store: env.store, Scope: SharedScope}))
	if err != nil {
		t.Fatal(err)
	}
	unary := s.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: idemEchoMethod}
	req := &echov1.EchoRequest{Message: "m"}
	boom := &idemPanicValue{"boom"}
	entered, unblock := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	h := func(context.Context, any) (any, error) {
		if runs.Add(1) == 1 {
			close(entered)
			<-unblock
			panic(boom)
		}
		return &echov1.EchoResponse{Message: "second"}, nil
	}
	// The duplicates' deadline is well inside the lease: a claim left
	// behind by the panic would make them fail.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(wire.IdempotencyKeyHeader, "panics"))

	recovered := make(chan any, 1)
	go func() {
		defer func() { recovered <- recover() }()
		_, _ = unary(ctx, req, info, h)
	}()
	<-entered
	type result struct {
		resp any
		err  error
	}
	waiter := make(chan result, 1)
	go func() {
		resp, err := unary(ctx, req, info, h)
		waiter <- result{resp, err}
	}()
	if env.fake {
		synctest.Wait() // the duplicate waits for the first, in process
	}
	start := time.Now()
	close(unblock)
	if r := <-recovered; r != boom {
		t.Fatalf("recovered %v, want the handler's panic value %v", r, boom)
	}
	w := <-waiter
	if w.err != nil || w.resp.(*echov1.EchoResponse).GetMessage() != "second" {
		t.Fatalf("waiting duplicate = %v, %v; want it to run the handler", w.resp, w.err)
	}
	if env.fake && time.Since(start) != 0 {
		t.Errorf("waiting duplicate ran after %v of fake time, want at once", time.Since(start))
	}
	resp, err := unary(ctx, req, info, h)
	if err != nil || resp.(*echov1.EchoResponse).GetMessage() != "second" {
		t.Fatalf("later duplicate = %v, %v; want the replay of the second run", resp, err)
	}
	if got := runs.Load(); got != 2 {
		t.Errorf("handler ran %d times, want 2 (the panic, then once)", got)
	}
}

// TestStreamInterceptorPanicCancelsHeadroomContextAndRepanics pins that a
// panic in a stream handler below StreamServerInterceptor goes on with the
// same value, and that what the interceptor holds for the stream, the
// context with the headroom deadline and its timer, is released on the way
// (the stream path holds no idempotency claim: keys apply to unary calls).
func TestStreamInterceptorPanicCancelsHeadroomContextAndRepanics(t *testing.T) {
	s, err := New(WithHeadroom(10*time.Millisecond, 0))
	if err != nil {
		t.Fatal(err)
	}
	stream := s.StreamServerInterceptor()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	boom := &idemPanicValue{"stream boom"}
	var seen context.Context
	h := func(_ any, ss grpc.ServerStream) error {
		seen = ss.Context()
		panic(boom)
	}
	r := func() (r any) {
		defer func() { r = recover() }()
		_ = stream(nil, &srvStream{ctx: ctx}, &grpc.StreamServerInfo{FullMethod: "/p.S/Stream"}, h)
		return nil
	}()
	if r != boom {
		t.Fatalf("recovered %v, want the handler's panic value %v", r, boom)
	}
	if seen == nil || seen == ctx {
		t.Fatal("the handler did not get the interceptor's headroom context")
	}
	if seen.Err() == nil {
		t.Error("the headroom context is live after the panic, want it cancelled")
	}
	if ctx.Err() != nil {
		t.Errorf("the caller's context ended: %v", ctx.Err())
	}
}
