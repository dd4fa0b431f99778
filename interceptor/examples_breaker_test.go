package interceptor_test

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Adding a circuit breaker: a block of the method's config. After two
// failures in a row the breaker opens, and the next call fails at once,
// locally, without reaching the server; it lets a probe through after its
// open period.
func ExampleWithMethodConfig_circuitBreaker() {
	srv := &flakyEcho{} // fails its first two calls with UNAVAILABLE
	dial, stop := serve(srv)
	defer stop()

	c, err := interceptor.NewClient(interceptor.WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService"}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 2},
	}))
	if err != nil {
		panic(err)
	}
	conn := connect(c, dial) // as ExampleNewClient connects
	defer conn.Close()

	client := echov1.NewEchoServiceClient(conn)
	for range 3 {
		_, err := client.Echo(context.Background(), &echov1.EchoRequest{Message: "hi"})
		fmt.Println(status.Code(err), errors.Is(err, interceptor.ErrCircuitOpen))
	}
	fmt.Println("server calls:", srv.calls, "breaker:", c.Status("/resilience.echo.v1.EchoService/Echo").Breaker.State)
	// Output:
	// Unavailable false
	// Unavailable false
	// Unavailable true
	// server calls: 2 breaker: open
}
