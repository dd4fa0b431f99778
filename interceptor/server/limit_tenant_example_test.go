package server_test

import (
	"context"
	"fmt"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// principal is the context key an authentication interceptor (not shown)
// fills with the caller's verified identity.
type principal struct{}

// A concurrency limit shared fairly among tenants: Config.TenantFairness
// turns the fairness on, and Tenant names each call's tenant.
func ExampleTenantFunc() {
	srv, err := server.New(server.WithLimits(server.Limits{
		Config: serviceconfig.ServerConfig{
			ConcurrencyLimit: &serviceconfig.ConcurrencyLimit{InitialLimit: 4, MinLimit: 4, MaxLimit: 4},
			TenantFairness:   &serviceconfig.TenantFairness{MaxTenants: 100},
		},
		// The tenant is who the caller is, as authentication verified it:
		// not a value the caller chooses.
		Tenant: func(ctx context.Context) string {
			p, _ := ctx.Value(principal{}).(string)
			return p
		},
	}))
	if err != nil {
		log.Fatal(err)
	}
	icpt := srv.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/shop.Orders/Get"}
	as := func(p string) context.Context {
		return context.WithValue(metadata.NewIncomingContext(context.Background(), nil), principal{}, p)
	}
	// bob made a call a moment ago; alice floods. The limit is 4, so each
	// of the two has a fair share of 2: once alice holds 4 calls, twice her
	// share, her next is shed, while bob, under his share, is admitted.
	_, _ = icpt(as("bob"), nil, info, func(context.Context, any) (any, error) { return "ok", nil })
	var nested func(n int) error
	nested = func(n int) error {
		_, err := icpt(as("alice"), nil, info, func(ctx context.Context, _ any) (any, error) {
			if n > 1 {
				return "ok", nested(n - 1)
			}
			_, err := icpt(as("alice"), nil, info, func(context.Context, any) (any, error) { return "ok", nil })
			fmt.Println("alice's 5th:", status.Code(err))
			_, err = icpt(as("bob"), nil, info, func(context.Context, any) (any, error) { return "ok", nil })
			fmt.Println("bob's:", status.Code(err))
			return "ok", nil
		})
		return err
	}
	_ = nested(4)
	fmt.Println("tenants:", srv.LimitStatuses()[0].Tenants)
	// Output:
	// alice's 5th: ResourceExhausted
	// bob's: OK
	// tenants: 2
}
