package resiliencetest_test

import (
	"context"
	"fmt"
	"log"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/faultinject"
	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// A retry policy against a server that fails twice: the client makes three
// attempts and the server saw grpc-previous-rpc-attempts on the retries.
// In a test, check with RequireAttempts and RequirePreviousAttempts;
// TestRetryPolicyInSynctest below runs the same check on fake time.
func Example() {
	srv := resiliencetest.NewServer()
	srv.Script(resiliencetest.EchoMethod, resiliencetest.FailTimes(2, codes.Unavailable)...)
	client, err := interceptor.NewClient(interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{
		MaxAttempts:          4,
		InitialBackoff:       time.Millisecond,
		RetryableStatusCodes: []codes.Code{codes.Unavailable},
	}))
	if err != nil {
		log.Fatal(err)
	}
	// In a test: conn := resiliencetest.Start(t, srv, client.DialOptions())
	conn, stop, err := resiliencetest.Serve(srv, client.DialOptions())
	if err != nil {
		log.Fatal(err)
	}
	defer stop()

	resp, err := echov1.NewEchoServiceClient(conn).Echo(context.Background(), &echov1.EchoRequest{Message: "hi"})
	fmt.Println(resp.GetMessage(), err)
	for _, a := range srv.Attempts(resiliencetest.EchoMethod) {
		fmt.Println("attempt", a.N, "grpc-previous-rpc-attempts", a.Previous)
	}
	// Output:
	// hi <nil>
	// attempt 1 grpc-previous-rpc-attempts -1
	// attempt 2 grpc-previous-rpc-attempts 1
	// attempt 3 grpc-previous-rpc-attempts 2
}

// TestRetryPolicyInSynctest is the pattern to copy: a retry policy with
// 10 s and 20 s of backoff, tested inside testing/synctest over bufconn.
// The waits run on the bubble's fake clock, so the test takes microseconds
// to milliseconds of real time. (An Example function has no *testing.T, so
// synctest.Test cannot run in one; this test is the synctest example.)
func TestRetryPolicyInSynctest(t *testing.T) {
	realStart := time.Now()
	synctest.Test(t, func(t *testing.T) {
		srv := resiliencetest.NewServer()
		srv.Script(resiliencetest.EchoMethod, resiliencetest.FailTimes(2, codes.Unavailable)...)
		client, err := interceptor.NewClient(
			interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{
				MaxAttempts:          3,
				InitialBackoff:       10 * time.Second,
				MaxBackoff:           time.Minute,
				BackoffMultiplier:    2,
				RetryableStatusCodes: []codes.Code{codes.Unavailable},
				Jitter:               serviceconfig.JitterNone,
			}),
		)
		if err != nil {
			t.Fatal(err)
		}
		conn := resiliencetest.Start(t, srv, client.DialOptions())
		start := time.Now() // the bubble's clock
		_, err = echov1.NewEchoServiceClient(conn).Echo(t.Context(), &echov1.EchoRequest{Message: "hi"})
		if err != nil {
			t.Fatalf("Echo = %v, want success on the third attempt", err)
		}
		if got, want := time.Since(start), 30*time.Second; got != want {
			t.Errorf("fake time spent = %v, want %v (10 s + 20 s of backoff)", got, want)
		}
		resiliencetest.RequirePreviousAttempts(t, srv, resiliencetest.EchoMethod, -1, 1, 2)
	})
	t.Logf("30 s of backoff took %v of real time", time.Since(realStart))
}

// A server that answers slowly and then fails, per call.
func ExampleServer_OnCall() {
	srv := resiliencetest.NewServer()
	srv.OnCall(func(a resiliencetest.Attempt) resiliencetest.Step {
		if a.Method == resiliencetest.LookupMethod && a.N == 1 {
			return resiliencetest.Step{Code: codes.ResourceExhausted, Message: "slow down"}
		}
		return resiliencetest.Step{}
	})
	conn, stop, err := resiliencetest.Serve(srv, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	ec := echov1.NewEchoServiceClient(conn)
	for range 2 {
		_, err := ec.Lookup(context.Background(), &echov1.LookupRequest{Message: "x"})
		fmt.Println(status.Code(err))
	}
	// Output:
	// ResourceExhausted
	// OK
}

// With faultinject on the server: the Server records every attempt as it
// arrives, before the injector's interceptors, so the attempts the
// injector aborted count too (Handled false) and RequireAttempts counts
// what the client sent.
func Example_faultinject() {
	srv := resiliencetest.NewServer()
	inj, err := faultinject.New(faultinject.Config{Seed: 8, Faults: []faultinject.Fault{{
		Methods: []string{resiliencetest.EchoMethod},
		Abort:   &faultinject.Abort{Code: codes.Unavailable, Rate: 0.5},
	}}})
	if err != nil {
		log.Fatal(err)
	}
	client, err := interceptor.NewClient(interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{
		MaxAttempts:          4,
		InitialBackoff:       time.Millisecond,
		RetryableStatusCodes: []codes.Code{codes.Unavailable},
	}))
	if err != nil {
		log.Fatal(err)
	}
	// In a test: conn := resiliencetest.Start(t, srv, client.DialOptions(), <the same server options>)
	conn, stop, err := resiliencetest.Serve(srv, client.DialOptions(),
		grpc.ChainUnaryInterceptor(inj.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(inj.StreamServerInterceptor()))
	if err != nil {
		log.Fatal(err)
	}
	defer stop()

	_, err = echov1.NewEchoServiceClient(conn).Echo(context.Background(), &echov1.EchoRequest{Message: "hi"})
	fmt.Println("call:", status.Code(err))
	for _, a := range srv.Attempts(resiliencetest.EchoMethod) {
		fmt.Println("attempt", a.N, "reached the handler:", a.Handled)
	}
	fmt.Println("aborts injected:", inj.Counts().Aborts)
	// Output:
	// call: OK
	// attempt 1 reached the handler: false
	// attempt 2 reached the handler: false
	// attempt 3 reached the handler: true
	// aborts injected: 2
}

// A Server of your own service, here grpc's health service: the script
// fails the first two Checks before the handler, the client's retry
// policy makes the third attempt, and the Server recorded each attempt of
// the method with its grpc-previous-rpc-attempts and metadata. The same
// works for a hand-written service:
// NewServer(func(s *grpc.Server) { s.RegisterService(&desc, impl) }).
func ExampleNewServer_registeredService() {
	hs := health.NewServer()
	srv := resiliencetest.NewServer(func(s *grpc.Server) { healthgrpc.RegisterHealthServer(s, hs) })
	const check = "/grpc.health.v1.Health/Check"
	srv.Script(check, resiliencetest.FailTimes(2, codes.Unavailable)...)
	client, err := interceptor.NewClient(interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{
		MaxAttempts:          3,
		InitialBackoff:       time.Millisecond,
		RetryableStatusCodes: []codes.Code{codes.Unavailable},
	}))
	if err != nil {
		log.Fatal(err)
	}
	// In a test: conn := resiliencetest.Start(t, srv, client.DialOptions())
	conn, stop, err := resiliencetest.Serve(srv, client.DialOptions())
	if err != nil {
		log.Fatal(err)
	}
	defer stop()

	ctx := metadata.AppendToOutgoingContext(context.Background(), "caller", "checkout")
	resp, err := healthgrpc.NewHealthClient(conn).Check(ctx, &healthgrpc.HealthCheckRequest{})
	fmt.Println(resp.GetStatus(), err)
	for _, a := range srv.Attempts(check) {
		fmt.Println("attempt", a.N, "grpc-previous-rpc-attempts", a.Previous, "caller", a.MD.Get("caller"))
	}
	// Output:
	// SERVING <nil>
	// attempt 1 grpc-previous-rpc-attempts -1 caller [checkout]
	// attempt 2 grpc-previous-rpc-attempts 1 caller [checkout]
	// attempt 3 grpc-previous-rpc-attempts 2 caller [checkout]
}

// A cluster of your own service: three backends of the health service,
// each with an implementation of its own, behind round_robin. Backend 2
// reports NOT_SERVING, and backend 0 fails every Check by its script.
// ServeCluster returns once every backend is READY, so the first three
// Checks already reach the three backends.
func ExampleWithService() {
	servers := []*health.Server{health.NewServer(), health.NewServer(), health.NewServer()}
	servers[2].SetServingStatus("", healthgrpc.HealthCheckResponse_NOT_SERVING)
	cluster, stop, err := resiliencetest.ServeCluster(3, nil,
		resiliencetest.WithServiceConfig(`{"loadBalancingConfig": [{"round_robin": {}}]}`),
		resiliencetest.WithService(func(i int, s *grpc.Server) { healthgrpc.RegisterHealthServer(s, servers[i]) }))
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	cluster.Backends[0].OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
		return resiliencetest.Step{Code: codes.Unavailable, Message: "draining"}
	})

	hc := healthgrpc.NewHealthClient(cluster.Conn)
	answers := map[string]int{}
	for range 3 {
		resp, err := hc.Check(context.Background(), &healthgrpc.HealthCheckRequest{})
		answers[fmt.Sprint(status.Code(err), " ", resp.GetStatus())]++
	}
	fmt.Println(answers)
	fmt.Println("Checks per backend:", cluster.Counts("/grpc.health.v1.Health/Check"))
	// Output:
	// map[OK NOT_SERVING:1 OK SERVING:1 Unavailable UNKNOWN:1]
	// Checks per backend: [1 1 1]
}
