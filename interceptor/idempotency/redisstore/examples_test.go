package redisstore_test

import (
	"context"
	"log"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
)

func ExampleOpen() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", MaxRetries: 1})
	defer client.Close()
	// Open refuses a Redis that may evict live claims (maxmemory-policy
	// other than noeviction).
	store, err := redisstore.Open(context.Background(), client,
		redisstore.WithKeyPrefix("orders:idem:"), redisstore.WithRefuseEvictingPolicy())
	if err != nil {
		log.Fatal(err)
	}
	// Every replica uses the same Redis: a keyed call runs once across all.
	// Callers present client certificates (mTLS): each one's keys are its own.
	srv, err := interceptor.NewServer(interceptor.WithIdempotencyStore(store),
		interceptor.WithIdempotencyScope(interceptor.IdempotencyPeerScope))
	if err != nil {
		log.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()))
	defer gs.Stop()
	// Register services on gs and serve.
}
