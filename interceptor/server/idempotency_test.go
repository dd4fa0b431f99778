package server

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestIdempotencySemantics has one subtest per row of the semantics, each
// run over bufconn against every store.
func TestIdempotencySemantics(t *testing.T) {
	forEachStore(t, []idemCase{
		{"FirstRunsDuplicateReplaysByteForByte", testIdemReplayBytes},
		{"ErrorOutcomeReplayedWithDetails", testIdemReplayError},
		{"ConcurrentDuplicates64RunOnce", testIdemConcurrent64},
		{"DuplicateOnAnotherServerPollsForOutcome", testIdemCrossServerWait},
		{"WaitBoundedByDuplicatesDeadline", testIdemWaitDeadline},
		{"WaitOffAbortedWithPushback", testIdemWaitOff},
		{"KeyReusedWithDifferentRequestFailedPrecondition", testIdemMismatch},
		{"RetryableFailureNotStored/UNAVAILABLE", testIdemRetryable(0)},
		{"RetryableFailureNotStored/RESOURCE_EXHAUSTED", testIdemRetryable(1)},
		{"RetryableFailureNotStored/HandlerTimedOut", testIdemRetryable(2)},
		{"RetryableFailureNotStored/Panic", testIdemRetryable(3)},
		{"RetryableFailureNotStored/HandlerCancelled", testIdemCancelled},
		{"CrashedOwnerLosesLease/NoWait", testIdemCrashedOwnerNoWait},
		{"CrashedOwnerLosesLease/Waiting", testIdemCrashedOwnerWaiting},
		{"KeyPolicyPerMethod", testIdemPolicy},
		{"InvalidKeysInvalidArgument", testIdemInvalidKeys},
		{"OtherScopeNeverSeesReply", testIdemScopes},
		{"ScopeErrorReturned", testIdemScopeError},
		{"ReplyOverStoreBoundNotStoredButReturned", testIdemHugeReply},
		{"StoreDown/FailClosed", testIdemStoreDownClosed},
		{"StoreDown/FailOpen", testIdemStoreDownOpen},
		{"ThousandKeysThreeDuplicatesTwoServersRunOnceEach", testIdem1000Keys},
	})
}

func testIdemReplayBytes(t *testing.T, env *idemEnv) {
	e := &idemEcho{}
	cc := idemStart(t, e, Idempotency{Store: env.store})
	ctx := idemCtx(t)
	first := idemDo(ctx, cc, "k1", "hello")
	dup := idemDo(ctx, cc, "k1", "hello")
	wantCalls(t, e, 1)
	if first.err != nil || dup.err != nil {
		t.Fatalf("errors = %v, %v, want none", first.err, dup.err)
	}
	if !bytes.Equal(first.raw, dup.raw) {
		t.Errorf("replayed reply bytes %x, want %x", dup.raw, first.raw)
	}
	for _, k := range []string{"x-h"} {
		if fmt.Sprint(dup.header[k]) != fmt.Sprint(first.header[k]) || len(first.header[k]) == 0 {
			t.Errorf("replayed header %s = %q, want %q", k, dup.header[k], first.header[k])
		}
	}
	for _, k := range []string{"x-t", "x-t-bin"} {
		if fmt.Sprint(dup.trailer[k]) != fmt.Sprint(first.trailer[k]) || len(first.trailer[k]) == 0 {
			t.Errorf("replayed trailer %s = %q, want %q", k, dup.trailer[k], first.trailer[k])
		}
	}
	// Without a key, every call runs.
	idemDo(ctx, cc, "", "hello")
	idemDo(ctx, cc, "", "hello")
	wantCalls(t, e, 3)
}

func testIdemReplayError(t *testing.T, env *idemEnv) {
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		st, err := status.New(codes.NotFound, "no order "+req.Message).WithDetails(&echov1.EchoResponse{Message: "detail"})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}}
	cc := idemStart(t, e, Idempotency{Store: env.store})
	ctx := idemCtx(t)
	first := idemDo(ctx, cc, "k1", "o-1")
	dup := idemDo(ctx, cc, "k1", "o-1")
	wantCalls(t, e, 1)
	wantCode(t, "first", first.err, codes.NotFound, "no order o-1")
	a, b := status.Convert(first.err).Proto(), status.Convert(dup.err).Proto()
	if !proto.Equal(a, b) || len(b.Details) != 1 {
		t.Errorf("replayed status = %v, want %v", b, a)
	}
}

func testIdemConcurrent64(t *testing.T, env *idemEnv) {
	const n = 64
	gate := make(chan struct{})
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		<-gate
		return &echov1.EchoResponse{Message: req.Message}, nil
	}}
	cc := idemStart(t, e, Idempotency{Store: env.store})
	ctx := idemCtx(t)
	var (
		wg      sync.WaitGroup
		started sync.WaitGroup
		results [n]idemCall
	)
	started.Add(n)
	for i := range n {
		wg.Go(func() {
			started.Done()
			results[i] = idemDo(ctx, cc, "one-key", "order")
		})
	}
	started.Wait()
	if env.fake {
		synctest.Wait() // every call is waiting for the first
	}
	close(gate)
	wg.Wait()
	wantCalls(t, e, 1)
	for i, r := range results {
		if r.err != nil || !bytes.Equal(r.raw, results[0].raw) {
			t.Fatalf("call %d = %x, %v; want %x like call 0", i, r.raw, r.err, results[0].raw)
		}
	}
}

func testIdemCrossServerWait(t *testing.T, env *idemEnv) {
	if env.joined {
		t.Skip("joined mode: a duplicate on another server waits on the owner's transaction, not by polling; " +
			"TestIdempotencyJoinedDuplicateWaitsForTheOwnersCommit pins it")
	}
	gate, entered := make(chan struct{}), make(chan struct{})
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		close(entered)
		<-gate
		return &echov1.EchoResponse{Message: req.Message + "-done"}, nil
	}}
	ccA := idemStart(t, e, Idempotency{Store: env.store})
	spy := newIdemSpy(env.newStore())
	ccB := idemStart(t, e, Idempotency{Store: spy})
	ctx := idemCtx(t)
	firstDone := make(chan idemCall)
	go func() { firstDone <- idemDo(ctx, ccA, "k", "m") }()
	<-entered
	dupDone := make(chan idemCall)
	go func() { dupDone <- idemDo(ctx, ccB, "k", "m") }()
	<-spy.inProgress // server B found the key in progress and polls
	close(gate)
	first, dup := <-firstDone, <-dupDone
	wantCalls(t, e, 1)
	if r := idemReply(t, dup); r.Message != "m-done" || !bytes.Equal(first.raw, dup.raw) {
		t.Errorf("duplicate on server B = %x, want the first's %x", dup.raw, first.raw)
	}
}

func testIdemWaitDeadline(t *testing.T, env *idemEnv) {
	gate, entered := make(chan struct{}), make(chan struct{})
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		close(entered)
		<-gate
		return &echov1.EchoResponse{Message: req.Message}, nil
	}}
	ccA := idemStart(t, e, Idempotency{Store: env.store})
	ccB := idemStart(t, e, Idempotency{Store: env.newStore()})
	ctx := idemCtx(t)
	firstDone := make(chan idemCall)
	go func() { firstDone <- idemDo(ctx, ccA, "k", "m") }()
	<-entered
	for _, tc := range []struct {
		name string
		cc   *grpc.ClientConn
	}{{"same server", ccA}, {"other server", ccB}} {
		cc := tc.cc
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		dup := idemDo(short, cc, "k", "m")
		cancel()
		wantCode(t, "duplicate on "+tc.name, dup.err, codes.DeadlineExceeded, "")
	}
	close(gate)
	if first := <-firstDone; first.err != nil {
		t.Fatalf("first call error = %v", first.err)
	}
	wantCalls(t, e, 1)
}

func testIdemWaitOff(t *testing.T, env *idemEnv) {
	gate, entered := make(chan struct{}), make(chan struct{})
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		close(entered)
		<-gate
		return &echov1.EchoResponse{Message: req.Message}, nil
	}}
	cc := idemStart(t, e, Idempotency{Store: env.store, Scope: SharedScope, NoWait: true, Pushback: 250 * time.Millisecond})
	ctx := idemCtx(t)
	firstDone := make(chan idemCall)
	go func() { firstDone <- idemDo(ctx, cc, "k", "m") }()
	<-entered
	dup := idemDo(ctx, cc, "k", "m")
	wantCode(t, "duplicate", dup.err, codes.Aborted, "in progress")
	if got := dup.trailer.Get("grpc-retry-pushback-ms"); len(got) != 1 || got[0] != "250" {
		t.Errorf("grpc-retry-pushback-ms = %q, want [250]", got)
	}
	close(gate)
	<-firstDone
	wantCalls(t, e, 1)
	if again := idemDo(ctx, cc, "k", "m"); again.err != nil {
		t.Errorf("duplicate after completion error = %v, want the replay", again.err)
	}
	wantCalls(t, e, 1)
}

func testIdemMismatch(t *testing.T, env *idemEnv) {
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		entered <- struct{}{}
		<-gate
		return &echov1.EchoResponse{Message: req.Message}, nil
	}}
	cc := idemStart(t, e, Idempotency{Store: env.store})
	ctx := idemCtx(t)
	firstDone := make(chan idemCall)
	go func() { firstDone <- idemDo(ctx, cc, "k", "request-A") }()
	<-entered
	if env.joined {
		// The first request's row is invisible until it commits: the other
		// request waits for it (polling the store, which sees the key's lock
		// held), and learns of the mismatch then.
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		inFlight := idemDo(short, cc, "k", "request-B")
		cancel()
		wantCode(t, "different request while in progress (joined)", inFlight.err, codes.DeadlineExceeded, "")
	} else {
		inFlight := idemDo(ctx, cc, "k", "request-B")
		wantCode(t, "different request while in progress", inFlight.err, codes.FailedPrecondition, "different request")
	}
	close(gate)
	<-firstDone
	after := idemDo(ctx, cc, "k", "request-B")
	wantCode(t, "different request after completion", after.err, codes.FailedPrecondition, "different request")
	if strings.Contains(status.Convert(after.err).Message(), "request-A") || len(after.trailer) > 0 && after.trailer.Get("x-t") != nil {
		t.Errorf("mismatch revealed the first request: %v %v", after.err, after.trailer)
	}
	wantCalls(t, e, 1)
}

var idemRetryableCases = []struct {
	name    string
	fail    func(ctx context.Context) (*echov1.EchoResponse, error) // the first execution
	timeout time.Duration                                           // of the first call; 0: none
	want    codes.Code
}{
	{"UNAVAILABLE", func(context.Context) (*echov1.EchoResponse, error) {
		return nil, status.Error(codes.Unavailable, "db down")
	}, 0, codes.Unavailable},
	{"RESOURCE_EXHAUSTED", func(context.Context) (*echov1.EchoResponse, error) {
		return nil, status.Error(codes.ResourceExhausted, "quota")
	}, 0, codes.ResourceExhausted},
	// On the caller's context (the opt-out of detached handlers): the
	// caller's deadline ends the handler, whose DEADLINE_EXCEEDED is not
	// stored.
	{"handler timed out", func(ctx context.Context) (*echov1.EchoResponse, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}, 100 * time.Millisecond, codes.DeadlineExceeded},
	{"panic", func(context.Context) (*echov1.EchoResponse, error) {
		panic("boom")
	}, 0, codes.Internal},
}

func testIdemRetryable(i int) func(t *testing.T, env *idemEnv) {
	tc := idemRetryableCases[i]
	return func(t *testing.T, env *idemEnv) {
		handled, entered := make(chan struct{}, 2), make(chan struct{}, 1)
		e := &idemEcho{}
		e.fn = func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
			defer func() { handled <- struct{}{} }()
			if e.calls.Load() == 1 {
				entered <- struct{}{}
				return tc.fail(ctx)
			}
			return &echov1.EchoResponse{Message: req.Message}, nil
		}
		ctx := idemCtx(t)
		if tc.timeout == 0 {
			cc := idemStart(t, e, Idempotency{Store: env.store})
			wantCode(t, "first call ("+tc.name+")", idemDo(ctx, cc, "k", "m").err, tc.want, "")
			<-handled
			// The retry runs the handler again (waiting, if need be, for
			// the first execution to release the key).
			if r := idemDo(ctx, cc, "k", "m"); r.err != nil {
				t.Fatalf("retry error = %v, want success", r.err)
			}
			wantCalls(t, e, 2)
			return
		}
		// The first call's deadline passes once its handler runs, on both
		// sides (regression: a 100 ms deadline in real time sometimes
		// passed while a loaded machine was still claiming the key in
		// PostgreSQL, so the handler never ran and the test waited on
		// handled for ever).
		client, server := newExpiring(ctx), newExpiring(context.Background())
		var first atomic.Bool
		expireFirst := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if first.CompareAndSwap(false, true) {
				server.within(ctx)
				return h(server, req)
			}
			return h(ctx, req)
		}
		srv, err := New(WithIdempotency(Idempotency{Store: env.store, Scope: SharedScope, AttachedHandler: true}))
		if err != nil {
			t.Fatal(err)
		}
		cc := testserver.StartWith(t, e, []grpc.ServerOption{grpc.ChainUnaryInterceptor(idemRecover, expireFirst, srv.UnaryServerInterceptor())})
		done := make(chan idemCall, 1)
		go func() { done <- idemDo(client, cc, "k", "m") }()
		select {
		case <-entered:
		case r := <-done:
			t.Fatalf("first call ended before its handler ran: %v", r.err)
		}
		server.expire() // the server's view of the caller's deadline first, then the caller's
		client.expire()
		wantCode(t, "first call ("+tc.name+")", (<-done).err, tc.want, "")
		<-handled
		if r := idemDo(ctx, cc, "k", "m"); r.err != nil {
			t.Fatalf("retry error = %v, want success", r.err)
		}
		wantCalls(t, e, 2)
	}
}

func testIdemCancelled(t *testing.T, env *idemEnv) {
	entered, handled := make(chan struct{}), make(chan struct{})
	e := &idemEcho{}
	e.fn = func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		if e.calls.Load() == 1 {
			defer close(handled)
			close(entered)
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return &echov1.EchoResponse{Message: req.Message}, nil
	}
	// On the caller's context (the opt-out of detached handlers), the
	// caller's cancellation ends the handler: CANCELLED is not stored.
	cc := idemStart(t, e, Idempotency{Store: env.store, AttachedHandler: true})
	ctx := idemCtx(t)
	first, cancel := context.WithCancel(ctx)
	go func() { <-entered; cancel() }()
	wantCode(t, "cancelled call", idemDo(first, cc, "cancel", "m").err, codes.Canceled, "")
	<-handled
	if r := idemDo(ctx, cc, "cancel", "m"); r.err != nil {
		t.Fatalf("retry error = %v, want success", r.err)
	}
	wantCalls(t, e, 2)
}

const idemTestLease = 2 * time.Second

// idemCrash claims key for the request {Message: "m"} as another replica
// would, which then crashes.
func idemCrash(t *testing.T, env *idemEnv, key string) {
	fp, err := srvFingerprint(&echov1.EchoRequest{Message: "m"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := env.store.Claim(context.Background(), idempotency.RecordKey{FullMethod: idemEchoMethod, Key: key}, fp[:], idemTestLease)
	if err != nil || c.State != idempotency.Owned {
		t.Fatalf("Claim() = %v, %v, want Owned", c.State, err)
	}
}

func testIdemCrashedOwnerNoWait(t *testing.T, env *idemEnv) {
	idemCrash(t, env, "k")
	e := &idemEcho{}
	ctx := idemCtx(t)
	cc := idemStart(t, e, Idempotency{Store: env.store, Scope: SharedScope, NoWait: true})
	wantCode(t, "before the lease ends", idemDo(ctx, cc, "k", "m").err, codes.Aborted, "")
	env.advance(idemTestLease)
	if r := idemDo(ctx, cc, "k", "m"); r.err != nil {
		t.Fatalf("after the lease ended: error = %v, want the handler to run", r.err)
	}
	wantCalls(t, e, 1)
}

func testIdemCrashedOwnerWaiting(t *testing.T, env *idemEnv) {
	idemCrash(t, env, "k")
	e := &idemEcho{}
	ctx := idemCtx(t)
	spy := newIdemSpy(env.store)
	cc := idemStart(t, e, Idempotency{Store: spy})
	done := make(chan idemCall)
	go func() { done <- idemDo(ctx, cc, "k", "m") }()
	<-spy.inProgress
	if !env.fake {
		env.advance(idemTestLease) // on fake time, the waiter's own timers move it
	}
	if r := <-done; r.err != nil {
		t.Fatalf("waiting duplicate error = %v, want it to run once the lease ended", r.err)
	}
	wantCalls(t, e, 1)
}

func testIdemPolicy(t *testing.T, env *idemEnv) {
	e := &idemEcho{}
	cc := idemStart(t, e, Idempotency{
		Store: env.store,
		KeyPolicies: map[string]KeyPolicy{
			idemEchoMethod:                   KeyRequired,
			"resilience.echo.v1.EchoService": KeyIgnored,
		},
	})
	ctx := idemCtx(t)
	wantCode(t, "required, missing", idemDo(ctx, cc, "", "m").err, codes.InvalidArgument, "requires idempotency-key")
	wantCalls(t, e, 0)
	// Lookup ignores keys: it runs every time.
	client := echov1.NewEchoServiceClient(cc)
	kctx := metadata.AppendToOutgoingContext(ctx, "idempotency-key", "k")
	for range 2 {
		if _, err := client.Lookup(kctx, &echov1.LookupRequest{Message: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	wantCalls(t, e, 2)
}

func testIdemInvalidKeys(t *testing.T, env *idemEnv) {
	e := &idemEcho{}
	cc := idemStart(t, e, Idempotency{Store: env.store})
	ctx := idemCtx(t)
	tests := []struct {
		name string
		kv   []string
		want string
	}{
		{"256 characters", []string{"idempotency-key", strings.Repeat("k", 256)}, "256 bytes long"},
		{"empty", []string{"x-raw-key-bin", ""}, "0 bytes long"},
		{"non-ASCII", []string{"x-raw-key-bin", "ключ"}, "byte 0xd0 at offset 0"},
		{"control character", []string{"x-raw-key-bin", "a\x01b"}, "byte 0x01 at offset 1"},
		{"sent twice", []string{"idempotency-key", "a", "idempotency-key", "b"}, "sent 2 times"},
	}
	for _, tc := range tests {
		wantCode(t, tc.name, idemDo(ctx, cc, "", "m", tc.kv...).err, codes.InvalidArgument, tc.want)
	}
	wantCalls(t, e, 0)
	if r := idemDo(ctx, cc, strings.Repeat("k", 255), "m"); r.err != nil {
		t.Errorf("255-character key error = %v, want success", r.err)
	}
}

func testIdemScopes(t *testing.T, env *idemEnv) {
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		return &echov1.EchoResponse{Message: "secret of " + req.Message}, nil
	}}
	cc := idemStart(t, e, Idempotency{Store: env.store, Scope: idemTenantScope})
	ctx := idemCtx(t)
	a := idemReply(t, idemDo(ctx, cc, "shared-key", "alice", "x-tenant", "alice"))
	for _, msg := range []string{"alice", "bob"} { // same and different request
		b := idemReply(t, idemDo(ctx, cc, "shared-key", msg, "x-tenant", "bob-"+msg))
		if b.Message != "secret of "+msg {
			t.Errorf("other scope got %q, want its own reply %q (first scope's was %q)", b.Message, "secret of "+msg, a.Message)
		}
	}
	wantCalls(t, e, 3)
}

func testIdemScopeError(t *testing.T, env *idemEnv) {
	e := &idemEcho{}
	cc := idemStart(t, e, Idempotency{Store: env.store, Scope: idemTenantScope})
	wantCode(t, "scope error", idemDo(idemCtx(t), cc, "k", "m", "x-tenant", "forbidden").err, codes.PermissionDenied, "tenant forbidden")
	wantCalls(t, e, 0)
}

func testIdemHugeReply(t *testing.T, env *idemEnv) {
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		return &echov1.EchoResponse{Message: req.Message, Payload: make([]byte, 4*idemMaxRecord)}, nil
	}}
	var log idemLog
	cc := idemStart(t, e, Idempotency{Store: env.store}, WithLogger(log.logger()))
	ctx := idemCtx(t)
	for range 2 {
		if env.joined {
			// The reply cannot be returned: the writes it reports were
			// rolled back with the claim (they commit with the record or
			// not at all).
			wantCode(t, "joined mode, reply over the bound", idemDo(ctx, cc, "big", "m").err, codes.Internal, "rolled back")
			continue
		}
		if r := idemReply(t, idemDo(ctx, cc, "big", "m")); len(r.Payload) != 4*idemMaxRecord {
			t.Fatalf("reply payload %d bytes, want %d", len(r.Payload), 4*idemMaxRecord)
		}
	}
	wantCalls(t, e, 2) // not stored: the duplicate ran again
	if !strings.Contains(log.String(), "larger than the store's bound") {
		t.Errorf("log = %q, want a warning about the store's bound", log.String())
	}
}

func testIdemStoreDownClosed(t *testing.T, env *idemEnv) {
	ctx := idemCtx(t)
	e := &idemEcho{}
	cc := idemStart(t, e, Idempotency{Store: env.downStore()})
	wantCode(t, "store down", idemDo(ctx, cc, "k", "m").err, codes.Unavailable, "store unavailable")
	wantCalls(t, e, 0)
	if r := idemDo(ctx, cc, "", "m"); r.err != nil { // calls without a key do not need the store
		t.Errorf("call without a key error = %v", r.err)
	}
}

func testIdemStoreDownOpen(t *testing.T, env *idemEnv) {
	ctx := idemCtx(t)
	e := &idemEcho{}
	var log idemLog
	cc := idemStart(t, e, Idempotency{Store: env.downStore(), FailOpen: true}, WithLogger(log.logger()))
	for range 2 {
		if r := idemDo(ctx, cc, "k", "m"); r.err != nil {
			t.Fatalf("fail open: error = %v, want the handler's reply", r.err)
		}
	}
	wantCalls(t, e, 2)
	if !strings.Contains(log.String(), "fail open") {
		t.Errorf("log = %q, want a fail-open warning", log.String())
	}
}

func testIdem1000Keys(t *testing.T, env *idemEnv) {
	const keys, dups = 1000, 3
	e := &idemEcho{}
	e.fn = func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		return &echov1.EchoResponse{Message: req.Message + fmt.Sprintf("#%d", e.calls.Load())}, nil
	}
	cc0 := idemStart(t, e, Idempotency{Store: env.store})
	cc1 := idemStart(t, e, Idempotency{Store: env.newStore()})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var (
		wg      sync.WaitGroup
		results [keys][dups]idemCall
	)
	for k := range keys {
		for d := range dups {
			wg.Go(func() {
				cc := cc0
				if (k+d)%2 == 1 {
					cc = cc1
				}
				results[k][d] = idemDo(ctx, cc, fmt.Sprintf("key-%d", k), fmt.Sprintf("req-%d", k))
			})
		}
	}
	wg.Wait()
	wantCalls(t, e, keys)
	for k := range keys {
		for d := range dups {
			r := results[k][d]
			if r.err != nil || !bytes.Equal(r.raw, results[k][0].raw) {
				t.Fatalf("key %d duplicate %d = %x, %v; want %x like duplicate 0", k, d, r.raw, r.err, results[k][0].raw)
			}
		}
	}
}
