package endpoint_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/endpoint"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// A connection to three backends, one of which fails every call: with the
// endpoint policy, each retry goes to a backend its call has not used, so
// every call succeeds with maxAttempts 2, and the failing backend is ejected
// after 5 failures in a row.
func Example() {
	client, err := interceptor.NewClient(interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{
		MaxAttempts: 2, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, BackoffMultiplier: 2,
	}))
	if err != nil {
		log.Fatal(err)
	}
	const config = `{"loadBalancingConfig": [{"resilience_endpoint": {
		"childPolicy": [{"round_robin": {}}],
		"consecutiveFailures": 5, "baseEjectionTime": "30s", "maxEjectionPercent": 50}}]}`
	cluster, stop, err := resiliencetest.ServeCluster(3, client.DialOptions(), resiliencetest.WithServiceConfig(config))
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	cluster.Backends[0].OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
		return resiliencetest.Step{Code: codes.Unavailable}
	})

	echo := cluster.EchoClient()
	ok := 0
	for range 60 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if _, err := echo.Echo(ctx, &echov1.EchoRequest{Message: "hi"}, grpc.WaitForReady(true)); err == nil {
			ok++
		}
		cancel()
	}
	retried := 0
	for _, a := range cluster.Backends[0].Attempts(resiliencetest.EchoMethod) {
		if a.Previous > 0 {
			retried++
		}
	}
	fmt.Printf("%d of 60 calls succeeded; retries sent to the failing backend: %d\n", ok, retried)
	for _, s := range endpoint.Snapshots(time.Now()) {
		if s.Target == cluster.Conn.Target() {
			fmt.Printf("ejections: %d; backend-0 ejected: %v\n", s.Ejections, !s.Endpoints[0].EjectedUntil.IsZero())
		}
	}
	// Output:
	// 60 of 60 calls succeeded; retries sent to the failing backend: 0
	// ejections: 1; backend-0 ejected: true
}
