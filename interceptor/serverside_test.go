package interceptor

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/server"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// The client tests below run against the server side through its public
// API (package server), as a user's client and server would meet.

// memoryIdemServer is a server.Server with idempotency on a fresh memory
// store and one scope for every caller.
func memoryIdemServer(tb testing.TB) *server.Server {
	tb.Helper()
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		tb.Fatal(err)
	}
	s, err := server.New(server.WithIdempotency(server.Idempotency{Store: store, Scope: server.SharedScope}))
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// serveEchoWith serves impl over bufconn behind srv's interceptors until the
// test ends, with spy called on every unary call's context before srv's
// interceptor, and returns a connection to it dialed with opts.
func serveEchoWith(t *testing.T, impl echov1.EchoServiceServer, srv *server.Server, spy func(context.Context), opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	var unary []grpc.UnaryServerInterceptor
	if spy != nil {
		unary = append(unary, func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			spy(ctx)
			return h(ctx, req)
		})
	}
	sopts := []grpc.ServerOption{}
	if srv != nil {
		unary = append(unary, srv.UnaryServerInterceptor())
		sopts = append(sopts, grpc.ChainStreamInterceptor(srv.StreamServerInterceptor()))
	}
	sopts = append(sopts, grpc.ChainUnaryInterceptor(unary...))
	gs := grpc.NewServer(sopts...)
	echov1.RegisterEchoServiceServer(gs, impl)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///bufnet", append([]grpc.DialOption{
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close(); gs.Stop(); <-done })
	return cc
}
