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
