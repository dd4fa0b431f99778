package interceptor_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

func ExampleNewServer() {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		log.Fatal(err)
	}
	srv, err := interceptor.NewServer(
		interceptor.WithIdempotencyStore(store),
		interceptor.WithIdempotencyTTL(time.Hour),
		// Methods of shop.Orders must carry a key; Lookup-style methods
		// without side effects could use IdempotencyKeyIgnored.
		interceptor.WithIdempotencyKeyPolicy("shop.Orders", interceptor.IdempotencyKeyRequired),
	)
	if err != nil {
		log.Fatal(err)
	}
	// Install it with grpc.ChainUnaryInterceptor(recovery, auth,
	// srv.UnaryServerInterceptor()). Here it is called directly.
	unary := srv.UnaryServerInterceptor()
	runs := 0
	handler := func(_ context.Context, req any) (any, error) {
		runs++
		return &echov1.EchoResponse{Message: fmt.Sprintf("order #%d for %s", runs, req.(*echov1.EchoRequest).Message)}, nil
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/resilience.echo.v1.EchoService/Echo"}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", "c0ffee-1"))
	for attempt := 1; attempt <= 3; attempt++ {
		resp, err := unary(ctx, &echov1.EchoRequest{Message: "alice"}, info, handler)
		fmt.Println(attempt, resp.(*echov1.EchoResponse).GetMessage(), err)
	}
	fmt.Println("handler runs:", runs)
	// Output:
	// 1 order #1 for alice <nil>
	// 2 order #1 for alice <nil>
	// 3 order #1 for alice <nil>
	// handler runs: 1
}
