package server_test

import (
	"context"
	"fmt"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Adding a concurrency limit: the server's calls under one adaptive limit,
// and a method with a limit of its own. serviceconfig.ParseServer reads the
// same Config from JSON.
func ExampleWithLimits() {
	srv, err := server.New(server.WithLimits(server.Limits{Config: serviceconfig.ServerConfig{
		// One limit for the server, learned by Vegas between 1 and 1000
		// calls in flight, starting at 20.
		ConcurrencyLimit: &serviceconfig.ConcurrencyLimit{},
		// Reports gets a small limit of its own.
		MethodConfig: []serviceconfig.ServerMethodConfig{{
			Name:             []serviceconfig.Name{{Service: "shop.Orders", Method: "Report"}},
			ConcurrencyLimit: &serviceconfig.ConcurrencyLimit{Algorithm: "aimd", InitialLimit: 1, MinLimit: 1, MaxLimit: 1},
		}},
	}}))
	if err != nil {
		log.Fatal(err)
	}
	_ = grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()))

	// While one report runs, a second one is shed at once, with a hint.
	icpt := srv.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/shop.Orders/Report"}
	_, _ = icpt(context.Background(), nil, info, func(ctx context.Context, _ any) (any, error) {
		_, err := icpt(ctx, nil, info, func(context.Context, any) (any, error) {
			fmt.Println("not reached")
			return nil, nil
		})
		st := status.Convert(err)
		fmt.Println(st.Code(), len(st.Details()), "detail (RetryInfo)")
		return nil, nil
	})
	for _, ls := range srv.LimitStatuses() {
		if ls.Name != "" {
			fmt.Printf("%s: limit %d, admitted %d, shed %d\n", ls.Name, ls.Limit, ls.Admitted[wire.Critical], ls.ShedLimit[wire.Critical])
		}
	}
	// Output:
	// ResourceExhausted 1 detail (RetryInfo)
	// /shop.Orders/Report: limit 1, admitted 1, shed 1
}

func ExampleCPUShedding() {
	srv, err := server.New(server.WithLimits(server.Limits{CPU: &server.CPUShedding{
		CPUThreshold: 0.8, // from 80% CPU, keep in flight ≤ max pass rate × min latency
		// CPU: nil reads the process's cgroup (Linux); a function here
		// drives it from another source.
	}}))
	if err != nil {
		log.Fatal(err)
	}
	_ = grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()))
	fmt.Println(srv.LimitStatuses()[0].Name)
	// Output:
	// (cpu)
}

// A server whose callers are not all trusted caps the criticality they
// claim: here every caller may lower its own, but only callers that an
// authentication interceptor marked as internal (standing in: the
// x-internal metadata) may claim CRITICAL_PLUS.
func ExampleCapCriticality() {
	capped := server.CapCriticality(wire.Critical)
	srv, err := server.New(server.WithLimits(server.Limits{
		Config: serviceconfig.ServerConfig{ConcurrencyLimit: &serviceconfig.ConcurrencyLimit{}},
		Criticality: func(ctx context.Context, sent wire.Criticality, ok bool) wire.Criticality {
			if len(metadata.ValueFromIncomingContext(ctx, "x-internal")) > 0 {
				return sent
			}
			return capped(ctx, sent, ok)
		},
	}))
	if err != nil {
		log.Fatal(err)
	}
	icpt := srv.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/shop.Orders/Get"}
	ok := func(context.Context, any) (any, error) { return nil, nil }
	for _, md := range []metadata.MD{
		metadata.Pairs(wire.CriticalityKey, "CRITICAL_PLUS"),                    // capped: CRITICAL
		metadata.Pairs(wire.CriticalityKey, "CRITICAL_PLUS", "x-internal", "1"), // trusted
		metadata.Pairs(wire.CriticalityKey, "SHEDDABLE"),                        // lowering is free
	} {
		_, _ = icpt(metadata.NewIncomingContext(context.Background(), md), nil, info, ok)
	}
	ls := srv.LimitStatuses()[0]
	for _, c := range []wire.Criticality{wire.CriticalPlus, wire.Critical, wire.Sheddable} {
		fmt.Println(c, ls.Admitted[c])
	}
	// Output:
	// CRITICAL_PLUS 1
	// CRITICAL 1
	// SHEDDABLE 1
}
