package interceptor_test

import (
	"context"
	"fmt"
	"time"

	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// slowEcho answers after a fixed delay.
type slowEcho struct {
	echov1.UnimplementedEchoServiceServer
	took time.Duration
}

func (s *slowEcho) Echo(_ context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	time.Sleep(s.took)
	return &echov1.EchoResponse{Message: req.GetMessage()}, nil
}

// A hedging policy with hedgingDelayQuantile needs no hand-tuned delay: the
// client hedges at the latency it observes, here the p90 of the method's
// recent attempts (rounded up to its histogram bucket), once it has seen
// hedgingDelayMinSamples of them. Until then it waits hedgingDelay.
func ExampleClient_HedgingDelay() {
	cfg, err := serviceconfig.Parse([]byte(`{
	  "methodConfig": [{
	    "name": [{"service": "resilience.echo.v1.EchoService"}],
	    "hedgingPolicy": {
	      "maxAttempts": 2,
	      "hedgingDelay": "0.1s",
	      "hedgingDelayQuantile": 0.9,
	      "hedgingDelayFloor": "0.005s",
	      "hedgingDelayMinSamples": 20
	    }
	  }]
	}`))
	if err != nil {
		panic(err)
	}
	dial, stop := serve(&slowEcho{took: 34 * time.Millisecond})
	defer stop()
	c, err := interceptor.NewClient(interceptor.WithServiceConfig(cfg))
	if err != nil {
		panic(err)
	}
	conn := connect(c, dial) // as ExampleNewClient connects
	defer conn.Close()

	const method = "/resilience.echo.v1.EchoService/Echo"
	fmt.Println(c.HedgingDelay(method))
	for range 20 {
		if _, err := echov1.NewEchoServiceClient(conn).Echo(context.Background(), &echov1.EchoRequest{}); err != nil {
			panic(err)
		}
	}
	// Attempts of 34ms and a little more fall in the bucket [33.55ms,
	// 37.75ms): the delay is its upper edge, 37.75ms on a quiet machine. A
	// loaded one answers some calls later, so the example prints a range.
	d, ok := c.HedgingDelay(method)
	fmt.Println(d >= 34*time.Millisecond && d < 100*time.Millisecond, ok)
	// Output:
	// 100ms true
	// true true
}
