package ratelimit

import (
	"sync"
	"sync/atomic"
	"time"
)

// Pace spaces a client's attempts of one method while its server is
// pushing back: after an answer that says "come back after w"
// (RESOURCE_EXHAUSTED with a google.rpc.RetryInfo), the attempts of the
// method go one per w, each in a slot of its own; each admitted attempt
// halves the spacing, and the pacing ends when it is under MinPacePeriod,
// so a method whose server keeps refusing at the margin sends about one
// doomed attempt per pushback period, where a plain retry loop sends one
// per call, and one whose server recovered is back to full speed within
// about twice the last pushback (w + w/2 + w/4 ...). Ending at the first
// admitted attempt instead would let every caller through between that
// answer and the next refusal: three doomed attempts per period in real
// time on loopback, against one. The zero value paces nothing. It is safe
// for concurrent use; an attempt while nothing is paced costs an atomic
// load.
type Pace struct {
	active atomic.Bool // a pushback is in force; written under mu

	mu     sync.Mutex
	next   time.Time     // the next free slot; guarded by mu
	period time.Duration // the last pushback; guarded by mu
	// ended is closed when the pushback in force ends (Success): made by
	// the Pushback that begins it, nil while none is; guarded by mu.
	ended chan struct{}
	// gen counts the pushbacks begun (one per span of pacing, from 1): a
	// slot's Ticket, so that Cancel gives back only a slot of the pacing
	// in force; guarded by mu.
	gen uint64
}

// A Ticket names the slot of a pace that Take gave: the zero Ticket, when
// no pushback was in force, names none. Cancel gives a slot back only
// with its Ticket, so that an attempt that took no slot (it passed while
// nothing was paced) or took one of a pacing that has since ended gives
// back nothing: given back, such a phantom slot moved the next free slot
// of a pushback begun meanwhile back by a whole period, and the method's
// next attempt went at once, inside the pushback the server asked for.
type Ticket uint64

// Slot returns how long an attempt at now must wait for its slot, and
// takes the slot when that is at most maxWait: the caller waits that long
// and sends. When it is longer, ok is false, nothing is taken, and wait is
// how long it would be: the caller fails the attempt at once, locally.
func (p *Pace) Slot(now time.Time, maxWait time.Duration) (wait time.Duration, ok bool) {
	wait, _, ok = p.Take(now, maxWait)
	return wait, ok
}

// Take is Slot, returning the Ticket of the slot it took: the zero Ticket
// when it took none (ok, and no pushback in force), which Cancel ignores.
func (p *Pace) Take(now time.Time, maxWait time.Duration) (wait time.Duration, t Ticket, ok bool) {
	if !p.active.Load() {
		return 0, 0, true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.active.Load() {
		return 0, 0, true
	}
	slot := p.next
	if slot.Before(now) {
		slot = now
	}
	wait = slot.Sub(now)
	if wait > maxWait {
		return wait, 0, false
	}
	p.next = slot.Add(p.period)
	return wait, Ticket(p.gen), true
}

// Pushback records, at now, an answer that said to come back after w:
// no slot starts before now + w, and the slots after it are w apart.
func (p *Pace) Pushback(now time.Time, w time.Duration) {
	if w <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.active.Load() {
		// A new pushback: the slots of one that ended are no longer held
		// (their holders were told by ended), so none of them delays it.
		p.next = time.Time{}
		p.ended = make(chan struct{})
		p.gen++
	}
	if at := now.Add(w); at.After(p.next) {
		p.next = at
	}
	// A refusal's wait is the time until the server's next token, which
	// may be a sliver of its interval: the spacing keeps the longest wait
	// asked for, and only admitted attempts shorten it.
	p.period = max(p.period, w)
	p.active.Store(true)
}

// Ended returns a channel closed when the pushback in force ends, so that
// an attempt waiting for its slot can go at once; nil when none is in
// force.
func (p *Pace) Ended() <-chan struct{} {
	if !p.active.Load() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ended
}

// Cancel gives back, at now, the slot that Take gave with t for an
// attempt that was never sent (its caller gave up while waiting, or a
// later check refused it): the next free slot moves back one period,
// never before now, so that callers who all give up leave no queue of
// empty slots behind them. Slots are interchangeable: the next caller
// takes the latest free one. The zero Ticket (no slot was taken) and a
// Ticket of a pacing that has ended give back nothing. Each slot must be
// given back at most once.
func (p *Pace) Cancel(now time.Time, t Ticket) {
	if t == 0 || !p.active.Load() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.active.Load() || uint64(t) != p.gen || !p.next.After(now) {
		return
	}
	if back := p.next.Add(-p.period); back.After(now) {
		p.next = back
	} else {
		p.next = now
	}
}

// Holds reports whether t names a slot of the pacing in force: false for
// the zero Ticket, and for a slot of a pacing that has ended (a new
// pushback since is a new pacing, whose slots t does not hold).
func (p *Pace) Holds(t Ticket) bool {
	if t == 0 || !p.active.Load() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.active.Load() && uint64(t) == p.gen
}

// Active reports whether a pushback is in force.
func (p *Pace) Active() bool { return p.active.Load() }

// MinPacePeriod is the spacing under which a Pace ends: a millisecond.
const MinPacePeriod = time.Millisecond

// Success records an attempt that the server admitted: the spacing halves,
// and under MinPacePeriod the pacing ends and the attempts waiting for
// their slots are told (Ended).
func (p *Pace) Success() {
	if !p.active.Load() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.active.Load() {
		return
	}
	// The next slot moves back with the spacing: it is the last slot
	// taken plus the new spacing (slots are interchangeable; an attempt
	// waiting for a later one keeps it).
	old := p.period
	p.period /= 2
	p.next = p.next.Add(p.period - old)
	if p.period >= MinPacePeriod {
		return
	}
	p.active.Store(false)
	p.period = 0
	close(p.ended)
	p.ended = nil
}

// Snapshot returns the next free slot and the period while a pushback is
// in force, or zeros when none is.
func (p *Pace) Snapshot() (next time.Time, period time.Duration) {
	if !p.active.Load() {
		return time.Time{}, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.active.Load() {
		return time.Time{}, 0
	}
	return p.next, p.period
}
