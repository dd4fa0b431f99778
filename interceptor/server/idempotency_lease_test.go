package server

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestIdempotencyLeaseFollowsTheHandler has the regression tests of finding
// 4 of issue 14, against every store: with a 200 ms lease and a 500 ms
// handler, the handler used to run again on another server while the first
// ran; an in-process waiter whose owner lost the key ran it again instead of
// taking the outcome; and an outcome was dropped even when no one had taken
// the key.
func TestIdempotencyLeaseFollowsTheHandler(t *testing.T) {
	forEachStore(t, []idemCase{
		{"RenewedWhileTheHandlerRuns", testIdemLeaseRenewed},
		{"InProcessWaitersTakeTheOutcomeWhenTheKeyWasLost", testIdemLeaseLostWaiters},
		{"OutcomeStoredWhenTheKeyIsAbsent", testIdemLeaseAbsentStored},
	})
}

const (
	idemShortLease  = 200 * time.Millisecond
	idemSlowHandler = 500 * time.Millisecond
)

// idemSlowEcho's handler takes idemSlowHandler (fake time for the memory
// store, real time for Redis) and signals when it starts.
func idemSlowEcho() (*idemEcho, chan struct{}) {
	started := make(chan struct{}, 16)
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		started <- struct{}{}
		time.Sleep(idemSlowHandler)
		return &echov1.EchoResponse{Message: req.Message}, nil
	}}
	return e, started
}

func testIdemLeaseRenewed(t *testing.T, env *idemEnv) {
	e, started := idemSlowEcho()
	idem := Idempotency{Lease: idemShortLease, PollInitial: 10 * time.Millisecond, PollMax: 50 * time.Millisecond}
	idemA, idemB := idem, idem
	idemA.Store, idemB.Store = env.store, env.newStore()
	ccA := idemStart(t, e, idemA)
	ccB := idemStart(t, e, idemB)
	// No deadline on the calls: the lease is the configured 200 ms.
	ctx := context.Background()
	var wg sync.WaitGroup
	var first idemCall
	wg.Go(func() { first = idemDo(ctx, ccA, "k", "m") })
	<-started
	time.Sleep(2 * idemShortLease) // the first lease would have ended
	dup := idemDo(ctx, ccB, "k", "m")
	wg.Wait()
	if first.err != nil || dup.err != nil {
		t.Fatalf("errors = %v, %v, want none", first.err, dup.err)
	}
	wantCalls(t, e, 1)
}

// idemStealStore wraps a store whose Renew reports the key lost, so that
// the lease ends while the handler runs and the test can claim the key as
// another server would.
type idemStealStore struct {
	idempotency.Store
	renews atomic.Int64
	lost   chan struct{} // closed at the first Renew: the server learns the key is lost
	once   sync.Once
}

func newIdemStealStore(s idempotency.Store) *idemStealStore {
	return &idemStealStore{Store: s, lost: make(chan struct{})}
}

func (s *idemStealStore) Renew(ctx context.Context, k idempotency.RecordKey, token string, lease time.Duration) error {
	s.renews.Add(1)
	s.once.Do(func() { close(s.lost) })
	return idempotency.ErrNotOwner // as if the lease had ended: the key is lost
}

func testIdemLeaseLostWaiters(t *testing.T, env *idemEnv) {
	e, started := idemSlowEcho()
	store := newIdemStealStore(env.store)
	cc := idemStart(t, e, Idempotency{Store: store, Lease: idemShortLease})
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make([]idemCall, 4)
	wg.Go(func() { results[0] = idemDo(ctx, cc, "k", "m") })
	<-started
	for i := 1; i < len(results); i++ {
		wg.Go(func() { results[i] = idemDo(ctx, cc, "k", "m") })
	}
	// The lease ends: once the server has learned it (its first renewal
	// says the key is lost), the stored lease is ended on the store's own
	// clock (Redis: its TTLs shortened, not a real-time sleep that a busy
	// machine may outrun), and another server claims the key and keeps it.
	// A record still there would be one claimed since: a duplicate run.
	<-store.lost
	env.advance(2 * idemShortLease)
	other, err := env.newStore().Claim(ctx, idempotency.RecordKey{FullMethod: idemEchoMethod, Key: "k"}, make([]byte, 32), time.Minute)
	if err != nil || other.State != idempotency.Owned {
		t.Fatalf("another server's Claim = %v, %v, want Owned", other.State, err)
	}
	wg.Wait()
	for i, r := range results {
		if r.err != nil {
			t.Errorf("call %d: %v, want the first call's outcome", i, r.err)
		}
	}
	wantCalls(t, e, 1)
	if store.renews.Load() == 0 {
		t.Error("the lease was never renewed")
	}
}

// idemNoRenewStore is a store whose Renew fails: the lease ends.
type idemNoRenewStore struct{ idempotency.Store }

func (idemNoRenewStore) Renew(context.Context, idempotency.RecordKey, string, time.Duration) error {
	return errIdemDown
}

func testIdemLeaseAbsentStored(t *testing.T, env *idemEnv) {
	e, _ := idemSlowEcho()
	cc := idemStart(t, e, Idempotency{Store: idemNoRenewStore{env.store}, Lease: idemShortLease})
	ctx := context.Background()
	if r := idemDo(ctx, cc, "k", "m"); r.err != nil {
		t.Fatal(r.err)
	}
	// The lease ended while the handler ran; no one took the key: the
	// outcome is stored, and a retry is a replay.
	if r := idemDo(ctx, cc, "k", "m"); r.err != nil {
		t.Fatal(r.err)
	}
	wantCalls(t, e, 1)
}

// idemLeaseSpy records the leases of the claims made through it.
type idemLeaseSpy struct {
	idempotency.Store
	mu     sync.Mutex
	leases []time.Duration
}

func (s *idemLeaseSpy) Claim(ctx context.Context, k idempotency.RecordKey, fp []byte, lease time.Duration) (idempotency.Claim, error) {
	s.mu.Lock()
	s.leases = append(s.leases, lease)
	s.mu.Unlock()
	return s.Store.Claim(ctx, k, fp, lease)
}

// TestIdempotencyLeaseIsTheConfiguredLeaseWhateverTheDeadline: a claim's
// lease is the configured one, whatever deadline the caller sent (item 4
// of issue 21: it used to stretch to the caller's deadline, so a caller
// with an hour left made a crashed owner hold the key for that hour);
// renewals keep a longer handler's key.
func TestIdempotencyLeaseIsTheConfiguredLeaseWhateverTheDeadline(t *testing.T) {
	mem, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	spy := &idemLeaseSpy{Store: mem}
	cc := idemStart(t, &idemEcho{}, Idempotency{Store: spy, Lease: idemShortLease})
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if r := idemDo(ctx, cc, "with-deadline", "m"); r.err != nil {
		t.Fatal(r.err)
	}
	if r := idemDo(context.Background(), cc, "without", "m"); r.err != nil {
		t.Fatal(r.err)
	}
	spy.mu.Lock()
	defer spy.mu.Unlock()
	if len(spy.leases) != 2 || spy.leases[0] != idemShortLease || spy.leases[1] != idemShortLease {
		t.Errorf("claim leases = %v, want [%v %v]", spy.leases, idemShortLease, idemShortLease)
	}
}
