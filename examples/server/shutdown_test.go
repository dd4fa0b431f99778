package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// stuckEcho's handler runs until its context ends.
type stuckEcho struct {
	echov1.UnimplementedEchoServiceServer
	started, ended chan struct{}
}

func (e *stuckEcho) Echo(ctx context.Context, _ *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	close(e.started)
	<-ctx.Done()
	close(e.ended)
	return nil, ctx.Err()
}

// TestStopGracefullyCutsKeyedHandlers: the example's stop cuts a keyed
// call's handler, which runs detached from its caller, at the shutdown
// timeout, as it cuts the plain calls. It called GracefulStop alone, which
// waits for every handler, and grpc.Server.Stop, which does not reach a
// detached one: the process outlived its timeout by up to DetachedMax
// (here an hour).
func TestStopGracefullyCutsKeyedHandlers(t *testing.T) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.WithIdempotency(server.Idempotency{Store: store, Scope: server.SharedScope, DetachedMax: time.Hour}))
	if err != nil {
		t.Fatal(err)
	}
	e := &stuckEcho{started: make(chan struct{}), ended: make(chan struct{})}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()))
	echov1.RegisterEchoServiceServer(gs, e)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), wire.IdempotencyKeyHeader, "k"))
	defer cancel()
	called := make(chan error, 1)
	go func() {
		_, err := echov1.NewEchoServiceClient(cc).Echo(ctx, &echov1.EchoRequest{Message: "m"})
		called <- err
	}()
	<-e.started
	cancel() // the caller gives up; the handler runs on
	<-called

	stopped := make(chan struct{})
	go func() {
		stopGracefully(gs, srv, 100*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(time.Minute):
		t.Fatal("the stop did not end within a minute of its 100ms timeout: the keyed handler was not cut")
	}
	select {
	case <-e.ended:
	default:
		t.Error("the stop returned with the keyed handler still running")
	}
	if err := <-served; err != nil {
		t.Errorf("Serve = %v", err)
	}
}
