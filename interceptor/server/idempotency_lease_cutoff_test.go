package server

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestIdempotencyDetachedHandlerCancelledBeforeADuplicateCanClaim pins the
// bound of a detached handler whose renewals cannot reach the store (a
// partition between one replica and Redis, or a stalled Redis), against
// every store. The docs said its context is cancelled when the lease is
// lost, but it was cancelled only when a renewal came back with "not the
// owner": with renewals that failed or timed out, it never was (until the
// server's 30 s maximum), and a duplicate on another replica claimed the
// expired key and ran the call while the first handler's context was still
// live: two executions, neither told to stop. Now the handler's context
// ends at nine tenths of its lease without a renewal, before the store's
// lease ends, so the duplicate never starts while it is live.
func TestIdempotencyDetachedHandlerCancelledBeforeADuplicateCanClaim(t *testing.T) {
	forEachStore(t, []idemCase{
		{"RenewalsFail", func(t *testing.T, env *idemEnv) {
			testIdemCutoff(t, env, idemNoRenewStore{env.store}, false)
		}},
		{"RenewalsStall", func(t *testing.T, env *idemEnv) {
			testIdemCutoff(t, env, idemStalledRenewals{env.store}, false)
		}},
		// Issue 33, finding 2: a store that ignores its context (go-redis
		// by default, for socket I/O) held the cutoff, which was checked
		// only once Renew returned.
		{"RenewalsHangWhateverTheContext", func(t *testing.T, env *idemEnv) {
			hung := idemHungRenewals{Store: env.store, release: make(chan struct{})}
			defer close(hung.release) // before the test's end, for goleak
			testIdemCutoff(t, env, hung, false)
		}},
		// An attached handler (Idempotency.AttachedHandler) was never cut
		// off: its context was the caller's alone.
		{"AttachedRenewalsHang", func(t *testing.T, env *idemEnv) {
			hung := idemHungRenewals{Store: env.store, release: make(chan struct{})}
			defer close(hung.release)
			testIdemCutoff(t, env, hung, true)
		}},
	})
}

// idemHungRenewals is a store whose Renew hangs until release is closed,
// whatever its context says.
type idemHungRenewals struct {
	idempotency.Store
	release chan struct{}
}

func (s idemHungRenewals) Renew(context.Context, idempotency.RecordKey, string, time.Duration) error {
	<-s.release
	return errors.New("hung store")
}

// idemStalledRenewals is a store whose Renew never answers: it returns
// when its context ends, as a call to a stopped Redis does.
type idemStalledRenewals struct{ idempotency.Store }

func (idemStalledRenewals) Renew(ctx context.Context, _ idempotency.RecordKey, _ string, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

func testIdemCutoff(t *testing.T, env *idemEnv, cut idempotency.Store, attached bool) {
	if env.joined {
		t.Skip("joined mode has no lease to cut off: the owner's open transaction holds the key until it ends, and a " +
			"duplicate on another replica gets ABORTED instead of polling (TestIdempotencyJoinedDuplicateWaitsForTheOwnersCommit, " +
			"TestIdempotencyJoinedDeadOwnerFreesTheKeyAtOnce)")
	}
	// The margin, a tenth of the lease, covers the lateness of the
	// renewal's timer on a loaded test machine with -race.
	const lease = 1500 * time.Millisecond
	var mu sync.Mutex
	var first context.Context // the first handler's
	var firstErrAtSecond error
	ran := 0
	started := make(chan struct{}, 1)
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		mu.Lock()
		ran++
		if first != nil {
			firstErrAtSecond = first.Err()
			mu.Unlock()
			return &echov1.EchoResponse{Message: "second"}, nil
		}
		first = ctx
		mu.Unlock()
		started <- struct{}{}
		select {
		case <-ctx.Done(): // a handler that stops when told
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-time.After(4 * lease):
			return &echov1.EchoResponse{Message: "first"}, nil
		}
	}}
	idem := Idempotency{Lease: lease, PollInitial: 10 * time.Millisecond, PollMax: 20 * time.Millisecond}
	idemA, idemB := idem, idem
	idemA.AttachedHandler = attached
	idemA.Store = cut            // cut off from the store's renewals
	idemB.Store = env.newStore() // another replica
	ccA := idemStart(t, e, idemA)
	ccB := idemStart(t, e, idemB)
	var wg sync.WaitGroup
	var a idemCall
	wg.Go(func() { a = idemDo(context.Background(), ccA, "k", "m") })
	<-started
	b := idemDo(idemCtx(t), ccB, "k", "m") // polls until the first lease has ended, then runs
	wg.Wait()
	if b.err != nil {
		t.Fatalf("duplicate on the other replica: %v", b.err)
	}
	mu.Lock()
	defer mu.Unlock()
	if ran != 2 || firstErrAtSecond != context.Canceled {
		t.Errorf("handler ran %d times; when the duplicate started, the first handler's context Err = %v, want Canceled",
			ran, firstErrAtSecond)
	}
	wantCode(t, "first call, its handler cancelled", a.err, codes.Canceled, "")
}
