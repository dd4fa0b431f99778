package server

import (
	"context"
	"strconv"
	"sync/atomic"
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

// benchHandlerVar is called as the interceptor calls a handler: through a
// func value, not inlined, so that its reply escapes to the heap as it does
// behind the interceptor.
var benchHandlerVar grpc.UnaryHandler = benchHandler

func benchServer(b *testing.B, store idempotency.Store) grpc.UnaryServerInterceptor {
	s, err := New(WithIdempotency(Idempotency{Store: store, Scope: SharedScope}))
	if err != nil {
		b.Fatal(err)
	}
	return s.UnaryServerInterceptor()
}

// benchKeys hands out incoming contexts that carry fresh idempotency keys.
// It makes the contexts once and writes new keys into their metadata in
// batches with the timer stopped, so that the benchmark's own allocations
// (the context, the metadata map, the key) are not counted against the
// interceptor, nor do they make the collector run more often than the
// interceptor's own garbage does.
type benchKeys struct {
	b    *testing.B
	ring []context.Context
	keys [][]string // the metadata value of ring[i]
	i    int
}

// benchKeySeq makes every key of the process unique, whatever store a
// benchmark shares with another.
var benchKeySeq atomic.Uint64

func newBenchKeys(b *testing.B) *benchKeys {
	const n = 4096
	k := &benchKeys{b: b, ring: make([]context.Context, n), keys: make([][]string, n)}
	bg := context.Background()
	for j := range k.ring {
		k.keys[j] = []string{""}
		k.ring[j] = metadata.NewIncomingContext(bg, metadata.MD{"idempotency-key": k.keys[j]})
	}
	k.fill()
	return k
}

func (k *benchKeys) fill() {
	for _, v := range k.keys {
		v[0] = "bench-" + strconv.FormatUint(benchKeySeq.Add(1), 36)
	}
	k.i = 0
}

// next returns a context with a key never used before.
func (k *benchKeys) next() context.Context {
	if k.i == len(k.ring) {
		k.b.StopTimer()
		k.fill()
		k.b.StartTimer()
	}
	ctx := k.ring[k.i]
	k.i++
	return ctx
}

// benchInterceptor measures the interceptor around a trivial handler: the
// cost it adds to a call is the difference to "handler only". newStore
// returns a fresh store, and its capacity in entries when it is bounded (0
// otherwise): "store full" fills it first, so that every first execution
// evicts the oldest record, as in a server that has run for a while.
func benchInterceptor(b *testing.B, newStore func(b *testing.B) (idempotency.Store, int)) {
	info := &grpc.UnaryServerInfo{FullMethod: idemEchoMethod}
	req := &echov1.EchoRequest{Message: "order-42"}
	bg := context.Background()
	b.Run("handler only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = benchHandlerVar(bg, req)
		}
	})
	store, _ := newStore(b)
	icpt := benchServer(b, store)
	b.Run("no key", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = icpt(bg, req, info, benchHandler)
		}
	})
	b.Run("first execution", func(b *testing.B) {
		store, _ := newStore(b)
		icpt := benchServer(b, store)
		keys := newBenchKeys(b)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := icpt(keys.next(), req, info, benchHandler); err != nil {
				b.Fatal(err)
			}
		}
	})
	full, capacity := newStore(b)
	if capacity > 0 {
		icpt = benchServer(b, full)
		b.Run("first execution, store full", func(b *testing.B) {
			keys := newBenchKeys(b)
			for range capacity {
				if _, err := icpt(keys.next(), req, info, benchHandler); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := icpt(keys.next(), req, info, benchHandler); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
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
	benchInterceptor(b, func(b *testing.B) (idempotency.Store, int) {
		// No minimum retention: fresh keys past the bound evict, the steady
		// state measured, instead of being refused.
		store, err := idempotency.NewMemoryStore(idempotency.WithMinRetention(0))
		if err != nil {
			b.Fatal(err)
		}
		return store, idempotency.DefaultMaxEntries
	})
}

func BenchmarkIdempotencyRedis(b *testing.B) {
	client := redistest.Client(b, redistest.Addr(b))
	benchInterceptor(b, func(b *testing.B) (idempotency.Store, int) {
		store, err := redisstore.New(client, redisstore.WithKeyPrefix(redistest.Prefix(b)))
		if err != nil {
			b.Fatal(err)
		}
		return store, 0
	})
}

// BenchmarkIdempotencyBufconn measures a whole unary call over bufconn,
// without the interceptor and with it (memory store, a fresh key per call).
func BenchmarkIdempotencyBufconn(b *testing.B) {
	store, err := idempotency.NewMemoryStore(idempotency.WithMinRetention(0))
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		idem Idempotency
		key  bool
	}{
		{"no interceptor option, key sent", Idempotency{}, true},
		{"memory store, fresh key", Idempotency{Store: store, Scope: SharedScope}, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cc := idemStart(b, &idemEcho{}, bc.idem)
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
