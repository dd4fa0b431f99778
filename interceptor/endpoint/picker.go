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
	next     atomic.Uint32
}

type choice struct {
	e      *entry
	picker balancer.Picker // the endpoint's pick_first
}

// Pick allocates nothing on its own unless the endpoint's picker returns a
// Done callback of its own (pick_first returns none), which it must wrap.
func (p *picker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	n := len(p.ready)
	if n == 0 {
		return p.fallback.Pick(info)
	}
	start := 0
	if !p.ordered {
		start = int(p.next.Add(1) % uint32(n))
	}
	tr := trail.FromContext(info.Ctx)
	var now time.Time // read only when an endpoint may be ejected
	best, rank := 0, 4
	for i := range n {
		k := start + i
		if k >= n {
			k -= n
		}
		e := p.ready[k].e
		r := 0
		if e.out.MaybeEjected() {
			if now.IsZero() {
				now = time.Now()
			}
			if e.out.Ejected(now) {
				r += 2
			}
		}
		if tr != nil && tr.Has(e.id, e.addrs) {
			r++
		}
		if r < rank {
			best, rank = k, r
			if r == 0 {
				break
			}
		}
	}
	c := p.ready[best]
	if tr != nil && best != start && p.passedOverTried(tr, start, best) {
		p.b.avoided.Add(1)
		p.b.count(attemptsAvoided)
	}
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

// passedOverTried reports whether the pick passed over an endpoint the
// call had used on its way from start to best.
func (p *picker) passedOverTried(tr *trail.Trail, start, best int) bool {
	n := len(p.ready)
	for k := start; k != best; k = (k + 1) % n {
		if e := p.ready[k].e; tr.Has(e.id, e.addrs) {
			return true
		}
	}
	return false
}
