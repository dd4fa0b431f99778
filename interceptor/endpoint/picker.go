package endpoint

import (
	"sync/atomic"
	"time"

	"google.golang.org/grpc/balancer"

	"github.com/grpc-resilience/resilience/interceptor/internal/trail"
)

// picker chooses among the READY endpoints: one the call has not used, in
// rotation (or, ordered, in the resolver's order), and not ejected, as
// available in that order of preference; then the endpoint's own pick_first
// picks its connection. With no READY endpoint it leaves the pick to
// endpointsharding's picker, which queues or fails the call as
// round_robin does.
type picker struct {
	b        *lb
	ready    []choice
	fallback balancer.Picker
	ordered  bool
	next     atomic.Uint32 // the rotation
	spilled  atomic.Uint32 // the rotation among the best, when next's is not
}

type choice struct {
	e      *entry
	picker balancer.Picker // the endpoint's pick_first
}

// Pick allocates nothing on its own unless the endpoint's picker returns a
// Done callback of its own (pick_first returns none), which it must wrap.
//
// The rotation's endpoint is taken when it ranks best (see rank): one
// check on the common path. Otherwise a second rotation runs among the
// endpoints of the best rank, so that the share of an endpoint passed over
// (ejected, or used by the call) spreads evenly over the others rather
// than all going to the one after it.
func (p *picker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	n := len(p.ready)
	if n == 0 {
		return p.fallback.Pick(info)
	}
	ticket := 0
	if !p.ordered {
		ticket = int(p.next.Add(1) % uint32(n))
	}
	tr := trail.FromContext(info.Ctx)
	var now time.Time // read only when an endpoint may be ejected
	best := ticket
	if r := p.rank(ticket, tr, &now); r != 0 {
		best = p.spill(tr, &now)
		if tr != nil && r&1 == 1 && p.rank(best, tr, &now)&1 == 0 {
			// The rotation alone would have sent it where the call had been.
			p.b.avoided.Add(1)
			p.b.count(attemptsAvoided)
		}
	}
	c := p.ready[best]
	res, err := c.picker.Pick(info)
	if err != nil {
		return res, err
	}
	if tr != nil {
		tr.Add(c.e.id)
	}
	if res.Done == nil {
		res.Done = c.e.done
	} else {
		inner, done := res.Done, c.e.done
		res.Done = func(di balancer.DoneInfo) { done(di); inner(di) }
	}
	return res, nil
}

// spill returns the endpoint for a pick whose rotation's endpoint does not
// rank best: in order, the first of the best rank; else the next of them
// in a rotation of their own.
func (p *picker) spill(tr *trail.Trail, now *time.Time) int {
	n := len(p.ready)
	rank, count, first := 4, 0, 0
	for k := range n {
		switch r := p.rank(k, tr, now); {
		case r < rank:
			rank, count, first = r, 1, k
		case r == rank:
			count++
		}
	}
	if p.ordered || count == 1 {
		return first
	}
	// The j-th of the best rank after first; a rank changed meanwhile (an
	// ejection) leaves first.
	j := int(p.spilled.Add(1) % uint32(count))
	for k := first + 1; k < n && j > 0; k++ {
		if p.rank(k, tr, now) == rank {
			if j--; j == 0 {
				return k
			}
		}
	}
	return first
}

// rank is the preference for the k-th READY endpoint, lowest first: 0
// neither ejected nor used by the call, 1 used, 2 ejected, 3 both. It reads
// the clock into *now the first time an endpoint may be ejected.
func (p *picker) rank(k int, tr *trail.Trail, now *time.Time) int {
	e := p.ready[k].e
	r := 0
	if e.out.MaybeEjected() {
		if now.IsZero() {
			*now = time.Now()
		}
		if e.out.Ejected(*now) {
			r += 2
		}
	}
	if tr != nil && tr.Has(e.id, e.addrs) {
		r++
	}
	return r
}
