package limit

import (
	"strconv"
	"testing"
	"time"
)

// TestTenantOverShareShedFirst: a limit of 10 (9 for CRITICAL); tenant B
// sent a request, then tenant A floods. A may fill all but the slot kept for
// B, who is under its fair share (4.5 of 9). B is then admitted up to its
// fair share whatever A holds (5 slots: 13 in flight, under twice 9), and A,
// over its share, is shed until its requests drain below its fair share:
// then each holds 5, its share rounded up.
func TestTenantOverShareShedFirst(t *testing.T) {
	l := fixed(t, 10, 0)
	b := admit(t, l, Request{Tenant: "b", Left: NoDeadline})
	l.Release(t0, b, time.Millisecond, Ignored)
	acquire := func(tenant string) (Slot, bool) {
		s, v, _ := l.Acquire(t0, Request{Tenant: tenant, Left: NoDeadline})
		return s, v == Admitted
	}
	var as []Slot
	for {
		s, ok := acquire("a")
		if !ok {
			break
		}
		as = append(as, s)
	}
	if len(as) != 8 {
		t.Fatalf("A took %d slots, want 8 (one kept for B)", len(as))
	}
	bs := 0
	for {
		if _, ok := acquire("b"); !ok {
			break
		}
		bs++
	}
	if in := l.Snapshot(t0).InFlight; bs != 5 || in != 13 {
		t.Fatalf("B took %d slots, %d in flight; want 5 (over its fair share of 4.5) and 13", bs, in)
	}
	for range 20 { // A's requests end one by one, and A asks again
		l.Release(t0, as[0], time.Millisecond, Ignored)
		as = as[1:]
		if s, ok := acquire("a"); ok {
			as = append(as, s)
		}
	}
	if in := l.Snapshot(t0).InFlight; len(as) != 5 || in != 10 {
		t.Errorf("A holds %d, %d in flight; want 5 and 10", len(as), in)
	}
}

// TestOneTenantKeepsShares: with a single named tenant the limit behaves
// as without tenants.
func TestOneTenantKeepsShares(t *testing.T) {
	l := fixed(t, 10, 0)
	n := 0
	for {
		if _, v, _ := l.Acquire(t0, Request{Tenant: "only", Left: NoDeadline}); v != Admitted {
			break
		}
		n++
	}
	if n != 9 {
		t.Errorf("one tenant took %d slots, want CRITICAL's 9", n)
	}
}

// TestTenantsBoundedAndForgotten: 10,000 tenants, one request each; at most
// MaxTenants are remembered at once (the others share the overflow
// tenant), and once idle for TenantIdle they are all forgotten.
func TestTenantsBoundedAndForgotten(t *testing.T) {
	l := mustNew(t, Config{MaxTenants: 100, TenantIdle: time.Second})
	now := t0
	for i := range 10000 {
		now = now.Add(50 * time.Microsecond)
		s, v, _ := l.Acquire(now, Request{Tenant: "t" + strconv.Itoa(i), Left: NoDeadline})
		if v != Admitted {
			t.Fatalf("request %d: %v", i, v)
		}
		l.Release(now, s, time.Millisecond, Completed)
		if n := len(l.ten.named); n > 100 {
			t.Fatalf("after %d tenants: %d remembered, want at most 100", i+1, n)
		}
	}
	if got := l.Snapshot(now).Tenants; got < 100 {
		t.Errorf("Tenants = %d right after, want the 100 remembered and the overflow", got)
	}
	later := now.Add(time.Second)
	if sn := l.Snapshot(later); sn.Tenants != 0 || len(l.ten.named) != 0 {
		t.Errorf("a second later: %d tenants, %d remembered; want none", sn.Tenants, len(l.ten.named))
	}
	// A busy tenant is not forgotten, however long its request runs.
	s, _, _ := l.Acquire(later, Request{Tenant: "long", Left: NoDeadline})
	if sn := l.Snapshot(later.Add(time.Hour)); sn.Tenants != 1 {
		t.Errorf("an hour into a request: %d tenants, want 1", sn.Tenants)
	}
	l.Release(later.Add(time.Hour), s, time.Millisecond, Ignored)
	if sn := l.Snapshot(later.Add(time.Hour + time.Second)); sn.Tenants != 0 {
		t.Errorf("idle after it: %d tenants, want 0", sn.Tenants)
	}
}

// TestQueueFairAmongTenants: a full queue holds three waiters of tenant A;
// a request of B, as critical, takes the place of one of A's, and the next
// slot freed goes to B, which has fewer in flight.
func TestQueueFairAmongTenants(t *testing.T) {
	l := fixed(t, 2, 3)
	a1 := admit(t, l, Request{Tenant: "a", Crit: CriticalPlus, Left: NoDeadline})
	admit(t, l, Request{Tenant: "a", Crit: CriticalPlus, Left: NoDeadline})
	var as []*Waiter
	for range 3 {
		w, ok := l.Enqueue(t0, Request{Tenant: "a", Crit: CriticalPlus, Left: NoDeadline})
		if !ok {
			t.Fatal("A's waiter refused")
		}
		as = append(as, w)
	}
	b, ok := l.Enqueue(t0, Request{Tenant: "b", Crit: CriticalPlus, Left: NoDeadline})
	if !ok || !isReady(as[2]) {
		t.Fatalf("B refused (%v) or A's newest not displaced (%v)", !ok, isReady(as[2]))
	}
	l.Release(t0, a1, time.Millisecond, Completed)
	if !isReady(b) || isReady(as[0]) {
		t.Errorf("after a release: B ready %v, A's oldest ready %v; want B served first", isReady(b), isReady(as[0]))
	}
	for _, w := range append(as, b) {
		if s, ok := l.Leave(w); ok {
			l.Abandon(t0, s)
		}
	}
}
