package faultinject_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/faultinject"
	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

func ExampleParse() {
	cfg, err := faultinject.Parse([]byte(`{"seed": 1, "faults": [{
		"methods": ["resilience.echo.v1.EchoService/Echo"],
		"abort": {"grpcStatus": "UNAVAILABLE", "pushback": "0.2s",
		          "percentage": {"numerator": 10, "denominator": "HUNDRED"}}}]}`))
	fmt.Println(cfg.Faults[0].Abort.Code, cfg.Faults[0].Abort.Rate, cfg.Faults[0].Abort.Pushback, err)

	_, err = faultinject.Parse([]byte(`{"faults": [{"abort": {"grpcStatus": "UNAVAILABLE",
		"percentage": {"numerator": 10, "denominator": "PERCENT"}}}]}`))
	fmt.Println(err)
	// Output:
	// Unavailable 0.1 200ms <nil>
	// faultinject: faults[0].abort.percentage: denominator "PERCENT": want HUNDRED, TEN_THOUSAND or MILLION
}

// Testing one's own retry policy: the server fails a third of the calls
// (seeded, so every run sees the same failures), and the client's policy of
// four attempts makes every call succeed.
func ExampleNew() {
	inj, err := faultinject.New(faultinject.Config{Seed: 3, Faults: []faultinject.Fault{{
		Methods: []string{"resilience.echo.v1.EchoService"},
		Abort:   &faultinject.Abort{Code: codes.Unavailable, Rate: 1.0 / 3},
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
	conn, stop, err := resiliencetest.Serve(resiliencetest.NewServer(), client.DialOptions(),
		grpc.ChainUnaryInterceptor(inj.UnaryServerInterceptor()))
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	ec := echov1.NewEchoServiceClient(conn)
	failed := 0
	for range 30 {
		if _, err := ec.Echo(context.Background(), &echov1.EchoRequest{Message: "x"}); status.Code(err) != codes.OK {
			failed++
		}
	}
	fmt.Println("calls failed:", failed, "faults injected:", inj.Counts().Aborts > 0)
	// Output: calls failed: 0 faults injected: true
}

// A test asks for a fault per call with metadata; the server must opt in.
func ExampleWithMetadataFaults() {
	inj, err := faultinject.New(faultinject.Config{}, faultinject.WithMetadataFaults())
	if err != nil {
		log.Fatal(err)
	}
	conn, stop, err := resiliencetest.Serve(resiliencetest.NewServer(), nil,
		grpc.ChainUnaryInterceptor(inj.UnaryServerInterceptor()))
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	ec := echov1.NewEchoServiceClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(),
		faultinject.MetadataAbort, "RESOURCE_EXHAUSTED", faultinject.MetadataPushbackMs, "250")
	var trailer metadata.MD
	_, err = ec.Echo(ctx, &echov1.EchoRequest{}, grpc.Trailer(&trailer))
	fmt.Println(status.Code(err), trailer.Get("grpc-retry-pushback-ms"))
	_, err = ec.Echo(context.Background(), &echov1.EchoRequest{})
	fmt.Println(status.Code(err))
	// Output:
	// ResourceExhausted [250]
	// OK
}
