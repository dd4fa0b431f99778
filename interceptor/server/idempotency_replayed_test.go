package server

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestIdempotencyReplaysAreMarked pins the replay header of issue 21,
// against every store: a client could not tell a replay from a fresh run.
// Now every answer for which the handler did not run carries
// idempotency-replayed: true (a stored reply, a stored error, a concurrent
// duplicate's coalesced answer), and an answer of a handler run does not.
func TestIdempotencyReplaysAreMarked(t *testing.T) {
	forEachStore(t, []idemCase{{"StoredFailedAndCoalesced", testIdemReplaysMarked}})
}

func testIdemReplaysMarked(t *testing.T, env *idemEnv) {
	gate := make(chan struct{})
	e := &idemEcho{}
	e.fn = func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		switch req.Message {
		case "fail":
			return nil, status.Error(codes.NotFound, "no such order")
		case "slow":
			<-gate
		}
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-h", "1"))
		return &echov1.EchoResponse{Message: req.Message}, nil
	}
	cc := idemStart(t, e, Idempotency{Store: env.store})
	ctx := idemCtx(t)
	marked := func(what string, c idemCall, want bool) {
		t.Helper()
		if got := wire.IdempotencyReplayed(c.header); got != want {
			t.Errorf("%s: header %v, replayed %v, want %v", what, c.header, got, want)
		}
	}
	first := idemDo(ctx, cc, "k", "m")
	marked("first execution", first, false)
	dup := idemDo(ctx, cc, "k", "m")
	marked("replay", dup, true)
	if dup.header.Get("x-h")[0] != "1" {
		t.Errorf("replay header %v, want the handler's x-h too", dup.header)
	}
	marked("stored error, first", idemDo(ctx, cc, "f", "fail"), false)
	failed := idemDo(ctx, cc, "f", "fail")
	wantCode(t, "replayed error", failed.err, codes.NotFound, "no such order")
	marked("replayed error", failed, true)

	var wg sync.WaitGroup
	var leader, waiter idemCall
	started := make(chan struct{})
	wg.Go(func() { close(started); leader = idemDo(ctx, cc, "s", "slow") })
	<-started
	wg.Go(func() { waiter = idemDo(ctx, cc, "s", "slow") })
	if env.fake {
		synctest.Wait() // both are in: the leader in its handler, the other waiting
	} else {
		time.Sleep(100 * time.Millisecond) // real Redis: let both arrive
	}
	close(gate)
	wg.Wait()
	if leader.err != nil || waiter.err != nil {
		t.Fatalf("coalesced calls: %v, %v", leader.err, waiter.err)
	}
	if wire.IdempotencyReplayed(leader.header) == wire.IdempotencyReplayed(waiter.header) {
		t.Errorf("coalesced calls: replayed %v and %v, want exactly one (the one whose handler did not run)",
			wire.IdempotencyReplayed(leader.header), wire.IdempotencyReplayed(waiter.header))
	}
	wantCalls(t, e, 3)
}

// clientMetricReplays is the client's count of replayed answers.
const clientMetricReplays = "resilience.client.idempotency.replays"

// TestClientSeesReplays: a keyed call whose first attempt times out while
// its handler runs gets, on its retry, the first execution's outcome; the
// caller reads that it was a replay (wire.IdempotencyReplayed on its
// grpc.Header), and the client counts it (resilience.client.idempotency.replays).
func TestClientSeesReplays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, mp := newMeterReader()
		e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
			if req.Message == "order-1" {
				time.Sleep(150 * time.Millisecond) // longer than an attempt may take
			}
			return &echov1.EchoResponse{Message: "created " + req.Message}, nil
		}}
		store, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		c := newTestClient(t, interceptor.WithMeterProvider(mp), interceptor.WithIdempotencyKeys("resilience.echo.v1.EchoService"),
			interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond,
				PerAttemptRecvTimeout: 100 * time.Millisecond}))
		cc := idemStartDial(t, e, c.DialOptions(), Idempotency{Store: store})
		var header metadata.MD
		r, err := echov1.NewEchoServiceClient(cc).Echo(t.Context(), &echov1.EchoRequest{Message: "order-1"}, grpc.Header(&header))
		if err != nil || r.GetMessage() != "created order-1" {
			t.Fatalf("Echo = %v, %v", r, err)
		}
		if !wire.IdempotencyReplayed(header) {
			t.Errorf("header %v: want the answer marked as a replay", header)
		}
		wantCalls(t, e, 1)
		collect(t, reader).Expect(t, clientMetricReplays, "{attempt}", map[string]float64{"grpc.method=resilience.echo.v1.EchoService/Echo": 1})

		header = nil
		if _, err := echov1.NewEchoServiceClient(cc).Echo(t.Context(), &echov1.EchoRequest{Message: "order-2"}, grpc.Header(&header)); err != nil {
			t.Fatal(err)
		}
		if wire.IdempotencyReplayed(header) {
			t.Errorf("a fresh call's header %v is marked as a replay", header)
		}
		collect(t, reader).Expect(t, clientMetricReplays, "{attempt}", map[string]float64{"grpc.method=resilience.echo.v1.EchoService/Echo": 1})
	})
}

// TestIdempotencyReplayedHeaderIsTheInterceptorsAlone pins that only the
// interceptor marks an answer as a replay, against every store. A handler
// that set idempotency-replayed itself (a gateway passing on the headers
// of a downstream server that replayed) had its fresh answer read as a
// replay by wire.IdempotencyReplayed, and since the header was stored with the
// outcome, the replay of that answer carried the mark twice, which
// wire.IdempotencyReplayed does not read as a replay: both answers lied. Now
// the handler's mark is dropped, from what is sent and what is stored (in
// header and trailer), and a replay carries exactly one, also from a
// record stored with one by an earlier version.
func TestIdempotencyReplayedHeaderIsTheInterceptorsAlone(t *testing.T) {
	forEachStore(t, []idemCase{{"SetByTheHandler", testIdemReplayedByHandler}})
}

func testIdemReplayedByHandler(t *testing.T, env *idemEnv) {
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs(wire.IdempotencyReplayedHeader, "true", "x-h", "1"))
		_ = grpc.SetTrailer(ctx, metadata.Pairs(wire.IdempotencyReplayedHeader, "true"))
		if req.Message == "sent" {
			_ = grpc.SendHeader(ctx, metadata.Pairs(wire.IdempotencyReplayedHeader, "true"))
		}
		return &echov1.EchoResponse{Message: req.Message}, nil
	}}
	cc := idemStart(t, e, Idempotency{Store: env.store})
	ctx := idemCtx(t)
	for _, msg := range []string{"set", "sent"} {
		first := idemDo(ctx, cc, "k-"+msg, msg)
		dup := idemDo(ctx, cc, "k-"+msg, msg)
		if first.err != nil || dup.err != nil {
			t.Fatalf("%s: %v, %v", msg, first.err, dup.err)
		}
		if wire.IdempotencyReplayed(first.header) || len(first.header[wire.IdempotencyReplayedHeader]) != 0 ||
			len(first.trailer[wire.IdempotencyReplayedHeader]) != 0 {
			t.Errorf("%s: the handler's answer carries header %v, trailer %v; want no %s", msg, first.header, first.trailer,
				wire.IdempotencyReplayedHeader)
		}
		if got := dup.header[wire.IdempotencyReplayedHeader]; len(got) != 1 || !wire.IdempotencyReplayed(dup.header) {
			t.Errorf("%s: the replay's %s = %q, want [true]", msg, wire.IdempotencyReplayedHeader, got)
		}
		if len(dup.trailer[wire.IdempotencyReplayedHeader]) != 0 {
			t.Errorf("%s: the replay's trailer %v carries the mark", msg, dup.trailer)
		}
	}

	// A record stored with the mark in its header, as an earlier version
	// stored a handler's.
	rk := idempotency.RecordKey{FullMethod: idemEchoMethod, Key: "old"}
	fp, err := srvFingerprint(&echov1.EchoRequest{Message: "old"})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := env.store.Claim(ctx, rk, fp[:], time.Minute)
	if err != nil || cl.State != idempotency.Owned {
		t.Fatalf("Claim = %v, %v", cl.State, err)
	}
	reply, _ := proto.Marshal(&echov1.EchoResponse{Message: "old"})
	rec := &idempotency.Record{Fingerprint: fp[:], ReplyType: "resilience.echo.v1.EchoResponse", Reply: reply,
		Header: metadata.Pairs(wire.IdempotencyReplayedHeader, "true")}
	if err := env.store.Complete(ctx, rk, cl.Token, rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	old := idemDo(ctx, cc, "old", "old")
	if got := old.header[wire.IdempotencyReplayedHeader]; old.err != nil || len(got) != 1 || !wire.IdempotencyReplayed(old.header) {
		t.Errorf("replay of a record stored with the mark: %v, %s = %q, want [true]", old.err, wire.IdempotencyReplayedHeader, got)
	}
}
