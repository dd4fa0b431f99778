package interceptor_test

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// The service config a resolver delivers drives the client when its
// resolver is wrapped. A manual resolver stands in for DNS TXT records or
// a control plane; with the dns resolver, write
// grpc.WithResolvers(c.WrapResolver(nil)).
func ExampleClient_WrapResolver() {
	dial, stop := serve(&flakyEcho{}) // fails twice, then answers
	defer stop()
	c, err := interceptor.NewClient(interceptor.WithOnRetry(func(_ context.Context, e interceptor.RetryEvent) {
		fmt.Printf("attempt %d failed: %v\n", e.Attempt, status.Code(e.Err))
	}))
	if err != nil {
		panic(err)
	}
	r := manual.NewBuilderWithScheme("platform")
	r.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: "echo"}}})
	opts := append(c.DialOptions(), dial, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithResolvers(c.WrapResolver(r)))
	conn, err := grpc.NewClient("platform:///echo", opts...)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	conn.Connect() // builds the resolver

	r.UpdateState(resolver.State{
		Addresses: []resolver.Address{{Addr: "echo"}},
		ServiceConfig: r.CC().ParseServiceConfig(`{"methodConfig": [{
			"name": [{"service": "resilience.echo.v1.EchoService"}],
			"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
			                "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := echov1.NewEchoServiceClient(conn).Echo(ctx, &echov1.EchoRequest{Message: "hello"})
	fmt.Println(resp.GetMessage(), status.Code(err) == codes.OK)
	// Output:
	// attempt 1 failed: Unavailable
	// attempt 2 failed: Unavailable
	// hello true
}
