package server_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// chargeService charges, taking its time; a keyed call's handler runs on
// after its caller gives up (Idempotency.DetachedMax).
type chargeService struct {
	echov1.UnimplementedEchoServiceServer
	started chan struct{}
	done    chan string
}

func (c *chargeService) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	c.started <- struct{}{}
	select {
	case <-time.After(200 * time.Millisecond): // the charge goes through
		c.done <- "charged " + req.GetMessage()
		return &echov1.EchoResponse{Message: "charged"}, nil
	case <-ctx.Done(): // Shutdown's context ended first
		c.done <- "cancelled"
		return nil, ctx.Err()
	}
}

// Stopping a server with keyed calls in flight: GracefulStop stops taking
// calls and waits for every handler, and the keyed handlers that run
// detached from their callers, which neither their callers nor
// grpc.Server.Stop can end, are drained by Server.Shutdown within its
// context, then cancelled. The shutdown of a process on SIGTERM, with a
// deadline of the orchestrator's grace period.
func ExampleServer_Shutdown() {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		log.Fatal(err)
	}
	srv, err := server.New(server.WithIdempotency(server.Idempotency{Store: store, Scope: server.SharedScope}))
	if err != nil {
		log.Fatal(err)
	}
	svc := &chargeService{started: make(chan struct{}, 1), done: make(chan string, 1)}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()))
	echov1.RegisterEchoServiceServer(gs, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()

	// A caller gives up once its charge has started; the charge goes on
	// on the server.
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), wire.IdempotencyKeyHeader, "order-42"))
	go func() { <-svc.started; cancel() }()
	_, err = echov1.NewEchoServiceClient(cc).Echo(ctx, &echov1.EchoRequest{Message: "order-42"})
	fmt.Println("caller gave up:", err != nil)

	// SIGTERM: stop taking calls, and give the keyed handlers 5s.
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		fmt.Println("shutdown:", err) // context.DeadlineExceeded: some were cancelled
	}
	<-stopped
	fmt.Println("handler:", <-svc.done)
	// Output:
	// caller gave up: true
	// handler: charged order-42
}
