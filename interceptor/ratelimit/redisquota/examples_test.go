package redisquota_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/grpc-resilience/resilience/interceptor/ratelimit/redisquota"
	"github.com/grpc-resilience/resilience/interceptor/wire"
)

// A limit of 100 calls per second for each tenant, shared by every replica
// that uses the same Redis and the same limit name. (Compile-only: it
// needs a Redis server.)
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	store, err := redisquota.New(client, redisquota.WithLeaseTimeout(50*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	perTenant, err := store.Limiter("orders-per-tenant", redisquota.Limit{Rate: 100, Burst: 20})
	if err != nil {
		log.Fatal(err)
	}
	d, err := perTenant.Allow(context.Background(), "tenant-a", wire.Critical)
	if err != nil {
		log.Fatal(err)
	}
	if !d.OK {
		fmt.Println("over the limit; come back in", d.Wait)
	}
}

// A quota that must never be passed, even while Redis is down: the calls
// the leased tokens do not cover are refused. (Compile-only.)
func ExampleFallbackClosed() {
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"redis-0:6379", "redis-1:6379", "redis-2:6379"},
		ContextTimeoutEnabled: true})
	defer client.Close()
	store, err := redisquota.New(client)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	_, err = store.Limiter("paid-api", redisquota.Limit{Rate: 600, Per: time.Minute, Burst: 10, Fallback: redisquota.FallbackClosed})
	if err != nil {
		log.Fatal(err)
	}
}
