package interceptor_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// flakyEcho fails the first two calls with UNAVAILABLE.
type flakyEcho struct {
	echov1.UnimplementedEchoServiceServer
	calls int
}

func (s *flakyEcho) Echo(_ context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	s.calls++
	if s.calls <= 2 {
		return nil, status.Error(codes.Unavailable, "warming up")
	}
	return &echov1.EchoResponse{Message: req.GetMessage()}, nil
}

// serve starts srv on an in-memory listener and returns a dialer for it and
// a function that stops it.
func serve(srv echov1.EchoServiceServer) (grpc.DialOption, func()) {
	lis := bufconn.Listen(1 << 16)
	gs := grpc.NewServer()
	echov1.RegisterEchoServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	dial := grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() })
	return dial, gs.Stop
}

// connect dials the in-memory server through c, as ExampleNewClient does.
func connect(c *interceptor.Client, dial grpc.DialOption) *grpc.ClientConn {
	opts := append(c.DialOptions(), dial, grpc.WithTransportCredentials(insecure.NewCredentials()))
	conn, err := grpc.NewClient("passthrough:///echo", opts...)
	if err != nil {
		panic(err)
	}
	return conn
}

func ExampleNewClient() {
	dial, stop := serve(&flakyEcho{})
	defer stop()

	c, err := interceptor.NewClient(
		interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{
			MaxAttempts:    4,
			InitialBackoff: 10 * time.Millisecond,
		}),
		interceptor.WithOnRetry(func(_ context.Context, e interceptor.RetryEvent) {
			fmt.Printf("attempt %d failed: %v\n", e.Attempt, status.Code(e.Err))
		}),
	)
	if err != nil {
		panic(err)
	}
	opts := append(c.DialOptions(), dial, grpc.WithTransportCredentials(insecure.NewCredentials()))
	conn, err := grpc.NewClient("passthrough:///echo", opts...)
	if err != nil {
		panic(err)
	}
	defer conn.Close()

	resp, err := echov1.NewEchoServiceClient(conn).Echo(context.Background(), &echov1.EchoRequest{Message: "hello"})
	fmt.Println(resp.GetMessage(), err)
	// Output:
	// attempt 1 failed: Unavailable
	// attempt 2 failed: Unavailable
	// hello <nil>
}

func ExampleRetryError() {
	dial, stop := serve(&flakyEcho{})
	defer stop()

	c, err := interceptor.NewClient(interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{
		MaxAttempts:    2,
		InitialBackoff: time.Millisecond,
	}))
	if err != nil {
		panic(err)
	}
	conn := connect(c, dial) // as ExampleNewClient connects
	defer conn.Close()

	_, err = echov1.NewEchoServiceClient(conn).Echo(context.Background(), &echov1.EchoRequest{})
	var re *interceptor.RetryError
	if errors.As(err, &re) {
		fmt.Printf("%v after %d attempts (%v)\n", status.Code(err), re.Attempts, re.Reason)
	}
	// Output:
	// Unavailable after 2 attempts (attempts exhausted)
}

func ExampleWithMethodConfig() {
	c, err := interceptor.NewClient(interceptor.WithMethodConfig(
		serviceconfig.MethodConfig{
			Name: []serviceconfig.Name{{Service: "shop.Orders"}},
			RetryPolicy: &serviceconfig.RetryPolicy{
				MaxAttempts:           3,
				InitialBackoff:        50 * time.Millisecond,
				MaxBackoff:            time.Second,
				BackoffMultiplier:     2,
				PerAttemptRecvTimeout: 500 * time.Millisecond,
				Jitter:                serviceconfig.JitterFull,
			},
		},
		serviceconfig.MethodConfig{
			// Creating an order twice is worse than failing: no retry.
			Name:    []serviceconfig.Name{{Service: "shop.Orders", Method: "Create"}},
			Timeout: 2 * time.Second,
		},
	))
	fmt.Println(c != nil, err)
	// Output: true <nil>
}

func ExampleNoRetry() {
	dial, stop := serve(&flakyEcho{})
	defer stop()

	c, err := interceptor.NewClient(interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{MaxAttempts: 5}))
	if err != nil {
		panic(err)
	}
	conn := connect(c, dial) // as ExampleNewClient connects
	defer conn.Close()

	// This one call runs once, whatever the policy says.
	_, err = echov1.NewEchoServiceClient(conn).Echo(context.Background(), &echov1.EchoRequest{}, interceptor.NoRetry())
	fmt.Println(status.Code(err))
	// Output: Unavailable
}

func ExampleWithServiceConfig() {
	// The document grpc-go takes, plus this module's blocks.
	cfg, err := serviceconfig.Parse([]byte(`{
	  "methodConfig": [{
	    "name": [{"service": "resilience.echo.v1.EchoService"}],
	    "timeout": "2s",
	    "retryPolicy": {
	      "maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
	      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
	    },
	    "circuitBreaker": {"consecutiveFailures": 5, "openDuration": "5s"}
	  }],
	  "retryBudget": {"ratio": 0.2}
	}`))
	if err != nil {
		panic(err)
	}
	dial, stop := serve(&flakyEcho{})
	defer stop()

	c, err := interceptor.NewClient(interceptor.WithServiceConfig(cfg))
	if err != nil {
		panic(err)
	}
	conn := connect(c, dial) // as ExampleNewClient connects
	defer conn.Close()

	resp, err := echov1.NewEchoServiceClient(conn).Echo(context.Background(), &echov1.EchoRequest{Message: "configured"})
	fmt.Println(resp.GetMessage(), err)
	fmt.Println(c.Status("/resilience.echo.v1.EchoService/Echo").Breaker.State)
	// Output:
	// configured <nil>
	// closed
}

// Operators can hold a method's breaker open (say, while its backend is
// being migrated), read its state, and hand it back to the breaker's rules.
func ExampleClient_ForceOpen() {
	c, err := interceptor.NewClient(interceptor.WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: "shop.Orders"}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5},
	}))
	if err != nil {
		panic(err)
	}
	const method = "/shop.Orders/Create"
	if err := c.ForceOpen(method); err != nil {
		panic(err)
	}
	fmt.Println(c.Status(method).Breaker.State)
	if err := c.ResetBreaker(method); err != nil {
		panic(err)
	}
	fmt.Println(c.Status(method).Breaker.State)
	fmt.Println(c.ForceOpen("/shop.Catalog/List"))
	// Output:
	// forced-open
	// closed
	// interceptor: ForceOpen(/shop.Catalog/List): no methodConfig entry applies to the method: it has no circuit breaker
}

// In a service that both serves and calls, WithOneLayerRetry on its client
// and server.New's interceptors on its server keep retries from multiplying:
// a call whose caller retries is not retried again downstream.
func ExampleWithOneLayerRetry() {
	c, err := interceptor.NewClient(
		interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{MaxAttempts: 3}),
		interceptor.WithOneLayerRetry(1), // inside such a call: 1 attempt, no retry
	)
	if err != nil {
		panic(err)
	}
	srv, err := server.New()
	if err != nil {
		panic(err)
	}
	_, _ = c, srv // c.DialOptions() on the outgoing connections, srv's interceptors on the grpc.Server

	// What server.New's interceptors put on a handler's context when the
	// incoming call carries the mark:
	ctx := wire.ContextWithCallerRetries(context.Background())
	fmt.Println(wire.CallerRetries(ctx), wire.CallerRetries(context.Background()))
	// Output: true false
}
