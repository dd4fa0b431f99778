package endpoint_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
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

// SetLogger sends the policy's events to a logger of your choice: here a
// text handler on standard output, without the time and the target (which
// vary from run to run).
func ExampleSetLogger() {
	endpoint.SetLogger(slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "target" {
				return slog.Attr{}
			}
			return a
		},
	})))
	defer endpoint.SetLogger(nil)

	cluster, stop, err := resiliencetest.ServeCluster(3, nil, resiliencetest.WithServiceConfig(
		`{"loadBalancingConfig": [{"resilience_endpoint": {"consecutiveFailures": 3, "baseEjectionTime": "30s"}}]}`))
	if err != nil {
		log.Fatal(err)
	}
	defer stop() // ServeCluster returned with every backend READY
	cluster.Backends[0].OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
		return resiliencetest.Step{Code: codes.Unavailable}
	})
	echo := cluster.EchoClient()
	for range 30 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, _ = echo.Echo(ctx, &echov1.EchoRequest{Message: "hi"}, grpc.WaitForReady(true))
		cancel()
	}
	// Output:
	// level=WARN msg="resilience_endpoint: endpoint ejected" endpoint=backend-0 cause=consecutive_failures ejections=1 duration=30s
}

// The peak_ewma child picks the cheaper of two random endpoints by their
// latency: a backend 500× slower than the others gets almost no call,
// with no retry, hedge or error involved. (It is measured by the calls it
// gets: its first, or one while the others' estimates are still unknown.)
// endpointConcurrency says how many calls a backend serves at once before
// they slow one another (each call in flight adds 1/endpointConcurrency of
// its latency to its cost), and decayTime how long a latency counts; the
// values here are the defaults.
func Example_peakEWMA() {
	cluster, stop, err := resiliencetest.ServeCluster(3, nil, resiliencetest.WithServiceConfig(
		`{"loadBalancingConfig": [{"resilience_endpoint": {"childPolicy": [{"peak_ewma": {"decayTime": "10s", "endpointConcurrency": 4}}]}}]}`))
	if err != nil {
		log.Fatal(err)
	}
	defer stop() // ServeCluster returned with every backend READY
	for i, b := range cluster.Backends {
		d := 2 * time.Millisecond
		if i == 1 {
			d = time.Second
		}
		b.OnCall(func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Delay: d} })
	}
	echo := cluster.EchoClient()
	for range 100 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if _, err := echo.Echo(ctx, &echov1.EchoRequest{Message: "hi"}, grpc.WaitForReady(true)); err != nil {
			log.Fatal(err)
		}
		cancel()
	}
	slow := len(cluster.Backends[1].Attempts(resiliencetest.EchoMethod))
	fmt.Println("the slow backend served fewer than 5 of 100 calls:", slow < 5)
	// Output:
	// the slow backend served fewer than 5 of 100 calls: true
}
