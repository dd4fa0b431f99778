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

// A call that the method's circuit breaker refuses never reaches the
// server: it fails fast with a *RejectedError, which status.Code,
// errors.Is and errors.As all understand.
func ExampleRejectedError() {
	srv := &flakyEcho{}
	dial, stop := serve(srv)
	defer stop()

	c, err := interceptor.NewClient(interceptor.WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService"}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5},
	}))
	if err != nil {
		panic(err)
	}
	conn := connect(c, dial) // as ExampleNewClient connects
	defer conn.Close()
	if err := c.ForceOpen("/resilience.echo.v1.EchoService/Echo"); err != nil {
		panic(err)
	}

	_, err = echov1.NewEchoServiceClient(conn).Echo(context.Background(), &echov1.EchoRequest{})
	var re *interceptor.RejectedError
	fmt.Println(status.Code(err), errors.Is(err, interceptor.ErrCircuitOpen), errors.As(err, &re))
	fmt.Println(re.FullMethod, "server calls:", srv.calls)
	// Output:
	// Unavailable true true
	// /resilience.echo.v1.EchoService/Echo server calls: 0
}
