package server

import (
	"context"
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

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestIdempotencyCommittedHandlerRunsOnceWithDefaultOptions pins item 2 of
// issue 21 (finding 8 of issue 14), against every store: a handler that
// commits (charges a card), then notices that the caller's deadline passed
// and returns DEADLINE_EXCEEDED, had its outcome released by default, so
// the caller's retry charged again unless a detached handler was asked
// for. Now a keyed call belongs to the server once its handler starts: with
// default options the handler runs detached from the caller's deadline,
// finishes, and its outcome is stored: one charge. The opt-out
// (Idempotency.AttachedHandler) keeps the old trade-off: two.
func TestIdempotencyCommittedHandlerRunsOnceWithDefaultOptions(t *testing.T) {
	tests := []struct {
		name        string
		attached    bool
		wantCharges int64
	}{
		{"DefaultDetached", false, 1},
		{"OptOutOnTheCallersContext", true, 2},
	}
	var cases []idemCase
	for _, tt := range tests {
		cases = append(cases, idemCase{tt.name, func(t *testing.T, env *idemEnv) {
			testIdemCommittedCharges(t, env, tt.attached, tt.wantCharges)
		}})
	}
	forEachStore(t, cases)
}

func testIdemCommittedCharges(t *testing.T, env *idemEnv, attached bool, wantCharges int64) {
	var charges atomic.Int64
	committed, returned := make(chan struct{}, 2), make(chan struct{}, 2)
	// A detached handler answers only once the caller has seen its
	// deadline end: grpc's client reads an answer that arrives as its
	// context ends, and got OK about once in a few hundred runs.
	callerSawEnd := make(chan struct{})
	sawEnd := sync.OnceFunc(func() { close(callerSawEnd) })
	t.Cleanup(sawEnd) // a failed test does not leave the handler waiting
	// The first call's deadline passes once its handler has committed, on
	// both sides (regression: a 50 ms deadline in real time sometimes
	// passed while a loaded machine was still claiming the key in Redis or
	// Postgres, so the handler never ran and the test waited for ever).
	client, server := newExpiring(context.Background()), newExpiring(context.Background())
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		defer func() { returned <- struct{}{} }()
		if charges.Add(1) > 1 { // committed; a retry's handler answers at once
			return &echov1.EchoResponse{Message: "charged"}, nil
		}
		committed <- struct{}{}
		// Writing the receipt while the caller's deadline passes: a handler
		// on the caller's context sees it end; a detached one does not.
		if attached {
			<-ctx.Done()
		} else {
			<-client.Done()
			<-callerSawEnd
		}
		if err := ctx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		return &echov1.EchoResponse{Message: "charged"}, nil
	}}
	var first atomic.Bool
	expireFirst := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if first.CompareAndSwap(false, true) {
			server.within(ctx)
			return h(server, req)
		}
		return h(ctx, req)
	}
	srv, err := New(WithIdempotency(Idempotency{Store: env.store, Scope: SharedScope, AttachedHandler: attached}))
	if err != nil {
		t.Fatal(err)
	}
	cc := testserver.StartWith(t, e, []grpc.ServerOption{grpc.ChainUnaryInterceptor(expireFirst, srv.UnaryServerInterceptor())})
	done := make(chan idemCall, 1)
	go func() { done <- idemDo(client, cc, "charge-1", "10 EUR") }()
	select {
	case <-committed:
	case r := <-done:
		t.Fatalf("first attempt ended before its handler ran: %v", r.err)
	}
	server.expire() // the server's view of the caller's deadline first, then the caller's
	client.expire()
	wantCode(t, "first attempt", (<-done).err, codes.DeadlineExceeded, "")
	sawEnd()
	<-returned // the first handler has returned
	if r := idemDo(idemCtx(t), cc, "charge-1", "10 EUR"); r.err != nil {
		t.Fatalf("retry: %v", r.err)
	}
	if got := charges.Load(); got != wantCharges {
		t.Errorf("charged %d times, want %d", got, wantCharges)
	}
}

// expiring is a context whose deadline passes when the test says so: after
// expire, Done is closed and Err is context.DeadlineExceeded, as for a
// deadline that passed. Values come from the context it is within.
type expiring struct {
	context.Context // for Value; replaced by within
	done            chan struct{}
	once            sync.Once
}

func newExpiring(parent context.Context) *expiring {
	return &expiring{Context: parent, done: make(chan struct{})}
}

// within makes ctx the source of the expiring context's values (a
// server call's metadata and stream); call it before handing it on.
func (e *expiring) within(ctx context.Context) { e.Context = ctx }

func (e *expiring) expire() { e.once.Do(func() { close(e.done) }) }

func (e *expiring) Deadline() (time.Time, bool) { return time.Time{}, false }

func (e *expiring) Done() <-chan struct{} { return e.done }

func (e *expiring) Err() error {
	select {
	case <-e.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// TestIdempotencyDetachedHandlerBoundedByTheServersMaximum: a detached
// handler that never finishes is cancelled at the server's maximum; its
// DEADLINE_EXCEEDED is not stored.
func TestIdempotencyDetachedHandlerBoundedByTheServersMaximum(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		var ended atomic.Int64
		e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
			start := time.Now()
			<-ctx.Done()
			ended.Store(int64(time.Since(start)))
			return nil, status.FromContextError(ctx.Err()).Err()
		}}
		cc := idemStart(t, e, Idempotency{Store: store, DetachedMax: 2 * time.Second})
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		wantCode(t, "stuck handler", idemDo(ctx, cc, "k", "m").err, codes.DeadlineExceeded, "")
		if got := time.Duration(ended.Load()); got != 2*time.Second {
			t.Errorf("handler ran %v, want the server's maximum, 2s", got)
		}
		if _, err := New(WithIdempotency(Idempotency{Store: store, Scope: SharedScope, DetachedMax: -time.Second})); err == nil ||
			!strings.Contains(err.Error(), "Idempotency.DetachedMax") {
			t.Errorf("DetachedMax -1s: error %v, want one naming Idempotency.DetachedMax", err)
		}
	})
}

// TestIdempotencyDetachedHandlerContext pins what a keyed handler's context
// is by default, over real gRPC: the caller's values (metadata), a
// deadline of the server's maximum from the handler's start and not the
// caller's, no end when the caller gives up; context.Cause agrees with
// Err; a context derived from it ends with it; it ends when the key's
// lease is lost (Canceled) and once the handler has returned (Canceled).
func TestIdempotencyDetachedHandlerContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		type seen struct {
			deadline      time.Duration // from the handler's start
			tenant        []string
			errAfterLeave error // after the caller's deadline passed
			cause, child  error // once the lease was lost
		}
		got := make(chan seen, 1)
		steal := newIdemStealStore(store)
		e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
			var s seen
			dl, _ := ctx.Deadline()
			s.deadline = time.Until(dl)
			md, _ := metadata.FromIncomingContext(ctx)
			s.tenant = md.Get("x-tenant")
			child, cancel := context.WithCancel(ctx)
			defer cancel()
			time.Sleep(200 * time.Millisecond) // the caller's 100 ms pass
			s.errAfterLeave = ctx.Err()
			<-ctx.Done() // the first renewal, at lease/3, finds the lease lost
			<-child.Done()
			s.cause, s.child = context.Cause(ctx), child.Err()
			got <- s
			return &echov1.EchoResponse{Message: "done"}, nil
		}}
		cc := idemStart(t, e, Idempotency{Store: steal, Lease: 3 * time.Second})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		wantCode(t, "caller", idemDo(ctx, cc, "k", "m", "x-tenant", "acme").err, codes.DeadlineExceeded, "")
		s := <-got
		if s.deadline != defaultDetachedMax || len(s.tenant) != 1 || s.tenant[0] != "acme" || s.errAfterLeave != nil {
			t.Errorf("handler saw deadline in %v, x-tenant %q, Err after the caller left %v; want %v, [acme], nil",
				s.deadline, s.tenant, s.errAfterLeave, defaultDetachedMax)
		}
		if s.cause != context.Canceled || s.child != context.Canceled {
			t.Errorf("lease lost: Cause %v, derived context's Err %v; want both Canceled", s.cause, s.child)
		}

		var kept context.Context
		quick := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
			kept = ctx
			return &echov1.EchoResponse{Message: "done"}, nil
		}}
		if r := idemDo(idemCtx(t), idemStart(t, quick, Idempotency{Store: store}), "k2", "m"); r.err != nil {
			t.Fatal(r.err)
		}
		if kept.Err() != context.Canceled {
			t.Errorf("after the handler returned: Err %v, want Canceled", kept.Err())
		}
	})
}
