package interceptor

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-resilience/resilience/internal/breaker"
	"github.com/grpc-resilience/resilience/internal/bulkhead"
	"github.com/grpc-resilience/resilience/internal/latency"
	"github.com/grpc-resilience/resilience/internal/ratelimit"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Per-method state: one table.
//
// A Client keeps what the calls of a method build up (its circuit breaker or
// adaptive throttle, its bulkhead, latency estimate and hedging window) in
// one table, methodTable, one row per method (methodRow), apart from the
// policies (methodPolicy), which belong to one config, never change, and
// hold their row's guards. Terms, under the config in force:
//
//   - A method's entry is the config entry that applies to it (exact name,
//     else service, else default: serviceconfig.Config.Lookup), and its key
//     is that entry's selector: the method itself for an exact name,
//     "/pkg.Service/*" for a service, "/*" for the default entry.
//   - A method has state when its entry has a circuitBreaker or bulkhead
//     block (and the method is not exempt, WithExemptMethods), or a
//     retryPolicy or hedgingPolicy (a latency estimate, a hedging window).
//   - A method is pinned when its entry names it exactly, or when a
//     generated stub called it (grpc.StaticMethod), under this config or an
//     earlier one: their number is the code's and the config's, not the
//     callers'.
//
// Invariants, true whenever table.mu is free (TestMethodTableModel checks
// them after every step of 10,000 random calls, breaker controls and
// updates, against a reference model):
//
//	T1 Nothing for nothing: a method without state has no row but a draining
//	   one (below); it counts nothing, and its policy (immutable, the same
//	   for every call) is a cache entry that can be dropped at any time.
//	T2 Pinned: every pinned method with state has a row, at all times.
//	T3 Bound: every other row is counted under its key, and no key counts
//	   more than maxMethods rows (table.bound); pinned and draining rows
//	   count nothing.
//	T4 One answer: the policy a call of m resolves under the config in force
//	   holds m's row's guards, and no other's: no two rows share a guard. A
//	   method with state and no row (its key full, no row idle to make room:
//	   untracked) runs each call under its entry's policy with no breaker and
//	   no bulkhead, never under another method's. ForceOpen, ForceClosed and
//	   ResetBreaker act on m's row's breaker, or return an error saying why
//	   there is none.
//	T5 Stable guards: a row's breaker, adaptive throttle, bulkhead, latency
//	   estimate and hedging window stay the same objects while the row lives
//	   and its entry keeps their block; a changed block changes them in place
//	   (breaker.Reconfigure, bulkhead.Resize), so that no operator's forced
//	   state is lost to an update, and the bulkhead's new limits count the
//	   attempts already in it.
//	T6 Letting go: a row goes only (a) at an update after which its method
//	   has no state, or is not pinned and its key has no room (an update
//	   keeps the pinned rows, then the others live first, oldest first); or
//	   (b) to make room in its key for another method, when it is idle
//	   (nothing in its bulkhead, its breaker closed with no failure counted,
//	   its throttle refusing nothing) and no call used it since the hand of
//	   its key last passed it (CLOCK, second chance). A row that goes while
//	   its bulkhead holds attempts stays, draining: it configures nothing and
//	   counts nothing, its bulkhead admits everyone, and a block added again
//	   for the method takes that bulkhead back, so its limits count them; an
//	   update that finds it empty lets it go.
//
// Only updates (under Client.updateMu, then table.mu) and new rows (under
// table.mu) change the table, and an update publishes the new config under
// table.mu: so a row is created under the config in force (add reads it
// under the lock), and the operator's controls, which take no lock while
// they act on a breaker (its hook may call the Client), never race an
// update's copy of it: there is no copy.
const maxMethods = 1024

// evictScan is how many rows of a full key a new method looks at for one
// to let go (T6b) before its call runs untracked: the hand moves on, so a
// key's rows are all looked at within bound/evictScan such calls.
const evictScan = 32

// cacheBound is how many policies of methods without state a config keeps
// resolved (T1); past it the cache starts over.
const cacheBound = 4096

// methodTable is a Client's per-method state; see the invariants above.
type methodTable struct {
	mu     sync.Mutex
	rows   map[string]*methodRow // guarded by mu
	quotas map[string]*quota     // the counted rows of each key; guarded by mu
	seq    uint64                // rows made so far; guarded by mu
	// bound is the most rows a key counts: maxMethods, lowered by tests.
	bound int
	// static holds the methods a generated stub called (grpc.StaticMethod),
	// for ever: pinned under every config.
	static sync.Map // full method → struct{}
	// seed is drawn from the client's random source (WithRandSource) by
	// the first update with an adaptive block (ensureSeed), outside every
	// lock; seeds numbers the adaptive throttles' seeds drawn from it.
	seed   atomic.Uint64
	seeded atomic.Bool
	seeds  atomic.Uint64
}

// quota is the counted rows of one key, in the order of its hand.
type quota struct {
	rows   []*methodRow
	hand   int
	warned bool // a method found no room since the last update (logged once)
}

// methodRow is the state of one method; see the invariants above. Its
// fields but ref are guarded by table.mu; the guards they hold are safe for
// concurrent use.
type methodRow struct {
	method string
	seq    uint64 // order of creation: an update keeps the oldest first
	key    string // the key it is counted under; "" when pinned or draining
	slot   int    // its index in its key's quota.rows, when counted
	g      guards // under the config in force; zero when draining
	// dropped is the bulkhead of a block removed (or of a row let go, when
	// draining), resized to admit everyone: the attempts in it release into
	// it, and a block added again takes it back.
	dropped *bulkhead.Bulkhead
	latency *latency.Estimator
	tail    *hedgeTail // its hedging state (hedge_delay.go); nil without a hedging policy
	// pace is the method's pace after a server's pushback, made with its
	// first rateLimit block and kept while the row lives, whatever the
	// block becomes: the server's wait is no property of the config.
	pace       *ratelimit.Pace
	rejections *rejections
	// ref is set by calls of a counted row and cleared by its key's hand
	// (T6b).
	ref atomic.Bool
}

// newMethodTable returns an empty table.
func newMethodTable() methodTable {
	return methodTable{rows: make(map[string]*methodRow), quotas: make(map[string]*quota), bound: maxMethods}
}

// ensureSeed draws the table's seed from rnd, once, when cfg has an
// adaptive block: a client without one consumes nothing of its random
// source beyond its retries' jitter. Called by updates, outside the locks.
func (t *methodTable) ensureSeed(cfg *serviceconfig.Config, rnd func() float64) {
	if t.seeded.Load() {
		return
	}
	for _, mc := range cfg.MethodConfig {
		if cb := mc.CircuitBreaker; cb != nil && cb.Mode == serviceconfig.ModeAdaptive {
			t.seed.Store(uint64(rnd() * (1 << 53)))
			t.seeded.Store(true)
			return
		}
	}
}

// isStatic reports whether a generated stub called fullMethod.
func (t *methodTable) isStatic(fullMethod string) bool {
	_, ok := t.static.Load(fullMethod)
	return ok
}

// nextSeed returns a seed for a new adaptive throttle: splitmix64 over the
// table's seed, so a client built with WithRandSource draws a repeatable
// sequence, and no user code runs under table.mu.
func (t *methodTable) nextSeed() uint64 {
	z := t.seed.Load() + t.seeds.Add(1)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// resolve returns the state in force and the policy a call of fullMethod
// runs under (static: the call is a generated stub's). The fast path is one
// lock-free map read, and a second one for a method without state (T1);
// the policy is resolved and kept on the method's first call.
func (c *Client) resolve(fullMethod string, static bool) (*clientState, *methodPolicy) {
	st := c.state.Load()
	if v, ok := st.methods.Load(fullMethod); ok {
		p := v.(*methodPolicy)
		if static && !p.static.Load() {
			c.markStatic(st, p)
		}
		if r := p.row; r != nil && !r.ref.Load() {
			r.ref.Store(true)
		}
		return st, p
	}
	if !static {
		if v, ok := st.cache.Load(fullMethod); ok {
			return st, v.(*methodPolicy)
		}
	}
	st, p, _ := c.add(fullMethod, static)
	return st, p
}

// markStatic marks p's method as called by a generated stub: pinned (T2,
// T3: its row no longer counts) and named in metrics, under this config and
// every later one.
func (c *Client) markStatic(st *clientState, p *methodPolicy) {
	t := &c.table
	t.static.LoadOrStore(p.fullMethod, struct{}{})
	if st.metrics.on && p.mm.Load() == nil {
		p.mm.Store(st.metrics.named(p.fullMethod))
	}
	p.static.Store(true)
	t.mu.Lock()
	if r := t.rows[p.fullMethod]; r != nil && r.key != "" {
		t.uncount(r)
	}
	t.mu.Unlock()
}

// add resolves fullMethod, not yet in the state in force, and keeps its
// policy: in the cache for a method without state, else with a row of its
// own, made (or a draining one taken back) when the method is pinned or its
// key has room, or an idle row of the key can be let go for it. untracked
// reports a method with state that got no row: its policy, then, is for
// this call alone.
func (c *Client) add(fullMethod string, static bool) (st *clientState, p *methodPolicy, untracked bool) {
	t := &c.table
	if static {
		t.static.LoadOrStore(fullMethod, struct{}{})
	}
	st = c.state.Load()
	p, mc, ok := st.shape(fullMethod)
	if !st.hasState(p, mc, ok) {
		st.keepStateless(p, static)
		return st, p, false
	}
	var warn string
	t.mu.Lock()
	if cur := c.state.Load(); cur != st {
		// An update was published meanwhile: resolve under its config.
		t.mu.Unlock()
		return c.add(fullMethod, static)
	}
	if v, ok := st.methods.Load(fullMethod); ok { // another call made it
		t.mu.Unlock()
		return st, v.(*methodPolicy), false
	}
	key := entryKey(mc, fullMethod)
	pinned := static || key == fullMethod
	r := t.rows[fullMethod] // nil, or draining
	var q *quota
	if !pinned {
		q = t.quota(key)
		if len(q.rows) >= t.bound && t.evict(st, q) == nil {
			if !q.warned {
				q.warned = true
				warn = fmt.Sprintf("interceptor: %s: no room for its per-method state (breaker, bulkhead, rate limit): the client keeps it for at most %d methods of %s, and none is idle; its calls run without them until there is room (name it in the config, or call it through a generated stub)", fullMethod, t.bound, key)
			}
			t.mu.Unlock()
			if warn != "" {
				c.log.warn(warn) // no lock held: a logger is the user's code
			}
			return st, p, true
		}
	}
	if r == nil {
		r = t.newRow(fullMethod)
	}
	t.configure(st, r, p, mc, time.Now())
	if q != nil {
		t.count(q, r, key)
	}
	st.attach(p, r, pinned)
	st.methods.Store(fullMethod, p)
	t.mu.Unlock()
	return st, p, false
}

// keepStateless keeps p, the policy of a method without state, in st: with
// the methods when a generated stub calls it (their number is the code's),
// else in the cache, which starts over once it holds cacheBound policies.
func (st *clientState) keepStateless(p *methodPolicy, static bool) {
	if static {
		if st.metrics.on {
			p.mm.Store(st.metrics.named(p.fullMethod))
		}
		p.static.Store(true)
		st.methods.Store(p.fullMethod, p)
		return
	}
	if st.cached.Add(1) > cacheBound {
		st.cache.Clear()
		st.cached.Store(1)
	}
	st.cache.Store(p.fullMethod, p)
}

// hasState reports whether a method whose policy is p, under entry mc (ok:
// one applies), has state to keep in a row.
func (st *clientState) hasState(p *methodPolicy, mc serviceconfig.MethodConfig, ok bool) bool {
	return ok && (st.guarded(mc, p.fullMethod) || p.retry != nil || p.hedge != nil)
}

// guarded reports whether entry mc gives fullMethod a guard: a breaker (of
// either mode), a bulkhead or a rate limit, unless the method is exempt.
func (st *clientState) guarded(mc serviceconfig.MethodConfig, fullMethod string) bool {
	return (mc.CircuitBreaker != nil || mc.Bulkhead != nil || mc.RateLimit != nil) && !matchName(st.opts.exempt, fullMethod)
}

// entryKey returns the key of fullMethod under its entry mc: fullMethod
// when mc names it exactly, "/pkg.Service/*" when mc names its service, and
// "/*" for the default entry.
func entryKey(mc serviceconfig.MethodConfig, fullMethod string) string {
	svc, method := serviceconfig.SplitMethod(fullMethod)
	for _, n := range mc.Name {
		if n.Method != "" && n.Service == svc && n.Method == method {
			return fullMethod
		}
	}
	for _, n := range mc.Name {
		if n.Service != "" {
			return "/" + svc + "/*"
		}
	}
	return "/*"
}

// newRow returns a new row of fullMethod, kept in the table. t.mu is held.
func (t *methodTable) newRow(fullMethod string) *methodRow {
	t.seq++
	r := &methodRow{method: fullMethod, seq: t.seq, rejections: newRejections(fullMethod)}
	t.rows[fullMethod] = r
	return r
}

// quota returns the quota of key. t.mu is held.
func (t *methodTable) quota(key string) *quota {
	q := t.quotas[key]
	if q == nil {
		q = &quota{}
		t.quotas[key] = q
	}
	return q
}

// count counts r under key's quota q. t.mu is held.
func (t *methodTable) count(q *quota, r *methodRow, key string) {
	r.key, r.slot = key, len(q.rows)
	q.rows = append(q.rows, r)
}

// uncount takes r, counted, out of its key's quota. t.mu is held.
func (t *methodTable) uncount(r *methodRow) {
	q := t.quotas[r.key]
	last := len(q.rows) - 1
	q.rows[r.slot] = q.rows[last]
	q.rows[r.slot].slot = r.slot
	q.rows[last] = nil
	q.rows = q.rows[:last]
	r.key, r.slot = "", 0
}

// evict lets go a row of q that is idle and was not used since the hand
// last passed it, looking at evictScan rows at most (T6b), and returns it;
// nil when none was found. t.mu is held, and st is the state in force.
func (t *methodTable) evict(st *clientState, q *quota) *methodRow {
	now := time.Now()
	for range evictScan {
		if len(q.rows) == 0 {
			return nil
		}
		if q.hand >= len(q.rows) {
			q.hand = 0
		}
		r := q.rows[q.hand]
		if r.ref.Load() {
			r.ref.Store(false)
			q.hand++
			continue
		}
		if r.idle(now) {
			t.uncount(r)
			t.release(r)
			st.methods.Delete(r.method)
			return r
		}
		q.hand++
	}
	return nil
}

// idle reports whether r holds nothing an eviction would lose but counts
// of successes: nothing in its bulkhead, its breaker closed with no
// failure or slow call counted, its adaptive throttle refusing nothing.
func (r *methodRow) idle(now time.Time) bool {
	if r.holds() {
		return false
	}
	if b := r.g.breaker; b != nil {
		s := b.Snapshot(now)
		if s.State != breaker.StateClosed || s.Failures != 0 || s.SlowCalls != 0 || s.ConsecutiveFailures != 0 || s.Probes != 0 {
			return false
		}
	}
	if a := r.g.adaptive; a != nil {
		if s := a.Snapshot(now); s.RejectProbability > 0 || s.Requests > s.Accepts {
			return false
		}
	}
	if q := r.g.rate; q != nil && !q.idle(now) {
		return false
	}
	return true
}

// holds reports whether b is the breaker of fullMethod's row.
func (t *methodTable) holds(fullMethod string, b *breaker.Breaker) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.rows[fullMethod]
	return r != nil && r.g.breaker == b
}

// holds reports whether r's bulkhead (in force or dropped) holds attempts.
func (r *methodRow) holds() bool {
	for _, b := range []*bulkhead.Bulkhead{r.g.bulkhead, r.dropped} {
		if b != nil && b.Snapshot() != (bulkhead.Snapshot{}) {
			return true
		}
	}
	return false
}

// release lets r go (T6): out of the table, or draining while its bulkhead
// holds attempts, which is then resized to admit everyone (the attempts
// queued in it go at once, as a new call would). t.mu is held; r is not
// counted.
func (t *methodTable) release(r *methodRow) {
	if b := r.g.bulkhead; b != nil {
		_ = b.Resize(bulkhead.Config{MaxConcurrent: math.MaxInt32})
		r.dropped = b
	}
	if !r.holds() {
		delete(t.rows, r.method)
		return
	}
	r.g = guards{}
	r.latency, r.tail = nil, nil
}

// attach makes p, the policy of r's method under st, run under r's state.
// pinned says whether the method is pinned (its row counts nothing).
func (st *clientState) attach(p *methodPolicy, r *methodRow, pinned bool) {
	bind(st, p, r)
	if !pinned {
		p.row = r
	}
	if pinned && st.metrics.on {
		p.mm.Store(st.metrics.named(p.fullMethod))
	}
	if st.table.isStatic(p.fullMethod) {
		p.static.Store(true)
	}
}

// bind makes p run under r's state, and settles its fast paths.
func bind(st *clientState, p *methodPolicy, r *methodRow) {
	p.g = r.g
	p.latency, p.tail = r.latency, r.tail
	st.settle(p)
}

// configure gives r the state its method's entry mc asks for under st,
// keeping what r has where the block is unchanged, and changing it in place
// where it changed (T5). The blocks were validated with the config, so
// nothing here can fail. t.mu is held.
func (t *methodTable) configure(st *clientState, r *methodRow, p *methodPolicy, mc serviceconfig.MethodConfig, now time.Time) {
	var cb *serviceconfig.CircuitBreaker
	var bh *serviceconfig.Bulkhead
	var rl *serviceconfig.ClientRateLimit
	if st.guarded(mc, r.method) {
		cb, bh, rl = mc.CircuitBreaker, mc.Bulkhead, mc.RateLimit
	}
	g := &r.g
	switch {
	case rl == nil:
		g.rate = nil
	case g.rate == nil || g.rate.cfg != *rl || g.rate.capHint != st.opts.maxPushback:
		// A new or changed block: a new bucket, full; the pace stays.
		// Attempts waiting at the old gate keep the token they took.
		if r.pace == nil {
			r.pace = new(ratelimit.Pace)
		}
		g.rate = newRateGate(rl, r.pace, st.opts.maxPushback, now)
	}
	switch {
	case cb != nil && cb.Mode == serviceconfig.ModeAdaptive:
		if g.adaptive == nil || !sameBreaker(*g.breakerCfg, *cb) {
			g.adaptive, _ = newAdaptive(cb, t.nextSeed())
		}
		g.breaker, g.breakerCfg, g.failures = nil, cb, 0
	case cb != nil:
		switch {
		case g.breaker == nil:
			g.breaker, _ = newBreaker(r.method, cb, st.stateHook())
		case !sameBreaker(*g.breakerCfg, *cb):
			_ = g.breaker.Reconfigure(engineBreakerConfig(cb), now)
		}
		g.adaptive, g.breakerCfg = nil, cb
		g.failures = failureCodes(cb)
	default:
		g.breaker, g.adaptive, g.breakerCfg, g.failures = nil, nil, nil, 0
	}
	switch {
	case bh != nil && g.bulkhead != nil:
		if *g.bulkheadCfg != *bh {
			_ = g.bulkhead.Resize(bulkheadConfig(bh))
		}
	case bh != nil && r.dropped != nil:
		// A block added again: the bulkhead dropped, which the attempts
		// begun before still hold, under the new limits.
		_ = r.dropped.Resize(bulkheadConfig(bh))
		g.bulkhead, r.dropped = r.dropped, nil
	case bh != nil:
		g.bulkhead, _ = newBulkhead(bh)
	case g.bulkhead != nil:
		// The block removed: the attempts queued go at once; a block added
		// again takes the bulkhead back while they hold it.
		_ = g.bulkhead.Resize(bulkhead.Config{MaxConcurrent: math.MaxInt32})
		r.dropped, g.bulkhead = g.bulkhead, nil
	}
	g.bulkheadCfg = bh
	if r.dropped != nil && r.dropped.Snapshot() == (bulkhead.Snapshot{}) {
		r.dropped = nil // empty: nothing for a block added again to count
	}
	g.rejections = nil
	if g.any() {
		g.rejections = r.rejections
	}
	if r.latency == nil && (p.retry != nil || p.hedge != nil) {
		r.latency = newEstimator(st.opts.estimateFloor)
	}
	switch {
	case p.hedge == nil:
		r.tail = nil
	case r.tail == nil:
		r.tail = newHedgeTail()
		fallthrough
	default:
		r.tail.configure(p.hedge, st.storm.budget)
	}
}

// rebuild makes the table follow st, the state an update is about to
// publish: the rows of the methods st's config names exactly with state,
// and of the methods generated stubs called that have state (made where
// missing), then the other rows, live ones first, then the oldest, each
// kept, counted and reconfigured, or let go (T6a); and st's methods get
// every kept row's policy and the policy of every exact name. It costs a
// resolution per exact name, per method a stub called and per row. t.mu is
// held.
func (t *methodTable) rebuild(st *clientState) {
	now := time.Now()
	t.quotas = make(map[string]*quota)
	done := make(map[*methodRow]bool, len(t.rows))
	for i := range st.cfg.MethodConfig {
		for _, n := range st.cfg.MethodConfig[i].Name {
			if n.Method == "" {
				continue
			}
			m := exactName(n)
			if _, ok := st.methods.Load(m); ok {
				continue
			}
			p, mc, ok := st.shape(m)
			if !st.hasState(p, mc, ok) {
				p.mm.Store(st.metrics.namedIfOn(m))
				if t.isStatic(m) {
					p.static.Store(true)
				}
				st.methods.Store(m, p)
				continue
			}
			r := t.rows[m]
			if r == nil {
				r = t.newRow(m)
			}
			r.key = ""
			t.configure(st, r, p, mc, now)
			st.attach(p, r, true)
			st.methods.Store(m, p)
			done[r] = true
		}
	}
	// The methods generated stubs called, pinned too: made where missing.
	t.static.Range(func(k, _ any) bool {
		if m := k.(string); t.rows[m] == nil {
			if p, mc, ok := st.shape(m); st.hasState(p, mc, ok) {
				t.newRow(m)
			}
		}
		return true
	})
	rest := make([]*methodRow, 0, len(t.rows))
	live := make(map[*methodRow]bool)
	for _, r := range t.rows {
		if !done[r] {
			rest = append(rest, r)
			live[r] = !r.idle(now)
		}
	}
	slices.SortFunc(rest, func(a, b *methodRow) int {
		if sa, sb := t.isStatic(a.method), t.isStatic(b.method); sa != sb {
			return trueFirst(sa)
		}
		if live[a] != live[b] {
			return trueFirst(live[a])
		}
		return cmp.Compare(a.seq, b.seq)
	})
	for _, r := range rest {
		r.key, r.slot = "", 0
		p, mc, ok := st.shape(r.method)
		if !st.hasState(p, mc, ok) {
			t.release(r)
			continue
		}
		pinned := t.isStatic(r.method)
		var q *quota
		if !pinned {
			key := entryKey(mc, r.method)
			if q = t.quota(key); len(q.rows) >= t.bound {
				t.release(r)
				continue
			}
			t.count(q, r, key)
		}
		t.configure(st, r, p, mc, now)
		st.attach(p, r, pinned)
		st.methods.Store(r.method, p)
	}
}

// trueFirst orders a before b when a's flag is true and b's, which differs,
// is not.
func trueFirst(a bool) int {
	if a {
		return -1
	}
	return 1
}

// exactName returns the full method an exact name selects.
func exactName(n serviceconfig.Name) string { return "/" + n.Service + "/" + n.Method }

// forgetNames lets go, from the metrics' names, the methods that st's
// config does not name exactly and no generated stub called: their calls
// and gauges are recorded as "other" from now on, so the names do not grow
// with every name a config ever held.
func (t *methodTable) forgetNames(st *clientState) {
	if !st.metrics.on {
		return
	}
	st.metrics.names.Range(func(k, _ any) bool {
		m := k.(string)
		if t.isStatic(m) {
			return true
		}
		if mc, ok := st.cfg.Lookup(m); ok && entryKey(mc, m) == m {
			return true
		}
		st.metrics.names.Delete(m)
		return true
	})
}

// peek returns the policy fullMethod's calls would run under now, without
// keeping anything for a method not yet resolved (Status and HedgingDelay,
// which must not let a caller's names grow the table): a method with state
// and no row gets fresh state, for this reading alone.
func (c *Client) peek(fullMethod string) *methodPolicy {
	st := c.state.Load()
	if v, ok := st.methods.Load(fullMethod); ok {
		return v.(*methodPolicy)
	}
	p, mc, ok := st.shape(fullMethod)
	if st.hasState(p, mc, ok) {
		r := &methodRow{method: fullMethod, rejections: newRejections(fullMethod)}
		tmp := &methodTable{}
		tmp.seed.Store(c.table.seed.Load())
		tmp.configure(st, r, p, mc, time.Now())
		// Bound, not attached: a name a caller asks about is not named in
		// the metrics (their names are the config's and the stubs').
		bind(st, p, r)
	}
	return p
}

// each calls f with every policy st keeps for a method with a row (every
// method with a guard is one, T2 and T3): what Statuses and the gauges
// report.
func (st *clientState) each(f func(p *methodPolicy)) {
	st.methods.Range(func(_, v any) bool {
		f(v.(*methodPolicy))
		return true
	})
}
