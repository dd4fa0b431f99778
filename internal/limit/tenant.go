package limit

import "time"

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

// add changes t's requests in flight by d and follows them in held.
func (t *tenant) add(d int) {
	t.inflight += d
	t.held += (float64(t.inflight) - t.held) / 16
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
	// Tenants is the number of tenants sharing the limit.
	Tenants int
	// Fair is the tenant's fair share of the criticality's share of the
	// limit: that share divided by Tenants.
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
// default tenant) for requests of criticality c, as mayAdmit judges it; a
// tenant it does not remember holds nothing (the overflow tenant's
// standing when the named tenants are at their bound). It remembers
// nothing new, so that an observer's question cannot grow the tenants.
func (l *Limiter) TenantShare(now time.Time, c Criticality, key string) TenantShare {
	c = c.valid()
	l.mu.Lock()
	defer l.mu.Unlock()
	ts := &l.ten
	var t *tenant
	switch {
	case key == "":
		t = &ts.def
	case len(key) > MaxTenantName:
		t = &ts.overflow
	default:
		if t = ts.named[key]; t == nil && len(ts.named) >= ts.max {
			t = &ts.overflow
		}
	}
	n := ts.active(now)
	s := TenantShare{Tenants: n, Fair: float64(l.caps[c]) / float64(max(n, 1))}
	if t != nil {
		s.InFlight, s.Held = t.inflight, t.held
	}
	s.Over = n > 1 && (s.Held >= s.Fair || float64(s.InFlight) >= 2*s.Fair)
	return s
}
