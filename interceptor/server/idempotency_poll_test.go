package server

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// idemClock records when each Claim happened, on the bubble's fake time.
type idemClock struct {
	idempotency.Store
	start time.Time
	mu    sync.Mutex
	at    []time.Duration // guarded by mu
}

func (s *idemClock) Claim(ctx context.Context, k idempotency.RecordKey, fp []byte, lease time.Duration) (idempotency.Claim, error) {
	s.mu.Lock()
	s.at = append(s.at, time.Since(s.start))
	s.mu.Unlock()
	return s.Store.Claim(ctx, k, fp, lease)
}

// TestIdempotencyPollBackoffDoublesAndStopsAtLease pins the documented
// backoff of a duplicate polling for an owner in another process: 10 ms,
// doubling, at most 500 ms, and never past the owner's lease.
func TestIdempotencyPollBackoffDoublesAndStopsAtLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		env := &idemEnv{store: mem}
		idemCrash(t, env, "k") // lease idemTestLease = 2 s, from now
		spy := &idemClock{Store: mem, start: time.Now()}
		e := &idemEcho{}
		cc := idemStart(t, e, Idempotency{Store: spy})
		if r := idemDo(idemCtx(t), cc, "k", "m"); r.err != nil {
			t.Fatalf("duplicate error = %v, want it to run once the lease ended", r.err)
		}
		ms := time.Millisecond
		want := []time.Duration{0, 10 * ms, 30 * ms, 70 * ms, 150 * ms, 310 * ms, 630 * ms, 1130 * ms, 1630 * ms, 2000 * ms}
		spy.mu.Lock()
		defer spy.mu.Unlock()
		if len(spy.at) != len(want) {
			t.Fatalf("claims at %v, want %v", spy.at, want)
		}
		for i := range want {
			if spy.at[i] != want[i] {
				t.Fatalf("claims at %v, want %v", spy.at, want)
			}
		}
		wantCalls(t, e, 1)
	})
}

func TestIdempotencyWaiterTakesOverWhenFirstCallerCancels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		entered := make(chan struct{})
		e := &idemEcho{}
		e.fn = func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
			if e.calls.Load() == 1 {
				close(entered)
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return &echov1.EchoResponse{Message: req.Message}, nil
		}
		// On the caller's context (the opt-out of detached handlers), the
		// first caller's cancellation ends its handler.
		cc := idemStart(t, e, Idempotency{Store: mem, AttachedHandler: true})
		ctx := idemCtx(t)
		first, cancel := context.WithCancel(ctx)
		firstDone := make(chan idemCall)
		go func() { firstDone <- idemDo(first, cc, "k", "m") }()
		<-entered
		dupDone := make(chan idemCall)
		go func() { dupDone <- idemDo(ctx, cc, "k", "m") }()
		synctest.Wait() // the duplicate waits on the first, in process
		cancel()
		wantCode(t, "cancelled first call", (<-firstDone).err, codes.Canceled, "")
		if r := <-dupDone; r.err != nil {
			t.Fatalf("waiting duplicate error = %v, want it to take over and run", r.err)
		}
		wantCalls(t, e, 2)
	})
}
