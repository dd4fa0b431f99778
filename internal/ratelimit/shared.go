package ratelimit

import (
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// FallbackMode is what a Shared limiter decides while its store cannot be
// reached, for the calls its leased tokens do not cover.
type FallbackMode uint8

const (
	// FallbackLocalShare limits each key to the rate divided by the
	// replicas that leased tokens of it recently (at least 1), with the
	// burst divided likewise (at least 1): the replicas together keep about
	// the rate, if they are as many as they were.
	FallbackLocalShare FallbackMode = iota
	// FallbackOpen admits every call: no limit at all while the store is
	// unreachable.
	FallbackOpen
	// FallbackClosed refuses every call, with the time until the next
	// probe of the store as the wait (a probe interval once that time has
	// passed and the probe is on its way).
	FallbackClosed
)

// Defaults of SharedConfig.
const (
	DefaultLeasePeriod   = 200 * time.Millisecond
	DefaultProbeInterval = 250 * time.Millisecond
	DefaultReplicaWindow = 10 * time.Second
)

// SharedConfig is a rate limit shared by the replicas of a server through
// a store that leases its tokens (see the package doc, "Shared limits").
type SharedConfig struct {
	Config
	// LeasePeriod is L: how far ahead of the store's clock the leases of
	// a key may reach (the store's schedule runs at most L past the
	// burst), so a replica that dies takes at most L of the quota with
	// it. A replica asks for what it expects to spend in L/2, at most L of
	// the rate. 0 means DefaultLeasePeriod (200ms).
	LeasePeriod time.Duration
	// Fallback is what the limiter does while the store is unreachable.
	Fallback FallbackMode
	// ProbeInterval is how often a lease is asked while the store is
	// unreachable, to find out that it is back. 0 means
	// DefaultProbeInterval (250ms).
	ProbeInterval time.Duration
	// ReplicaWindow is how long a replica counts among those sharing a key
	// after its last lease of it, for the local share. 0 means
	// DefaultReplicaWindow (10s).
	ReplicaWindow time.Duration
}

// Lease is a request for tokens that a Shared limiter hands its caller to
// send to the store. The store's answer, or its failure, goes back through
// Shared.Deliver. At most one Lease per key is in flight.
type Lease struct {
	// Key is the key whose tokens are asked for; "" for Overflow.
	Key string
	// Overflow: the tokens are the overflow bucket's, which every key
	// beyond MaxKeys (or longer than MaxKeyLen) shares on this replica.
	// The store keeps one bucket for it, apart from every key's (the
	// empty key's included), so that the keys beyond the bound share one
	// quota over the replicas too, rather than each drawing on the
	// bucket of whichever key was decided when a lease was due.
	Overflow bool
	// Interval is the emission interval t, Tau the burst's length
	// (Burst·t), and Horizon how far the store's schedule may run ahead
	// of its clock, burst included, after this lease: TAT − now ≤ Tau +
	// Horizon.
	Interval, Tau, Horizon time.Duration
	// Want is how many tokens the replica asks for; the store grants
	// fewer when fewer fit within the horizon, and none when fewer than
	// Min fit.
	Want, Min int
	// ReplicaWindow is how long the store remembers this replica among
	// the key's.
	ReplicaWindow time.Duration

	e    *entry[sharedKey]
	done chan struct{} // closed by Deliver
}

// Grant is a store's answer to a Lease.
type Grant struct {
	// Tokens is how many tokens were granted; 0: none, ask again after
	// RetryAfter.
	Tokens int
	// FirstSlot is when the first token may be used, relative to the
	// store's clock when it granted them (0 or less: at once); each
	// further token one Interval later: the GCRA admission times of the
	// tokens on the store's schedule.
	FirstSlot time.Duration
	// RetryAfter is, for a refusal, how long until Min tokens fit.
	RetryAfter time.Duration
	// Left is how many tokens the store's bucket held after the grant
	// (for the criticality reserves).
	Left int
	// Replicas is how many replicas leased tokens of the key within the
	// ReplicaWindow, this one included.
	Replicas int
}

// SharedDecision is a Shared limiter's decision on one call.
type SharedDecision struct {
	// OK: admitted.
	OK bool
	// Wait is, for a refused call, how long until this replica expects
	// to admit one: the next held token's slot, or when the store said
	// to ask again.
	Wait time.Duration
	// Pending, when not nil, means neither: no token is held and a lease
	// is on its way. The caller waits for it to be closed (bounded by its
	// own deadline and the store's timeout) and decides again.
	Pending <-chan struct{}
	// Fallback: decided by the fallback mode, the store being unreachable.
	Fallback bool
}

// Transition is what a Deliver or Expire changed in the store's health,
// for a log line and a metric.
type Transition uint8

const (
	// NoTransition: the store was and is reachable, or was and is not.
	NoTransition Transition = iota
	// EnteredFallback: the store became unreachable.
	EnteredFallback
	// LeftFallback: the store answered again.
	LeftFallback
)

// lease is a run of leased tokens at consecutive slots of the store's
// schedule, in local nanoseconds after the epoch.
type lease struct {
	next  int64 // the slot of the next token
	n     int64 // tokens left
	until int64 // after it, the tokens left are forfeited
}

// sharedKey is one key's state in a Shared limiter, guarded by mu.
type sharedKey struct {
	mu     sync.Mutex
	dead   bool     // forgotten by a sweep: look the key up again
	leases [2]lease // held, the earlier slot first; nl of them
	nl     int
	// demand counts the calls (admitted or not) in the lease period that
	// started at demandAt, and prevDemand those of the period before.
	demandAt           int64
	demand, prevDemand int64
	fetch              *Lease // in flight; nil when none
	retryAt            int64  // the store refused: no lease asked before
	fbTAT              int64  // the local share's TAT, in fallback
	fbSince            int64  // the fallback fbTAT belongs to (Shared.failSince)
	replicas           int    // at the last grant; 0: none yet
	storeLeft          int64  // tokens the store held after the last grant
}

// Shared is a rate limit shared by the replicas of a server: each
// replica leases batches of tokens from a store that runs GCRA on the
// whole quota (see the package doc), and decides calls from what it holds
// without asking the store. It does no I/O: Decide hands back a Lease to
// send when one is due, and Deliver takes the answer. It is safe for
// concurrent use.
type Shared struct {
	p        params
	epoch    time.Time
	fallback FallbackMode
	period   int64 // the demand window, L/2, ns
	probe    int64 // ns
	window   time.Duration
	horizon  int64 // L, the lease period, ns
	maxBatch int64 // tokens: L at the rate, at least 1
	minGrant int64 // tokens: L/10 at the rate, at least 1
	// reserve[c] is, in tokens, what a call of c must leave (package doc,
	// "Criticality").
	reserve [NumCriticalities]float64
	burst   int64

	keys keys[sharedKey]

	failing   atomic.Bool
	failSince atomic.Int64 // when the fallback began
	probeAt   atomic.Int64 // in fallback: no lease asked before
	replicas  atomic.Int64 // the most replicas any grant reported
	forfeited atomic.Int64 // tokens leased and never spent
}

// NewShared returns a Shared limiter for cfg, its epoch now.
func NewShared(cfg SharedConfig, now time.Time) (*Shared, error) {
	p, err := cfg.params()
	if err != nil {
		return nil, err
	}
	switch {
	case cfg.LeasePeriod < 0:
		return nil, errors.New("ratelimit: LeasePeriod must not be negative")
	case cfg.ProbeInterval < 0:
		return nil, errors.New("ratelimit: ProbeInterval must not be negative")
	case cfg.ReplicaWindow < 0:
		return nil, errors.New("ratelimit: ReplicaWindow must not be negative")
	case cfg.Fallback > FallbackClosed:
		return nil, errors.New("ratelimit: unknown Fallback")
	}
	s := &Shared{p: p, epoch: now, fallback: cfg.Fallback, burst: int64(cfg.Burst),
		horizon: int64(orDefault(cfg.LeasePeriod, DefaultLeasePeriod)),
		probe:   int64(orDefault(cfg.ProbeInterval, DefaultProbeInterval)),
		window:  orDefault(cfg.ReplicaWindow, DefaultReplicaWindow)}
	s.period = max(1, s.horizon/2)
	perPeriod := float64(s.period) / float64(p.t)
	s.maxBatch = max(1, int64(math.Ceil(2*perPeriod)))
	s.minGrant = max(1, int64(math.Ceil(perPeriod/5)))
	for c := range NumCriticalities {
		s.reserve[c] = (1 - BurstShare[c]) * float64(cfg.Burst-1)
	}
	max := cfg.MaxKeys
	if max == 0 {
		max = DefaultMaxKeys
	}
	s.keys.init(max, s.forget)
	return s, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// Interval returns the emission interval.
func (s *Shared) Interval() time.Duration { return time.Duration(s.p.t) }

// Decide decides a call of criticality c for key at now. When a lease is
// due (the key's tokens run low and none is in flight), it returns one for
// the caller to send to the store and Deliver; the decision does not wait
// for it unless Pending says so.
func (s *Shared) Decide(now time.Time, key string, c Criticality) (SharedDecision, *Lease) {
	n := int64(now.Sub(s.epoch))
	c = c.valid()
	for {
		e := s.keys.get(n, s.p.t, key)
		st := &e.v
		st.mu.Lock()
		if st.dead {
			st.mu.Unlock()
			continue
		}
		d, req := s.decideLocked(n, key, e, c)
		st.mu.Unlock()
		return d, req
	}
}

func (s *Shared) decideLocked(n int64, key string, e *entry[sharedKey], c Criticality) (SharedDecision, *Lease) {
	st := &e.v
	st.count(n, s.period)
	if lost := st.forfeit(n); lost > 0 {
		s.forfeited.Add(lost)
	}
	var d SharedDecision
	failing := s.failing.Load()
	ok, wait := st.take(n, s.p.t, s.reserve[c])
	d.OK = ok
	req := s.ask(n, key, e)
	switch {
	case ok: // a held token: this replica's, in fallback too
	case failing:
		d.Fallback = true
		var w int64
		d.OK, w = s.fallbackTake(n, st, c)
		if !d.OK && st.nl > 0 {
			w = min(w, max(wait, 0))
		}
		d.Wait = time.Duration(max(w, 0))
	case st.nl > 0:
		d.Wait = time.Duration(max(wait, 0))
	case st.fetch != nil:
		d.Pending = st.fetch.done
	default: // the store refused: it said when to come back
		d.Wait = time.Duration(max(st.retryAt-n, 0) + s.p.t)
	}
	return d, req
}

// count adds a call at n to the demand of the current lease period.
func (st *sharedKey) count(n, period int64) {
	switch {
	case n-st.demandAt >= 2*period:
		st.prevDemand, st.demand, st.demandAt = 0, 0, n
	case n-st.demandAt >= period:
		st.prevDemand, st.demand, st.demandAt = st.demand, 0, st.demandAt+period
	}
	st.demand++
}

// forfeit drops the leases whose time is over and returns the tokens they
// still held.
func (st *sharedKey) forfeit(n int64) (lost int64) {
	for st.nl > 0 && n > st.leases[0].until {
		lost += st.leases[0].n
		st.drop()
	}
	if st.nl == 2 && n > st.leases[1].until {
		lost += st.leases[1].n
		st.nl = 1
	}
	return lost
}

func (st *sharedKey) drop() {
	st.leases[0] = st.leases[1]
	st.leases[1] = lease{}
	st.nl--
}

// held returns the tokens held, those of future slots included.
func (st *sharedKey) held() int64 {
	var h int64
	for i := range st.nl {
		h += st.leases[i].n
	}
	return h
}

// take spends the earliest held token whose slot has come, when the
// tokens left after it (those whose slot has come, and those the store
// had left at the last grant) are at least reserve. Refused, wait is the
// time until it would be, from the held tokens alone (-1: none held).
func (st *sharedKey) take(n, t int64, reserve float64) (bool, int64) {
	if st.nl == 0 {
		return false, -1
	}
	var avail int64
	for i := range st.nl {
		l := &st.leases[i]
		if n >= l.next {
			avail += min(l.n, (n-l.next)/t+1)
		}
	}
	if avail == 0 {
		return false, st.leases[0].next - n
	}
	if float64(avail-1+st.storeLeft) < reserve {
		// The reserve is short by k tokens: they come with the next k
		// slots after those that have come (of the earliest lease; a
		// later one only shortens the wait), at least an interval away.
		k := int64(math.Ceil(reserve - float64(avail-1+st.storeLeft)))
		l := &st.leases[0]
		return false, max(l.next+(min(avail, l.n)+k-1)*t-n, t)
	}
	for i := range st.nl {
		l := &st.leases[i]
		if n >= l.next && l.n > 0 {
			l.next += t
			l.n--
			if l.n == 0 {
				if i == 0 {
					st.drop()
				} else {
					st.nl = 1
				}
			}
			return true, 0
		}
	}
	return false, -1 // unreachable: avail > 0
}

// ask returns the lease to send for e at n, when one is due: none is in
// flight, the store did not say to wait, fewer than two leases are held,
// and they hold less than half of what the key is expected to need; in
// fallback, only once per probe interval for the whole limiter.
func (s *Shared) ask(n int64, key string, e *entry[sharedKey]) *Lease {
	st := &e.v
	want := s.want(max(st.demand, st.prevDemand, 1))
	if st.fetch != nil || n < st.retryAt || st.nl == 2 || 2*st.held() >= want {
		return nil
	}
	if s.failing.Load() {
		at := s.probeAt.Load()
		if n < at || !s.probeAt.CompareAndSwap(at, n+s.probe) {
			return nil
		}
	}
	l := &Lease{Key: key, Interval: time.Duration(s.p.t), Tau: time.Duration(s.p.tau), Horizon: time.Duration(s.horizon),
		Want: int(want), Min: int(min(want, s.minGrant)), ReplicaWindow: s.window, e: e, done: make(chan struct{})}
	if e == &s.keys.over {
		l.Key, l.Overflow = "", true
	}
	st.fetch = l
	return l
}

// want sizes a lease for a demand of calls per lease period: what the
// replica expects to spend in a period, at most maxBatch, and, when it is
// slower than the rate, no more than it spends within lateBudget × P of
// the tokens' slots: a lease's tokens have consecutive slots, one per t, and
// a replica that spends them at its own pace λ < 1/t spends the last one
// w·(1/λ − t) after its slot. A token spent after its slot is what lets a
// window of time see more than the rate (the package doc's bound), so the
// quiet replicas lease small batches, and the busy ones large.
func (s *Shared) want(demand int64) int64 {
	w := min(demand, s.maxBatch)
	lam := float64(demand) / float64(s.period) // calls per ns
	if x := lam * float64(s.p.t); x < 1 {
		w = min(w, max(1, int64(lateBudget*float64(s.period)*lam/(1-x))))
	}
	return w
}

// lateBudget is, as a share of the lease period, how long after its slot
// a replica slower than the rate expects to spend the last token of a
// lease (see want). In TestSharedFourReplicasExactEachSecond, half a
// period keeps the flooded tenant's count of each second within ±1.2% of
// the rate at one round trip per 27 admitted calls, and the tenant at its
// limit (each replica slower than the rate) at one per 15; a quarter gives
// ±1.7%, and twice the round trips to the tenant at its limit.
const lateBudget = 0.5

// fallbackTake decides a call at n while the store is unreachable.
func (s *Shared) fallbackTake(n int64, st *sharedKey, c Criticality) (bool, int64) {
	switch s.fallback {
	case FallbackOpen:
		return true, 0
	case FallbackClosed:
		if w := s.probeAt.Load() - n; w > 0 {
			return false, w
		}
		// The probe's instant has passed: a probe is in flight (a store
		// that hangs holds it for the caller's lease timeout, which may
		// pass the probe interval) or due at the key's next lease. Its
		// answer is not for now: come back after a probe interval, never
		// at once.
		return false, s.probe
	}
	r := int64(st.replicas)
	if r == 0 {
		r = max(1, s.replicas.Load())
	}
	t := s.p.t * r
	b := max(1, s.burst/r)
	if since := s.failSince.Load(); st.fbSince != since {
		// A fallback starts with an empty local bucket: the replicas spend
		// the leases they hold first, so a burst on top would pass the
		// rate by the sum of the local bursts too.
		st.fbSince, st.fbTAT = since, since+b*t
	}
	room := b*t - int64(math.Round((1-BurstShare[c])*float64(b-1)*float64(t)))
	next := max(st.fbTAT, n) + t
	if wait := next - n - room; wait > 0 {
		return false, wait
	}
	st.fbTAT = next
	return true, 0
}

// Deliver applies the store's answer to l, received at now, or its
// failure (err not nil). It returns the change in the store's health, if
// any, for the caller to log. A Lease is delivered once; a lease that
// Expire gave up on may still be delivered, and its tokens are kept.
func (s *Shared) Deliver(l *Lease, now time.Time, g Grant, err error) Transition {
	n := int64(now.Sub(s.epoch))
	st := &l.e.v
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.fetch == l {
		st.fetch = nil
	}
	select {
	case <-l.done:
	default:
		close(l.done)
	}
	if err != nil {
		return s.fail(n)
	}
	if g.Replicas > 0 {
		st.replicas = g.Replicas
		for r := s.replicas.Load(); int64(g.Replicas) > r && !s.replicas.CompareAndSwap(r, int64(g.Replicas)); r = s.replicas.Load() {
		}
	}
	st.storeLeft = int64(max(g.Left, 0))
	if g.Tokens <= 0 {
		st.retryAt = n + int64(max(g.RetryAfter, 0))
	} else if !st.dead {
		first := n + int64(g.FirstSlot) // the store's clock read when the answer came: never early
		last := first + int64(g.Tokens-1)*s.p.t
		st.add(lease{next: first, n: int64(g.Tokens), until: max(last, n) + leaseLife*s.period})
	}
	return s.recover()
}

// leaseLife is how many lease periods after its last slot (or its
// arrival, if later) a lease's tokens may be spent: a replica slower than
// the rate spends them after their slots (want bounds by how much), and a
// token forfeited is a token of the quota lost. In
// TestSharedFourReplicasExactEachSecond, 1 period forfeited 523 tokens (5%
// of the tenant at its limit), 2 forfeited 13, 3 none. What a replica
// holds when its callers stop is bounded by its lease sizes whatever the
// life (the package doc's bound): the life only says how long such tokens
// wait.
const leaseLife = 3

// add holds l beside the leases held, the earlier slot first; with two
// held (a lease Expire gave up on, delivered after a newer one), the one
// that ends first is forfeited.
func (st *sharedKey) add(l lease) {
	if st.nl == 2 {
		if st.leases[0].until < st.leases[1].until {
			st.drop()
		} else {
			st.nl = 1
		}
	}
	st.leases[st.nl] = l
	st.nl++
	if st.nl == 2 && st.leases[1].next < st.leases[0].next {
		st.leases[0], st.leases[1] = st.leases[1], st.leases[0]
	}
}

// Expire gives up waiting for a lease at now, as if the store had failed:
// the limiter enters fallback, so calls stop waiting for a store that does
// not answer in time. The lease stays in flight until it is delivered.
func (s *Shared) Expire(now time.Time) Transition {
	return s.fail(int64(now.Sub(s.epoch)))
}

func (s *Shared) fail(n int64) Transition {
	if s.failing.Load() || !s.failing.CompareAndSwap(false, true) {
		return NoTransition
	}
	s.failSince.Store(n)
	s.probeAt.Store(n + s.probe)
	return EnteredFallback
}

func (s *Shared) recover() Transition {
	if !s.failing.Load() || !s.failing.CompareAndSwap(true, false) {
		return NoTransition
	}
	return LeftFallback
}

// Refund gives back the token of a call Decide admitted at now and that
// did not go (another limit refused it): the earliest lease takes it back
// at the slot before its next, or, when the call was admitted by the local
// share, the share does. A token whose lease has ended since is lost, as
// is a refund in FallbackOpen.
func (s *Shared) Refund(now time.Time, key string) {
	n := int64(now.Sub(s.epoch))
	for {
		e := s.keys.get(n, s.p.t, key)
		st := &e.v
		st.mu.Lock()
		if st.dead {
			st.mu.Unlock()
			continue
		}
		switch {
		case s.failing.Load() && s.fallback == FallbackLocalShare:
			if st.fbTAT > n {
				r := max(int64(st.replicas), 1)
				st.fbTAT -= s.p.t * r
			}
		case st.nl > 0:
			st.leases[0].next -= s.p.t
			st.leases[0].n++
		}
		st.mu.Unlock()
		return
	}
}

// Forfeited returns the tokens leased and never spent: their lease ended
// (3 lease periods after the last slot) first.
func (s *Shared) Forfeited() int64 { return s.forfeited.Load() }

// InFallback reports whether the limiter is in fallback: the store did
// not answer its last lease.
func (s *Shared) InFallback() bool { return s.failing.Load() }

// Keys returns the number of keys remembered.
func (s *Shared) Keys() int { return s.keys.len() }

// forget is the sweep's test of a Shared limiter's entry: it holds
// nothing when no lease is held or in flight, the store set no wait, the
// demand is two lease periods old, and the local share's bucket is full.
func (s *Shared) forget(e *entry[sharedKey], now int64) (bool, int64) {
	st := &e.v
	st.mu.Lock()
	defer st.mu.Unlock()
	if lost := st.forfeit(now); lost > 0 {
		s.forfeited.Add(lost)
	}
	if st.nl == 0 && st.fetch == nil && now >= st.retryAt && now-st.demandAt >= 2*s.period && st.fbTAT <= now {
		st.dead = true
		return true, 0
	}
	return false, now + s.period
}
