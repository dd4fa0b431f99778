package server_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/ratelimit/redisquota"
	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// A per-tenant rate limit: each tenant (named by the x-tenant metadata,
// which an authenticating proxy sets) may make 2 calls at once and then
// one an hour. The third call of a tenant is refused with
// RESOURCE_EXHAUSTED, a QuotaFailure naming the limit and a RetryInfo
// with the exact time until it would be admitted; another tenant has its
// own quota. The JSON form of this Config:
//
//	{"rateLimits": [{"name": "per-tenant", "rate": 1, "per": "3600s", "burst": 2, "key": "tenant"}],
//	 "tenantFairness": {"metadataKey": "x-tenant"}}
func ExampleLimits_rateLimit() {
	srv, err := server.New(server.WithLimits(server.Limits{Config: serviceconfig.ServerConfig{
		RateLimits: []serviceconfig.RateLimit{
			{Name: "per-tenant", Rate: 1, Per: time.Hour, Burst: 2, Key: serviceconfig.KeyTenant},
		},
		TenantFairness: &serviceconfig.TenantFairness{MetadataKey: "x-tenant"},
	}}))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	// grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()),
	//	grpc.ChainStreamInterceptor(srv.StreamServerInterceptor())); here
	// the interceptor is called directly, as grpc would.
	icpt := srv.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/shop.Orders/Create"}
	handler := func(context.Context, any) (any, error) { return "created", nil }
	call := func(tenant string) {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-tenant", tenant))
		if _, err := icpt(ctx, nil, info, handler); err != nil {
			st := status.Convert(err)
			var limit string
			var wait time.Duration
			for _, d := range st.Details() {
				switch d := d.(type) {
				case *errdetails.QuotaFailure:
					limit = d.GetViolations()[0].GetSubject()
				case *errdetails.RetryInfo:
					wait = d.GetRetryDelay().AsDuration()
				}
			}
			fmt.Printf("%s: %v, over %s, retry in %v\n", tenant, st.Code(), limit, wait.Round(time.Minute))
			return
		}
		fmt.Printf("%s: admitted\n", tenant)
	}
	call("acme")
	call("acme")
	call("acme")
	call("globex")
	// Output:
	// acme: admitted
	// acme: admitted
	// acme: ResourceExhausted, over ratelimit:per-tenant, retry in 1h0m0s
	// globex: admitted
}

// A distributed rate limit: one quota for every replica of the server,
// shared through Redis (or Redis Cluster) by token leasing, so that Redis
// is asked once per batch of calls, not on every call. Limits.Quota is the
// store; the limits marked distributed lease their tokens through it, and
// decide by their fallback while Redis is unreachable (here: each replica
// takes its share of the rate).
func ExampleLimits_distributedRateLimit() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	quota, err := redisquota.New(client)
	if err != nil {
		log.Fatal(err)
	}
	defer quota.Close() // after the grpc.Server has stopped
	cfg, err := serviceconfig.ParseServer([]byte(`{
		"rateLimits": [{"name": "orders-per-tenant", "rate": 1000, "burst": 100, "key": "tenant",
		                "distributed": true, "fallback": "localShare"}],
		"tenantFairness": {"metadataKey": "x-tenant"}}`))
	if err != nil {
		log.Fatal(err)
	}
	srv, err := server.New(server.WithLimits(server.Limits{Config: *cfg, Quota: quota}))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	_ = grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(srv.StreamServerInterceptor()))
}
