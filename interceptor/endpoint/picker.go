package endpoint

import (
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/balancer"

	"github.com/grpc-resilience/resilience/interceptor/internal/trail"
	"github.com/grpc-resilience/resilience/internal/outlier"
)

// picker chooses among the READY endpoints: one the call has not used and
// not ejected, as available in that order of preference (see rank), in
// rotation (round_robin), in the resolver's order (pick_first), or the
// cheaper of two random ones by latency (peak_ewma); then the endpoint's
// own pick_first picks its connection. With no READY endpoint it leaves
// the pick to endpointsharding's picker, which queues or fails the call as
// round_robin does.
type picker struct {
	b        *lb
	ready    []choice
	fallback balancer.Picker
	mode     mode
	decay    time.Duration // peak_ewma's τ
	// perAttempt is what each attempt outstanding adds to a peak_ewma
	// cost, as a share of the endpoint's latency.
	perAttempt float64
	next       atomic.Uint32 // the rotation
	spilled    atomic.Uint32 // the rotation among the best, when next's is not
}

// newPicker returns a picker of b under cfg, with no endpoint yet, that
// falls back to fallback (nil in tests that never fall back).
func newPicker(b *lb, cfg *lbConfig, fallback balancer.Picker) *picker {
	return &picker{b: b, fallback: fallback, mode: cfg.mode, decay: cfg.decay, perAttempt: cfg.perAttempt}
}

type choice struct {
	e      *entry
	picker balancer.Picker // the endpoint's pick_first
}

// Pick allocates nothing and takes no lock: the choice is a few atomic
// loads (and, for peak_ewma, one clock read), and the attempt's record
// (pick) comes from a pool.
//
// Round robin takes the rotation's endpoint when it ranks best: one check
// on the common path. Otherwise a second rotation runs among the endpoints
// of the best rank, so that the share of an endpoint passed over (ejected,
// or used by the call) spreads evenly over the others rather than all
// going to the one after it. A call's later attempts (retries, hedged
// copies: its trail holds an endpoint) take the second rotation and leave
// the first alone, so that the rotation spreads first attempts, and calls,
// evenly: when each hedge of a call on a slow endpoint took the next turn,
// with one call in flight at a time the slow endpoint got every other call
// (its own turn, then the turn after its hedge's), half of them instead of
// a third.
func (p *picker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	n := len(p.ready)
	if n == 0 {
		return p.fallback.Pick(info)
	}
	tr := trail.FromContext(info.Ctx)
	var now time.Time // read only when an endpoint may be ejected
	var k, r int
	var mono int64        // peak_ewma's instant: the monotonic clock alone
	var est time.Duration // peak_ewma's latency estimate of the endpoint picked
	if p.mode == p2c {
		mono = p.b.nanotimeNow()
		k, r, est = p.twoChoices(tr, &now, mono)
	} else {
		k, r = p.inTurn(tr, &now)
	}
	c := p.ready[k]
	res, err := c.picker.Pick(info)
	if err != nil {
		return res, err
	}
	a := pickPool.Get().(*pick)
	a.e, a.inner, a.lastResort, a.gen = c.e, res.Done, r&rankEjected != 0, c.e.gen.Load()
	a.tr, a.slot = tr, -1
	if tr != nil {
		a.slot = tr.Add(c.e.id)
		if dl, ok := info.Ctx.Deadline(); ok {
			a.end.own = tr.OwnDeadline(dl)
		}
	}
	a.start, a.sentUnder = mono, est
	c.e.outstanding.Add(1)
	res.Done = a.done
	return res, nil
}

// inTurn returns the endpoint of a round_robin or pick_first pick, and its
// rank.
func (p *picker) inTurn(tr *trail.Trail, now *time.Time) (k, r int) {
	n := len(p.ready)
	if p.mode == rotate {
		if tr != nil && tr.Len() > 0 { // a retry or a hedged copy: not a turn
			turn := int((p.next.Load() + 1) % uint32(n)) // the turn it would have taken
			best, rb := p.spill(tr, now)
			p.noteAvoided(tr, p.rank(turn, tr, now), rb)
			return best, rb
		}
		k = int(p.next.Add(1) % uint32(n))
	}
	if r = p.rank(k, tr, now); r == 0 {
		return k, 0
	}
	best, rb := p.spill(tr, now)
	p.noteAvoided(tr, r, rb)
	return best, rb
}

// noteAvoided counts a pick sent away from an endpoint the call had used,
// where its turn (rank r) would have sent it; rb is the rank taken.
func (p *picker) noteAvoided(tr *trail.Trail, r, rb int) {
	if tr != nil && r&rankUsed != 0 && rb&rankUsed == 0 {
		p.b.avoided.Add(1)
		p.b.countAvoided()
	}
}

// spill returns the endpoint for a pick whose turn's endpoint does not rank
// best, and its rank: in order, the first of the best rank; else the next
// of them in a rotation of their own.
func (p *picker) spill(tr *trail.Trail, now *time.Time) (int, int) {
	rank, count, first := p.best(tr, now)
	if p.mode == ordered || count == 1 {
		return first, rank
	}
	return p.nthOfRank(first, rank, int(p.spilled.Add(1)%uint32(count)), tr, now), rank
}

// best returns the best rank among the READY endpoints, how many have it,
// and the first of them.
func (p *picker) best(tr *trail.Trail, now *time.Time) (rank, count, first int) {
	rank = rankEjected | rankUsed | 4 // past the worst
	for k := range p.ready {
		switch r := p.rank(k, tr, now); {
		case r < rank:
			rank, count, first = r, 1, k
		case r == rank:
			count++
		}
	}
	return rank, count, first
}

// nthOfRank returns the j-th endpoint of rank after first (j = 0: first);
// a rank changed meanwhile (an ejection) leaves first.
func (p *picker) nthOfRank(first, rank, j int, tr *trail.Trail, now *time.Time) int {
	for k := first + 1; k < len(p.ready) && j > 0; k++ {
		if p.rank(k, tr, now) == rank {
			if j--; j == 0 {
				return k
			}
		}
	}
	return first
}

// twoChoices returns the endpoint of a peak_ewma pick, its rank, and its
// latency estimate (read with its cost when it compared costs): of
// two distinct endpoints drawn at random among those of the best rank (on
// the common path, two drawn among all that both rank best), the one of
// lower cost (peakewma.Estimator.Cost: latency × (1 + outstanding /
// endpointConcurrency)).
func (p *picker) twoChoices(tr *trail.Trail, now *time.Time, mono int64) (int, int, time.Duration) {
	n := len(p.ready)
	x := p.b.rand()
	if n == 1 {
		return 0, p.rank(0, tr, now), p.estimate(0, mono)
	}
	i := int(x % uint64(n))
	j := int((x >> 32) % uint64(n-1))
	if j >= i {
		j++
	}
	ri, rj := p.rank(i, tr, now), p.rank(j, tr, now)
	if ri == 0 && rj == 0 {
		k, est := p.cheaper(i, j, mono)
		return k, 0, est
	}
	rank, count, first := p.best(tr, now)
	p.noteAvoided(tr, ri|rj, rank)
	if count == 1 {
		return first, rank, p.estimate(first, mono)
	}
	a := int((x >> 16) % uint64(count))
	b := int((x >> 40) % uint64(count-1))
	if b >= a {
		b++
	}
	k, est := p.cheaper(p.nthOfRank(first, rank, a, tr, now), p.nthOfRank(first, rank, b, tr, now), mono)
	return k, rank, est
}

// estimate returns the k-th READY endpoint's latency estimate at t.
func (p *picker) estimate(k int, t int64) time.Duration { return p.ready[k].e.lat.Estimate(t, p.decay) }

// cheaper returns i or j, whichever costs less at the instant t (i on a
// tie), and its latency estimate.
func (p *picker) cheaper(i, j int, t int64) (int, time.Duration) {
	ei, ej := p.ready[i].e, p.ready[j].e
	ci, li := ei.lat.Price(t, int(ei.outstanding.Load()), p.perAttempt, p.decay)
	cj, lj := ej.lat.Price(t, int(ej.outstanding.Load()), p.perAttempt, p.decay)
	if cj < ci {
		return j, lj
	}
	return i, li
}

// The rank bits: a pick prefers rank 0, an endpoint neither ejected nor
// used by the call; then used; then ejected; then both.
const (
	rankUsed    = 1
	rankEjected = 2
)

// rank is the preference for the k-th READY endpoint, lowest first. It
// reads the clock into *now the first time an endpoint may be ejected.
func (p *picker) rank(k int, tr *trail.Trail, now *time.Time) int {
	e := p.ready[k].e
	r := 0
	if e.out.MaybeEjected() {
		if now.IsZero() {
			*now = time.Now()
		}
		if e.out.Ejected(*now) {
			r |= rankEjected
		}
	}
	if tr != nil && tr.Has(e.id) {
		r |= rankUsed
	}
	return r
}

// nanotime returns now in nanoseconds since the policy's epoch on the
// monotonic clock, plus one: the unit of peak_ewma's instants, never 0
// (which means "not timed" in a pick). The epoch is the policy's own, read
// where it was built, so that both ends of every difference come from one
// clock (inside a testing/synctest bubble, its fake clock).
func (b *lb) nanotime(now time.Time) int64 { return max(int64(now.Sub(b.epoch)), 0) + 1 }

// nanotimeNow is nanotime(time.Now()), reading the monotonic clock alone:
// about half the cost of time.Now where the wall clock is slow to read.
func (b *lb) nanotimeNow() int64 { return max(int64(time.Since(b.epoch)), 0) + 1 }

// pick is one attempt's record, from its pick to its Done callback: what
// the outcome needs that grpc's DoneInfo does not say. Pooled: a pick
// allocates none.
type pick struct {
	e     *entry
	inner func(balancer.DoneInfo) // the endpoint's picker's own Done; nil: none
	tr    *trail.Trail            // the call's trail, or nil
	slot  int                     // the pick's slot in tr; −1: none
	// lastResort: picked while ejected, as no endpoint in rotation was
	// usable.
	lastResort bool
	gen        uint32        // the endpoint's connection at the pick (entry.gen)
	start      int64         // nanotime of the pick (peak_ewma); 0: not timed
	sentUnder  time.Duration // the endpoint's latency estimate at the pick (peak_ewma; ObserveCut)
	end        attemptEnd    // what the client's timers say
	done       func(balancer.DoneInfo)
}

// pickPool holds the records; its New is set in init, as finish refers
// to the pool.
var pickPool sync.Pool

func init() {
	pickPool.New = func() any {
		a := new(pick)
		a.done = a.finish // made once, so a pick allocates no func value
		return a
	}
}

// finish is the attempt's Done callback: grpc calls it once, when the
// attempt ends or grpc abandons the pick. The record goes back to the pool
// before the endpoint's own callback runs.
func (a *pick) finish(di balancer.DoneInfo) {
	e, inner := a.e, a.inner
	e.outstanding.Add(-1)
	if a.tr != nil {
		a.end.timedOut = a.tr.TimedOut(a.slot)
		a.end.ended = a.tr.Ended()
	}
	e.record(di, a)
	*a = pick{done: a.done}
	pickPool.Put(a)
	if inner != nil {
		inner(di)
	}
}

// record counts the outcome of the attempt a on e, when it ends.
func (e *entry) record(di balancer.DoneInfo, a *pick) {
	b := e.b
	cfg := b.cfg.Load()
	o, lat := classify(di, cfg.failures, a.end)
	if o == outlier.LocalFailure && a.gen != e.gen.Load() {
		o = outlier.Ignored // a connection since replaced
	}
	if lat == latencyNone && (o == outlier.Ignored || o == outlier.Busy) {
		return
	}
	if a.start != 0 {
		t := b.nanotimeNow()
		switch lat {
		case latencySample:
			e.lat.Observe(t, time.Duration(t-a.start), cfg.decay)
		case latencyPeak:
			e.lat.ObservePeak(t, time.Duration(t-a.start), cfg.decay)
		case latencyCut:
			e.lat.ObserveCut(t, time.Duration(t-a.start), a.sentUnder, cfg.decay)
		}
	}
	if o == outlier.Ignored || o == outlier.Busy {
		return
	}
	now := time.Now()
	var ch outlier.Change
	if a.lastResort {
		ch = e.out.RecordLastResort(now, o)
	} else {
		ch = e.out.Record(now, o)
	}
	if ch != (outlier.Change{}) {
		b.reportChange(e, ch)
	}
}
