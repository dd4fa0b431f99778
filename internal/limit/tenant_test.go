package limit

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// TestTenantOverShareShedFirst: a limit of 10 (9 for CRITICAL, a fair
// share of 4.5 each for two tenants). Tenant A floods: for each of its
// requests that ends it asks twice; tenant B asks once every 4 of A's ends
// and holds each request for 8 of them, so it needs about 2 slots. Over 400
// steps no request of B is refused, the requests in flight never exceed
// 9 + 5 (a tenant under its share may go past the limit by a fair share),
// and A, over its share, is shed to what B leaves.
func TestTenantOverShareShedFirst(t *testing.T) {
	l := fixed(t, 10, 0)
	acquire := func(tenant string) (Slot, bool) {
		s, v, _ := l.Acquire(t0, Request{Tenant: tenant, Left: NoDeadline})
		return s, v == Admitted
	}
	var as []Slot
	type held struct {
		s    Slot
		ends int
	}
	var bs []held
	refusedB, most := 0, 0
	for step := range 400 {
		for range 2 {
			if s, ok := acquire("a"); ok {
				as = append(as, s)
			}
		}
		if step%4 == 0 {
			if s, ok := acquire("b"); ok {
				bs = append(bs, held{s, step + 8})
			} else {
				refusedB++
			}
		}
		most = max(most, l.Snapshot(t0).InFlight)
		if len(as) > 0 {
			l.Release(t0, as[0], time.Millisecond, Ignored)
			as = as[1:]
		}
		for len(bs) > 0 && bs[0].ends <= step {
			l.Release(t0, bs[0].s, time.Millisecond, Ignored)
			bs = bs[1:]
		}
	}
	t.Logf("B refused %d times; at most %d in flight; at the end A holds %d, B %d", refusedB, most, len(as), len(bs))
	if refusedB > 0 {
		t.Errorf("B, under its share, was refused %d times", refusedB)
	}
	if most > 14 {
		t.Errorf("%d in flight at most, want ≤ 14", most)
	}
	if len(as)+len(bs) > 9 {
		t.Errorf("at the end A holds %d and B %d: more than CRITICAL's 9", len(as), len(bs))
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

// TestQueueFairAmongTenants: a full queue holds three waiters of tenant A,
// which holds the whole limit; a request of B, as critical, takes the place
// of one of A's, and is served at once: B is under its fair share.
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
	// B, under its fair share of the limit (1 of 2), takes a slot past the
	// limit at once; A's waiters wait for theirs.
	if !isReady(b) || isReady(as[0]) || isReady(as[1]) {
		t.Errorf("B ready %v, A's ready %v %v; want B served, A waiting", isReady(b), isReady(as[0]), isReady(as[1]))
	}
	l.Abandon(t0, a1)
	for _, w := range append(as, b) {
		if s, ok := l.Leave(w); ok {
			l.Abandon(t0, s)
		}
	}
}

// TestTenantShareMatchesAdmission: TenantShare reads a tenant's standing
// as admission judges it (limit 10, CRITICAL's share 9): alone, a tenant
// takes the share and is shed at it, under its own share; once tenant b
// holds two requests and c one, c takes one slot and the heavy tenants
// share the rest, max-min: noisy's fair share is (9-1)/2 = 4, and its 9 in
// flight are over twice that, so it is over its share when it is shed. Asking about a tenant the limit does not know counts it as
// admission would, and remembers nothing.
func TestTenantShareMatchesAdmission(t *testing.T) {
	l := fixed(t, 10, 0)
	acquire := func(tenant string) Verdict {
		_, v, _ := l.Acquire(t0, Request{Tenant: tenant, Left: NoDeadline})
		return v
	}
	for i := 1; i <= 9; i++ {
		if v := acquire("noisy"); v != Admitted {
			t.Fatalf("noisy alone, request %d: %v, want admitted", i, v)
		}
	}
	if v := acquire("noisy"); v == Admitted {
		t.Fatal("noisy alone: admitted over CRITICAL's share of 9")
	}
	if sh := l.TenantShare(t0, Critical, "noisy"); sh.Over || sh.Tenants != 1 || sh.InFlight != 9 {
		t.Errorf("TenantShare(noisy) alone = %+v, want not over (one tenant), 9 in flight", sh)
	}
	for _, ten := range []string{"b", "b", "c"} {
		if v := acquire(ten); v != Admitted {
			t.Fatalf("tenant %s under its share: %v, want admitted", ten, v)
		}
	}
	if v := acquire("noisy"); v == Admitted {
		t.Fatal("noisy over its share: admitted")
	}
	if sh := l.TenantShare(t0, Critical, "noisy"); !sh.Over || sh.Tenants != 3 || sh.Fair != 4 {
		t.Errorf("TenantShare(noisy) = %+v, want over its fair share of 4 among 3", sh)
	}
	if sh := l.TenantShare(t0, Critical, "b"); sh.Over || sh.InFlight != 2 || sh.Tenants != 3 {
		t.Errorf("TenantShare(b) = %+v, want under its share with 2 in flight, 3 tenants", sh)
	}
	if sh := l.TenantShare(t0, Critical, "unknown"); sh.Over || sh.InFlight != 0 || sh.Tenants != 4 {
		t.Errorf("TenantShare(unknown) = %+v, want not over, nothing in flight, 4 tenants with it", sh)
	}
	if n := l.Snapshot(t0).Tenants; n != 3 {
		t.Errorf("after TenantShare of an unknown tenant, %d tenants, want 3 (nothing remembered)", n)
	}
}

// TestBusyTenantsListsTheBusiestFirst: BusyTenants lists the tenants with
// requests in flight, the most first, at most n of them, the default
// tenant as "" and the names past the bound as OverflowTenant; idle
// tenants are left out.
func TestBusyTenantsListsTheBusiestFirst(t *testing.T) {
	l := mustNew(t, Config{InitialLimit: 100, MinLimit: 100, MaxLimit: 100, MaxTenants: 2})
	// a and b are the 2 named tenants remembered; c and d, past the bound,
	// share the overflow tenant.
	for _, tn := range []struct {
		name string
		n    int
	}{{"a", 3}, {"b", 1}, {"", 2}, {"c", 4}} {
		for range tn.n {
			admit(t, l, Request{Tenant: tn.name, Left: NoDeadline})
		}
	}
	s := admit(t, l, Request{Tenant: "d", Left: NoDeadline})
	l.Abandon(t0, s) // d's one request ended: the overflow tenant holds c's 4
	got := l.BusyTenants(10)
	want := []TenantLoad{{Name: OverflowTenant, InFlight: 4}, {Name: "a", InFlight: 3}, {Name: "", InFlight: 2}, {Name: "b", InFlight: 1}}
	if len(got) != len(want) {
		t.Fatalf("BusyTenants(10) = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].Name != want[i].Name || got[i].InFlight != want[i].InFlight || got[i].Queued != 0 || got[i].Held <= 0 {
			t.Errorf("BusyTenants(10)[%d] = %+v, want %+v with a held average", i, got[i], want[i])
		}
	}
	if top := l.BusyTenants(2); len(top) != 2 || top[0].Name != OverflowTenant || top[1].Name != "a" {
		t.Errorf("BusyTenants(2) = %+v, want the overflow tenant and a", top)
	}
	if none := l.BusyTenants(0); none != nil {
		t.Errorf("BusyTenants(0) = %+v, want nil", none)
	}
}

// TestTenantCountsFollowEveryStep: the counts of light and heavy tenants
// (one request in flight or queued, more), which admission's fair share
// reads and which each step keeps up as it goes (tenants.add, queue), are
// the counts of the tenants as they are, after every step of a seeded run
// of admissions, queued requests granted, displaced or leaving,
// releases, abandons and idle tenants forgotten, with more tenant names
// than the limit remembers: a step that moved a tenant's requests without
// its count would shift every tenant's share for good.
func TestTenantCountsFollowEveryStep(t *testing.T) {
	l := mustNew(t, Config{InitialLimit: 6, MinLimit: 6, MaxLimit: 6, MaxQueue: 4, MaxTenants: 5, TenantIdle: 50 * time.Millisecond})
	rnd := rand.New(rand.NewPCG(33, 4))
	now := t0
	var slots []Slot
	var waiters []*Waiter
	check := func(step int, what string) {
		t.Helper()
		l.mu.Lock()
		defer l.mu.Unlock()
		ts := &l.ten
		light, heavy := 0, 0
		count := func(tn *tenant) {
			switch n := tn.load(); {
			case n == 1:
				light++
			case n > 1:
				heavy++
			}
		}
		count(&ts.def)
		count(&ts.overflow)
		for _, tn := range ts.named {
			count(tn)
		}
		if light != ts.light || heavy != ts.heavy {
			t.Fatalf("step %d (%s): counts light %d, heavy %d; the tenants have %d and %d", step, what, ts.light, ts.heavy, light, heavy)
		}
	}
	names := []string{"", "a", "b", "c", "d", "e", "f", "g", "h"}
	for step := range 5000 {
		now = now.Add(time.Duration(rnd.IntN(20)) * time.Millisecond)
		r := Request{Tenant: names[rnd.IntN(len(names))], Crit: Criticality(rnd.IntN(int(NumCriticalities))), Left: NoDeadline}
		var what string
		switch op := rnd.IntN(10); {
		case op < 4:
			what = "acquire"
			if s, v, _ := l.Acquire(now, r); v == Admitted {
				slots = append(slots, s)
			} else if w, ok := l.Enqueue(now, r); ok {
				what = "enqueue"
				waiters = append(waiters, w)
			}
		case op < 7 && len(slots) > 0:
			i := rnd.IntN(len(slots))
			what = "release"
			if rnd.IntN(2) == 0 {
				l.Release(now, slots[i], time.Duration(1+rnd.IntN(10))*time.Millisecond, Completed)
			} else {
				what = "abandon"
				l.Abandon(now, slots[i])
			}
			slots = append(slots[:i], slots[i+1:]...)
		case len(waiters) > 0:
			i := rnd.IntN(len(waiters))
			what = "leave"
			if s, ok := l.Leave(waiters[i]); ok {
				slots = append(slots, s)
			}
			waiters = append(waiters[:i], waiters[i+1:]...)
		}
		check(step, what)
	}
	for _, w := range waiters {
		if s, ok := l.Leave(w); ok {
			slots = append(slots, s)
		}
	}
	for _, s := range slots {
		l.Abandon(now, s)
	}
	check(-1, "the end")
	if sn := l.Snapshot(now); sn.InFlight != 0 || sn.Queued != 0 {
		t.Errorf("at the end: %d in flight, %d queued; want nothing held", sn.InFlight, sn.Queued)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ten.light != 0 || l.ten.heavy != 0 {
		t.Errorf("at the end: light %d, heavy %d tenants; want 0 and 0", l.ten.light, l.ten.heavy)
	}
}
