package redisstore_test

import (
	"context"
	"log"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/server"
)

// A server's store on one Redis. The client keeps go-redis's retries low
// (see the package documentation): a caller waits for them. (Compiled,
// not run: it needs a Redis.)
func ExampleOpen() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", MaxRetries: 1, DialerRetries: 1})
	defer client.Close()
	// Open refuses a Redis that may evict live claims (maxmemory-policy
	// other than noeviction).
	store, err := redisstore.Open(context.Background(), client, redisstore.WithKeyPrefix("orders:idem:"))
	if err != nil {
		log.Fatal(err)
	}
	// Every replica uses the same Redis: a keyed call runs once across all.
	// Callers present client certificates (mTLS): each one's keys are its own.
	srv, err := server.New(server.WithIdempotency(server.Idempotency{
		Store: store,
		Scope: server.PeerScope,
	}))
	if err != nil {
		log.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()))
	defer gs.Stop()
	// Register services on gs and serve.
}

// A Redis Cluster: every record is one key in one slot, so the store runs
// on a cluster client; Open checks the eviction policy of every primary.
// (Compiled, not run: it needs a cluster.)
func ExampleOpen_cluster() {
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:      []string{"redis-0:6379", "redis-1:6379", "redis-2:6379"},
		MaxRetries: 1, DialerRetries: 1,
	})
	defer client.Close()
	store, err := redisstore.Open(context.Background(), client)
	if err != nil {
		log.Fatal(err)
	}
	_ = store // server.Idempotency{Store: store, ...}, as in ExampleOpen
}

// WithMinReplicas narrows what a failover can lose: a claim that no replica
// acknowledged within 50 ms is released, and the call fails closed
// (UNAVAILABLE, retried by the client) instead of running where a promoted
// replica would not know of it. (Compiled, not run: it needs a replica.)
func ExampleWithMinReplicas() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", MaxRetries: 1, DialerRetries: 1})
	defer client.Close()
	store, err := redisstore.Open(context.Background(), client, redisstore.WithMinReplicas(1, 50*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	_ = store
}
