package server

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestShutdownDrainsThenCancelsDetachedHandlers pins finding 5 of issue
// 33: grpc.Server.Stop cancels every call but the keyed ones, whose
// handlers run detached from their callers for up to DetachedMax (30s by
// default), and Server.Close only unregistered gauges: nothing could drain
// or cut them. Server.Shutdown(ctx) refuses new calls (a keyed one claims
// nothing), takes the queued ones out of the limits' queues, waits for
// the detached handlers until ctx ends, their outcomes stored, and then
// cancels those still running, whose outcomes are released.
func TestShutdownDrainsThenCancelsDetachedHandlers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		var ended atomic.Int64 // handlers that saw their context end
		e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
			took := map[string]time.Duration{"quick": time.Second, "stuck": time.Hour, "hold": time.Hour}[req.GetMessage()]
			select {
			case <-time.After(took):
				return &echov1.EchoResponse{Message: req.GetMessage()}, nil
			case <-ctx.Done():
				ended.Add(1)
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}}
		lim := WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{InitialLimit: 3, MinLimit: 3, MaxLimit: 3,
			MaxQueue: 1, MaxQueueWait: time.Hour}))
		s, cc := idemStartServer(t, e, Idempotency{Store: store}, lim)
		// Two keyed calls whose callers give up at once: their handlers run on.
		for _, m := range []string{"quick", "stuck"} {
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			wantCode(t, m+": its caller's deadline", idemDo(ctx, cc, "k-"+m, m).err, codes.DeadlineExceeded, "")
			cancel()
		}
		held := make(chan idemCall, 1)
		go func() { held <- idemDo(context.Background(), cc, "", "hold") }() // the third slot
		synctest.Wait()
		queued := make(chan idemCall, 1)
		go func() { queued <- idemDo(context.Background(), cc, "k-queued", "queued") }()
		synctest.Wait()
		if st := s.LimitStatuses()[0]; st.InFlight != 3 || st.Queued != 1 {
			t.Fatalf("before Shutdown: %d in flight, %d queued; want 3 and 1", st.InFlight, st.Queued)
		}

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- s.Shutdown(ctx) }()
		synctest.Wait()
		wantCode(t, "the queued call", (<-queued).err, codes.Unavailable, "shutting down")
		wantCode(t, "a keyed call after Shutdown began", idemDo(context.Background(), cc, "k-late", "quick").err,
			codes.Unavailable, "shutting down")
		err = <-done
		if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took != 10*time.Second {
			t.Errorf("Shutdown = %v after %v, want context.DeadlineExceeded after 10s (the stuck handler outlived it)", err, took)
		}
		synctest.Wait()
		if n := ended.Load(); n != 1 {
			t.Errorf("%d detached handlers saw their context end, want 1 (the stuck one, cancelled; the quick one finished)", n)
		}
		// The quick one's outcome is stored; the stuck one's is not, nor
		// is the refused one's: another Server on the store runs them.
		s2, cc2 := idemStartServer(t, e, Idempotency{Store: store})
		if r := idemDo(context.Background(), cc2, "k-quick", "quick"); r.err != nil || !isReplay(r) {
			t.Errorf("the drained call's retry elsewhere: %v, replayed %v; want its stored outcome", r.err, isReplay(r))
		}
		for k, m := range map[string]string{"k-stuck": "stuck", "k-late": "quick", "k-queued": "queued"} {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			r := idemDo(ctx, cc2, k, m)
			cancel()
			if isReplay(r) {
				t.Errorf("%s's retry elsewhere replayed %v, want it run (no outcome stored)", k, r.err)
			}
		}
		// The unkeyed call is grpc's: Shutdown leaves it alone (grpc's
		// Stop, in the cleanup, cancels it).
		select {
		case r := <-held:
			t.Errorf("the unkeyed call ended with %v, want it left running", r.err)
		default:
		}
		// Nothing else is held: the drained, the cut and the refused calls
		// gave their slots and queue places back.
		if st := s.LimitStatuses()[0]; st.InFlight != 1 || st.Queued != 0 {
			t.Errorf("after Shutdown: %d in flight, %d queued; want the unkeyed call's slot only", st.InFlight, st.Queued)
		}
		if err := s.Shutdown(context.Background()); err != nil { // again: nothing left to wait for
			t.Errorf("a second Shutdown = %v, want nil", err)
		}
		ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
		defer cancel2()
		if err := s2.Shutdown(ctx2); !errors.Is(err, context.DeadlineExceeded) { // its stuck handler is cancelled
			t.Errorf("the second Server's Shutdown = %v, want context.DeadlineExceeded", err)
		}
	})
}

// isReplay reports whether c was answered from a stored outcome.
func isReplay(c idemCall) bool { return len(c.header.Get("idempotency-replayed")) == 1 }

// TestShutdownCutsDetachedHandlersOnEveryStore: Shutdown's cut of a
// detached keyed handler that outlives its ctx holds nothing on any store,
// joined mode included (where the handler holds the key's transaction):
// Shutdown returns ctx's error, the handler's context ends with Canceled,
// its outcome is not stored (the claim released, the transaction rolled
// back), so a retry on another replica runs it at once rather than wait a
// lease (30s) or the owner's lock; and a later Shutdown finds nothing
// running.
func TestShutdownCutsDetachedHandlersOnEveryStore(t *testing.T) {
	forEachStore(t, []idemCase{{"Cut", testShutdownCut}})
}

func testShutdownCut(t *testing.T, env *idemEnv) {
	started := make(chan struct{}, 1)
	var sawErr atomic.Value
	stuck := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		started <- struct{}{}
		<-ctx.Done()
		sawErr.Store(ctx.Err())
		return nil, status.FromContextError(ctx.Err()).Err()
	}}
	s, ccA := idemStartServer(t, stuck, Idempotency{Store: env.store})
	call := make(chan idemCall, 1)
	go func() { call <- idemDo(context.Background(), ccA, "k", "m") }()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown = %v, want context.DeadlineExceeded (the handler outlived it)", err)
	}
	wantCode(t, "the cut call", (<-call).err, codes.Canceled, "")
	if err, _ := sawErr.Load().(error); err != context.Canceled {
		t.Errorf("the handler's context ended with %v, want context.Canceled", err)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Errorf("a second Shutdown = %v, want nil: nothing runs", err)
	}
	// Another replica: the key is free now, not a lease from now.
	quick := &idemEcho{}
	ccB := idemStart(t, quick, Idempotency{Store: env.newStore()})
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	if r := idemDo(rctx, ccB, "k", "m"); r.err != nil || isReplay(r) {
		t.Errorf("the retry on another replica: %v, replayed %v; want it run at once, fresh", r.err, isReplay(r))
	}
	wantCalls(t, quick, 1)
}
