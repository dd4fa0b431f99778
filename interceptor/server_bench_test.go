package interceptor

import (
	"context"
	"strconv"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

func benchHandler(_ context.Context, req any) (any, error) {
	return &echov1.EchoResponse{Message: req.(*echov1.EchoRequest).Message}, nil
}

func benchServer(b *testing.B, store idempotency.Store) grpc.UnaryServerInterceptor {
	s, err := NewServer(WithIdempotencyStore(store))
	if err != nil {
		b.Fatal(err)
	}
	return s.UnaryServerInterceptor()
}

// benchInterceptor measures the interceptor around a trivial handler: the
// cost it adds to a call is the difference to "handler only".
func benchInterceptor(b *testing.B, store idempotency.Store) {
	info := &grpc.UnaryServerInfo{FullMethod: idemEchoMethod}
	req := &echov1.EchoRequest{Message: "order-42"}
	bg := context.Background()
	b.Run("handler only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = benchHandler(bg, req)
		}
	})
	icpt := benchServer(b, store)
	b.Run("no key", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = icpt(bg, req, info, benchHandler)
		}
	})
	b.Run("first execution", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			ctx := metadata.NewIncomingContext(bg, metadata.MD{"idempotency-key": {"bench-" + strconv.Itoa(i)}})
			if _, err := icpt(ctx, req, info, benchHandler); err != nil {
				b.Fatal(err)
			}
		}
	})
	replay := metadata.NewIncomingContext(bg, metadata.MD{"idempotency-key": {"replayed"}})
	if _, err := icpt(replay, req, info, benchHandler); err != nil {
		b.Fatal(err)
	}
	b.Run("replay", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := icpt(replay, req, info, benchHandler); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := icpt(replay, req, info, benchHandler); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

func BenchmarkIdempotencyMemory(b *testing.B) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		b.Fatal(err)
	}
	benchInterceptor(b, store)
}

func BenchmarkIdempotencyRedis(b *testing.B) {
	client := redistest.Client(b, redistest.Addr(b))
	store, err := redisstore.New(client, redisstore.WithKeyPrefix(redistest.Prefix(b)))
	if err != nil {
		b.Fatal(err)
	}
	benchInterceptor(b, store)
}

// BenchmarkIdempotencyBufconn measures a whole unary call over bufconn,
// without the interceptor and with it (memory store, a fresh key per call).
func BenchmarkIdempotencyBufconn(b *testing.B) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		opts []ServerOption
		key  bool
	}{
		{"no interceptor option, key sent", nil, true},
		{"memory store, fresh key", []ServerOption{WithIdempotencyStore(store)}, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cc := idemStart(b, &idemEcho{}, bc.opts...)
			client := echov1.NewEchoServiceClient(cc)
			req := &echov1.EchoRequest{Message: "order-42"}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				ctx := metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", "k-"+strconv.Itoa(i))
				if _, err := client.Echo(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
