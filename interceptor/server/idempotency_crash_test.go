package server

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestIdempotencyCrashedOwnerBlocksDuplicatesForOneLease pins item 4 of
// issue 21, against every store: the claim was stretched to the caller's
// deadline, so with a 1 s lease and a caller with an hour left, a
// duplicate on another replica stayed blocked long after the owner died
// (the caller chose the lock's length). Now the claim is for the lease,
// renewed while the owner lives: a duplicate runs the call one lease after
// the owner's last renewal at the latest.
func TestIdempotencyCrashedOwnerBlocksDuplicatesForOneLease(t *testing.T) {
	forEachStore(t, []idemCase{{"OwnerWithAnHourLeft", testIdemCrashedOwnerOneLease}})
}

// idemCrashLease is the lease of TestIdempotencyCrashedOwnerBlocksDuplicatesForOneLease.
const idemCrashLease = time.Second

// idemDeadRenewals wraps a store whose Renew never reaches it: the owner's
// renewals have stopped, as a crashed process's do.
type idemDeadRenewals struct{ idempotency.Store }

func (idemDeadRenewals) Renew(context.Context, idempotency.RecordKey, string, time.Duration) error {
	return nil
}

func testIdemCrashedOwnerOneLease(t *testing.T, env *idemEnv) {
	if env.joined {
		t.Skip("joined mode has no lease: a dead owner's transaction is rolled back when its connection closes; " +
			"TestIdempotencyJoinedDeadOwnerFreesTheKeyAtOnce pins it")
	}
	// Server A: its handler never returns (until the test ends) and its
	// renewals never reach the store: a replica that died mid-call.
	started, hold := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait() // after hold is closed: deferred calls run last first
	var release sync.Once
	defer release.Do(func() { close(hold) })
	dead := &idemEcho{fn: func(context.Context, *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		close(started)
		<-hold
		return &echov1.EchoResponse{Message: "late"}, nil
	}}
	idem := Idempotency{Lease: idemCrashLease, PollInitial: 10 * time.Millisecond, PollMax: 100 * time.Millisecond}
	idemA, idemB := idem, idem
	idemA.Store, idemB.Store = idemDeadRenewals{env.store}, env.newStore()
	ccA := idemStart(t, dead, idemA)
	alive := &idemEcho{}
	ccB := idemStart(t, alive, idemB)

	hour, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	wg.Go(func() { _ = idemDo(hour, ccA, "k", "m") })
	<-started
	claimed := time.Now()

	// The duplicate on replica B has 10 s: before the fix it was blocked
	// for all of them (the claim lasted the first caller's hour).
	ten, cancelTen := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelTen()
	dup := idemDo(ten, ccB, "k", "m")
	blocked := time.Since(claimed)
	t.Logf("a duplicate on another replica was blocked %v by an owner that died with an hour left (lease %v)", blocked, idemCrashLease)
	if dup.err != nil {
		t.Fatalf("duplicate on replica B = %v after %v, want it to run the call once the lease ended", dup.err, blocked)
	}
	wantCalls(t, alive, 1)
	if bound := idemCrashLease + 500*time.Millisecond; blocked > bound {
		t.Errorf("duplicate blocked %v, want at most the lease and a poll, %v", blocked, bound)
	}
	release.Do(func() { close(hold) })
}
