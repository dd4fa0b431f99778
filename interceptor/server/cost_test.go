package server

import (
	"context"
	"crypto/sha256"
	"strconv"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// workEcho answers Echo after a fixed, small amount of work: it hashes a
// 16 KiB buffer with SHA-256, about as much CPU as a handler that decodes a
// request and writes one row (tens of microseconds), and no I/O, so that a
// measurement stays about the interceptor. A replay must cost less than a
// call that runs this handler.
type workEcho struct {
	echov1.UnimplementedEchoServiceServer
}

var workEchoInput = make([]byte, 16<<10)

func (workEcho) Echo(_ context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	sum := sha256.Sum256(workEchoInput)
	return &echov1.EchoResponse{Message: req.GetMessage(), Payload: sum[:4]}, nil
}

// passThrough is a unary server interceptor that only calls the handler:
// what any interceptor costs in grpc (the generated handler allocates its
// *grpc.UnaryServerInfo and a closure once one is installed, 2 allocations
// per call), the floor for ours.
func passThrough(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	return handler(ctx, req)
}

// startCostServer serves workEcho over bufconn, through icpt when it is not
// nil, and returns a client without interceptors.
func startCostServer(tb testing.TB, icpt grpc.UnaryServerInterceptor) echov1.EchoServiceClient {
	tb.Helper()
	var opts []grpc.ServerOption
	if icpt != nil {
		opts = append(opts, grpc.UnaryInterceptor(icpt))
	}
	return echov1.NewEchoServiceClient(testserver.StartWith(tb, workEcho{}, opts))
}

// costPair is a bare server, one with an interceptor that does nothing
// (passThrough) and one with the idempotency interceptor on a memory store,
// all running workEcho.
type costPair struct {
	bare, noop, idem echov1.EchoServiceClient
}

func newCostPair(tb testing.TB) costPair {
	tb.Helper()
	store, err := idempotency.NewMemoryStore(idempotency.WithMinRetention(0))
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := New(WithIdempotency(Idempotency{Store: store, Scope: SharedScope}))
	if err != nil {
		tb.Fatal(err)
	}
	return costPair{
		bare: startCostServer(tb, nil),
		noop: startCostServer(tb, passThrough),
		idem: startCostServer(tb, srv.UnaryServerInterceptor()),
	}
}

// keyedContexts returns n outgoing contexts, each with an idempotency key
// no other has, made before a measurement so that it counts none of their
// allocations.
func keyedContexts(prefix string, n int) []context.Context {
	ctxs := make([]context.Context, n)
	for i := range ctxs {
		ctxs[i] = metadata.AppendToOutgoingContext(context.Background(),
			wire.IdempotencyKeyHeader, prefix+strconv.FormatUint(benchKeySeq.Add(1), 36))
	}
	return ctxs
}

var costReq = &echov1.EchoRequest{Message: "order-42"}

func costCall(tb testing.TB, c echov1.EchoServiceClient, ctx context.Context) {
	if _, err := c.Echo(ctx, costReq); err != nil {
		tb.Fatal(err)
	}
}

// allocsOfCalls returns the allocations per call of runs calls to c, each
// with the next of ctxs (the same one over and over when ctxs has one).
func allocsOfCalls(tb testing.TB, c echov1.EchoServiceClient, ctxs []context.Context, runs int) float64 {
	i := 0
	return testing.AllocsPerRun(runs, func() {
		costCall(tb, c, ctxs[i%len(ctxs)])
		i++
	})
}

// TestIdempotencyCostAllocations compares, in allocations per whole call
// over bufconn, a bare server with one running the idempotency interceptor
// on a memory store. Without a key the interceptor adds nothing to what any
// interceptor costs (passThrough); a first execution and a replay add what
// the store needs, pinned here so that a regression shows.
func TestIdempotencyCostAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("exact allocation counts need the race detector off: with it, sync.Pool drops items at random")
	}
	p := newCostPair(t)
	bg := []context.Context{context.Background()}
	for range 3 { // connections up, policies resolved
		costCall(t, p.bare, bg[0])
		costCall(t, p.noop, bg[0])
		costCall(t, p.idem, bg[0])
	}
	const runs = 300
	// AllocsPerRun makes one warm-up call before it counts.
	bare := allocsOfCalls(t, p.bare, bg, runs)
	noop := allocsOfCalls(t, p.noop, bg, runs)
	noKey := allocsOfCalls(t, p.idem, bg, runs)
	bareKeyed := allocsOfCalls(t, p.bare, keyedContexts("bare-", runs+1), runs)
	first := allocsOfCalls(t, p.idem, keyedContexts("first-", runs+1), runs)
	replayCtx := keyedContexts("replay-", 1)
	costCall(t, p.idem, replayCtx[0])
	replay := allocsOfCalls(t, p.idem, replayCtx, runs)
	t.Logf("allocs per call: bare %v, pass-through interceptor %v, no key %v; bare with key %v, first execution %v, replay %v",
		bare, noop, noKey, bareKeyed, first, replay)
	if noKey != noop {
		t.Errorf("no key: %v allocs per call, pass-through interceptor %v: want the same", noKey, noop)
	}
	if extra := first - bareKeyed; extra > maxFirstExecutionExtraAllocs {
		t.Errorf("first execution: +%v allocs per call over bare, want at most +%v", extra, maxFirstExecutionExtraAllocs)
	}
	if extra := replay - bareKeyed; extra > maxReplayExtraAllocs {
		t.Errorf("replay: +%v allocs per call over bare, want at most +%v", extra, maxReplayExtraAllocs)
	}
}

// The allocations a first execution and a replay add to a whole call, as
// measured when they were last changed (see TestIdempotencyCostAllocations).
// A first execution added 9 until its lease renewal (state, timer and the
// timer's function) came from a per-server pool; 6 until its handler ran
// detached by default (issue 21, item 2), which adds the handler's context
// (srvDetached) and the values-only context under it (context.WithoutCancel;
// context.WithTimeout over it added 5 and a timer).
const (
	maxFirstExecutionExtraAllocs = 8
	// A replay added 3 until it carried the idempotency-replayed header
	// (issue 21): the server's copy of it into the stream's header, and
	// both sides' work for one more header field.
	maxReplayExtraAllocs = 9
)

// BenchmarkIdempotencyCost measures the server idempotency interceptor on
// the memory store as a ratio to a bare bufconn call to the same handler
// (workEcho), with paired alternating calls: a first execution (a new key
// each call, both sides sending it), a replay (the same key each call,
// against a bare call that runs the handler) and no key. allocs/op counts
// both calls of a pair.
func BenchmarkIdempotencyCost(b *testing.B) {
	p := newCostPair(b)
	bg := context.Background()
	costCall(b, p.bare, bg)
	costCall(b, p.idem, bg)
	b.Run("first execution", func(b *testing.B) {
		bareCtxs, oursCtxs := keyedContexts("bare-", b.N), keyedContexts("first-", b.N)
		testserver.PairedCalls(b,
			func(i int) { costCall(b, p.bare, bareCtxs[i]) },
			func(i int) { costCall(b, p.idem, oursCtxs[i]) })
	})
	b.Run("replay", func(b *testing.B) {
		replay := keyedContexts("replay-", 1)[0]
		costCall(b, p.idem, replay)
		testserver.PairedCalls(b,
			func(int) { costCall(b, p.bare, replay) },
			func(int) { costCall(b, p.idem, replay) })
	})
	b.Run("no key", func(b *testing.B) {
		testserver.PairedCalls(b,
			func(int) { costCall(b, p.bare, bg) },
			func(int) { costCall(b, p.idem, bg) })
	})
	b.Run("no key vs pass-through", func(b *testing.B) {
		testserver.PairedCalls(b,
			func(int) { costCall(b, p.noop, bg) },
			func(int) { costCall(b, p.idem, bg) })
	})
}
