package limit

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// tenant is one sender's share of a Limiter.
type tenant struct {
	key      string    // "" for the default and overflow tenants
	inflight int       // admitted and not yet released
	held     float64   // the EWMA (weight 1/16) of inflight, at each admission and end: the share it holds over time
	queued   int       // waiting in the queue
	seen     time.Time // last request
	// prev and next link the named tenants from the most recently seen
	// (tenants.head) to the least (tenants.tail); next also links the free
	// list.
	prev, next *tenant
}

// busy reports whether t holds a slot or waits for one.
func (t *tenant) busy() bool { return t.inflight > 0 || t.queued > 0 }

// add changes t's requests in flight by d and follows them in held, and
// the count of busy tenants in ts.
func (ts *tenants) add(t *tenant, d int) {
	was := t.load()
	t.inflight += d
	t.held += (float64(t.inflight) - t.held) / 16
	ts.follow(t, was)
}

// queue changes t's requests queued by d, and the counts of light and
// heavy tenants.
func (ts *tenants) queue(t *tenant, d int) {
	was := t.load()
	t.queued += d
	ts.follow(t, was)
}

// follow counts t in or out of the light and heavy tenants, whose load
// was was before its requests changed.
func (ts *tenants) follow(t *tenant, was int) {
	ts.count(was, -1)
	ts.count(t.load(), 1)
}

// count adds d to the tenants of load n: light (one request in flight or
// queued) or heavy (more).
func (ts *tenants) count(n, d int) {
	switch {
	case n == 1:
		ts.light += d
	case n > 1:
		ts.heavy += d
	}
}

// over reports whether t, asking for one more slot, is over its fair
// share fair: held on average, or in flight now twice over (a burst the
// average has not yet seen). Such a tenant is shed before any tenant under
// its own share.
func (t *tenant) over(fair float64) bool { return t.held >= fair || float64(t.inflight) >= 2*fair }

// load is what t holds or waits for.
func (t *tenant) load() int { return t.inflight + t.queued }

// fairShare returns how many tenants share a limit of limit slots when t
// asks for one more, and t's fair share of it: the max-min fair share over
// the tenants with requests in flight or queued (t counted with the one it
// asks for), their demands known to two levels. A light tenant (one
// request) holds one slot, which is at most any share; the heavy ones
// (more) share what the light ones leave equally. A tenant that called
// within the idle time and holds nothing is no claimant, and one with a
// single call takes one slot, not a share: dividing the limit by every
// tenant seen (issue 33, finding 4) made 60 tenants calling once every 2s
// shrink each share under a slot, and a tenant at half its share was no
// longer kept from another's flood.
func (ts *tenants) fairShare(t *tenant, limit int) (n int, fair float64) {
	light, heavy := ts.light, ts.heavy
	switch t.load() { // t with the request it asks for
	case 0:
		light++
	case 1:
		light, heavy = light-1, heavy+1
	}
	n = light + heavy
	if heavy == 0 {
		return n, float64(limit)
	}
	return n, float64(limit-light) / float64(heavy)
}

// MaxTenantName is the longest tenant name a Limiter remembers, in bytes:
// longer names share the overflow tenant, so that at most MaxTenants ×
// MaxTenantName bytes of names are held (a caller choosing its tenant
// header could otherwise have each of MaxTenants names pin up to grpc's
// 16MB header list).
const MaxTenantName = 256

// tenants are the senders a Limiter tells apart. A request that names
// none belongs to the default tenant; a named tenant is remembered while it
// has requests in flight or queued, or sent one within the idle time, and
// forgotten after (by the next request, named or not, or Snapshot); at most
// max named tenants of at most MaxTenantName bytes are remembered at once,
// and the names beyond share the overflow tenant. All of it is guarded by
// the Limiter's mutex.
type tenants struct {
	max  int           // immutable
	idle time.Duration // immutable

	def, overflow tenant
	light, heavy  int                // tenants with one request in flight or queued, with more
	named         map[string]*tenant // nil until the first named tenant
	head, tail    *tenant            // the named tenants, most recently seen first
	free          *tenant            // forgotten tenants, for reuse
}

// get returns the tenant of key, seen at now, remembering it when it is
// new (or the overflow tenant when max are remembered already).
func (ts *tenants) get(now time.Time, key string) *tenant {
	ts.sweep(now)
	if key == "" {
		ts.def.seen = now
		return &ts.def
	}
	if len(key) > MaxTenantName {
		ts.overflow.seen = now
		return &ts.overflow
	}
	if t, ok := ts.named[key]; ok {
		t.seen = now
		ts.unlink(t)
		ts.pushFront(t)
		return t
	}
	if len(ts.named) >= ts.max {
		ts.overflow.seen = now
		return &ts.overflow
	}
	t := ts.free
	if t != nil {
		ts.free = t.next
		*t = tenant{}
	} else {
		t = new(tenant)
	}
	t.key, t.seen = key, now
	if ts.named == nil {
		ts.named = make(map[string]*tenant)
	}
	ts.named[key] = t
	ts.pushFront(t)
	return t
}

// sweep forgets, from the least recently seen, the named tenants that have
// been idle for the idle time: neither busy nor seen within it. A busy
// tenant at the tail is seen anew and moves to the front. It stops at the
// first tenant seen within the idle time, so it costs a comparison when
// there is nothing to forget, and each tenant is forgotten (or moved) once
// per idle time: O(1) amortized per request.
func (ts *tenants) sweep(now time.Time) {
	for {
		t := ts.tail
		if t == nil || now.Sub(t.seen) < ts.idle {
			return
		}
		ts.unlink(t)
		if t.busy() {
			t.seen = now
			ts.pushFront(t)
			continue
		}
		delete(ts.named, t.key)
		t.key = ""
		t.next, ts.free = ts.free, t
	}
}

func (ts *tenants) pushFront(t *tenant) {
	t.prev, t.next = nil, ts.head
	if ts.head != nil {
		ts.head.prev = t
	} else {
		ts.tail = t
	}
	ts.head = t
}

func (ts *tenants) unlink(t *tenant) {
	if t.prev != nil {
		t.prev.next = t.next
	} else {
		ts.head = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else {
		ts.tail = t.prev
	}
	t.prev, t.next = nil, nil
}

// active counts the tenants that share the limit at now: every named one
// remembered, and the default and overflow tenants when busy or seen
// within the idle time.
func (ts *tenants) active(now time.Time) int {
	n := len(ts.named)
	for _, t := range [2]*tenant{&ts.def, &ts.overflow} {
		if t.busy() || !t.seen.IsZero() && now.Sub(t.seen) < ts.idle {
			n++
		}
	}
	return n
}

// under counts the active tenants other than t that held fewer than fair
// requests in flight (held), stopping at most: the tenants under their
// fair share of the limit.
func (ts *tenants) under(now time.Time, t *tenant, fair float64, most int) int {
	n := 0
	for _, o := range [2]*tenant{&ts.def, &ts.overflow} {
		if o != t && o.held < fair && (o.busy() || !o.seen.IsZero() && now.Sub(o.seen) < ts.idle) {
			n++
		}
	}
	for o := ts.head; o != nil && n < most; o = o.next {
		if o != t && o.held < fair {
			n++
		}
	}
	return min(n, most)
}

// TenantShare is one tenant's standing in a Limiter at one instant, for an
// operator (Limiter.TenantShare).
type TenantShare struct {
	// Tenants is the number of tenants with requests in flight or queued,
	// the tenant counted with one more request, as admission counts them
	// when it asks for one.
	Tenants int
	// Fair is the tenant's max-min fair share of the criticality's share
	// of the limit among them (tenants.fairShare).
	Fair float64
	// InFlight is the tenant's requests in flight; Held, the moving
	// average of InFlight that admission compares with Fair.
	InFlight int
	Held     float64
	// Over reports what admission decides by: with more than one tenant,
	// Held at or over Fair, or InFlight at or over twice Fair. A tenant
	// over its share is shed before any tenant under its own.
	Over bool
}

// TenantShare returns the standing at now of the tenant key ("" the
// default tenant) for requests of criticality c, as mayAdmitLocked judges
// it when the tenant asks for one more slot; a tenant it does not remember
// holds nothing (the overflow tenant's standing when the named tenants are
// at their bound). It remembers nothing new, so that an observer's question
// cannot grow the tenants.
func (l *Limiter) TenantShare(now time.Time, c Criticality, key string) TenantShare {
	c = c.valid()
	l.mu.Lock()
	defer l.mu.Unlock()
	ts := &l.ten
	var unknown tenant
	t := &unknown
	switch {
	case key == "":
		t = &ts.def
	case len(key) > MaxTenantName:
		t = &ts.overflow
	default:
		if nt := ts.named[key]; nt != nil {
			t = nt
		} else if len(ts.named) >= ts.max {
			t = &ts.overflow
		}
	}
	n, fair := ts.fairShare(t, l.capLocked(now, c))
	return TenantShare{Tenants: n, Fair: fair, InFlight: t.inflight, Held: t.held, Over: n > 1 && t.over(fair)}
}

// OverflowTenant is the name BusyTenants gives the tenant that the names
// beyond MaxTenants (or longer than MaxTenantName) share.
const OverflowTenant = "(other tenants)"

// TenantLoad is one tenant's requests in a Limiter at one instant
// (Limiter.BusyTenants).
type TenantLoad struct {
	// Name is the tenant's name: "" the default tenant, OverflowTenant
	// the tenant the names past the bound share.
	Name string
	// InFlight and Queued are its requests admitted and waiting; Held
	// the moving average of InFlight that admission compares with its
	// fair share.
	InFlight, Queued int
	Held             float64
}

// BusyTenants returns up to n of the tenants with requests in flight or
// queued, the most in flight first (then the most queued, then by name),
// for an operator. It reads at most MaxTenants + 2 tenants under the
// Limiter's lock and remembers nothing.
func (l *Limiter) BusyTenants(n int) []TenantLoad {
	if n <= 0 {
		return nil
	}
	l.mu.Lock()
	ts := &l.ten
	var out []TenantLoad
	add := func(name string, t *tenant) {
		if t.busy() {
			out = append(out, TenantLoad{Name: name, InFlight: t.inflight, Queued: t.queued, Held: t.held})
		}
	}
	add("", &ts.def)
	add(OverflowTenant, &ts.overflow)
	for t := ts.head; t != nil; t = t.next {
		add(t.key, t)
	}
	l.mu.Unlock()
	slices.SortFunc(out, func(a, b TenantLoad) int {
		if c := cmp.Compare(b.InFlight, a.InFlight); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Queued, a.Queued); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out[:min(n, len(out))]
}
