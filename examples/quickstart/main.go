// Command quickstart is the README's quick start: a client whose calls are
// retried with backoff, as the server of examples/server fails a third of
// them. Run the server, then this:
//
//	go run ./examples/server -fail-rate 0.3 &
//	go run ./examples/quickstart
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

func main() {
	c, err := interceptor.NewClient(
		interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{
			MaxAttempts:    4, // attempts, the first call included
			InitialBackoff: 50 * time.Millisecond,
		}),
		interceptor.WithOnRetry(func(_ context.Context, e interceptor.RetryEvent) {
			fmt.Printf("  attempt %d: %v, retrying in %v\n", e.Attempt, status.Code(e.Err), e.Delay)
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	// DialOptions installs both interceptors and grpc.WithDisableRetry().
	conn, err := grpc.NewClient("127.0.0.1:50051",
		append(c.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	echo := echov1.NewEchoServiceClient(conn)
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := echo.Echo(ctx, &echov1.EchoRequest{Message: fmt.Sprint("hello ", i)})
		cancel()
		fmt.Printf("call %d: %q %v\n", i, resp.GetMessage(), err)
	}
}
