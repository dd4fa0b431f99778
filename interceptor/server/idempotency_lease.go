package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// srvRenewal keeps an owned claim's lease while the handler runs, on the
// server's own clock (finding 4 of issue 14: a handler that outlived its
// lease ran again, concurrently, on another server; finding 2 of issue 33:
// a renewal stuck in a store that ignored its context kept the handler's
// context live past the lease). Its timer
//
//   - renews the lease every lease/3, each Renew bounded by a context of
//     its own and run outside the renewal's lock, so that nothing waits for
//     a store call: not the cutoff, not settle;
//   - ends the handler's context (hctx) at the cutoff, a tenth of the lease
//     before the end of the last lease the store granted, counted from
//     before the request was sent (srvLeaseMargin), whether or not a
//     Renew is still under way: a duplicate on another replica can claim
//     the key only once the lease has ended, so it never starts while the
//     handler's context is live, whatever the store does;
//   - ends hctx at its deadline (Idempotency.DetachedMax), and when the
//     store says the lease is lost (ErrNotOwner).
//
// It is the timer's, not the record's: nothing stored points to it.
//
// Renewals are pooled with their timer (srvIdem.renewals), so that a first
// execution does not allocate a timer and its state. fire is a function of
// the state under mu and the time: a run of it that comes late, after r
// went back to the pool or to the next call, finds r stopped or acts for
// that call as its own timer would. The fields that a Renew reads outside
// mu are the call's until the Renew is over: r goes back to the pool only
// once no Renew is under way.
type srvRenewal struct {
	// The fields up to t are set by startRenewal, under mu, and immutable
	// until the renewal is back in the pool.
	s      *srvIdem
	sctx   context.Context // the store's context
	rk     idempotency.RecordKey
	token  string
	lease  time.Duration
	method string
	hctx   *srvDetached // the handler's context, ended at the cutoff, at its deadline or when the lease is lost
	t      *time.Timer  // made once per pooled renewal; Reset and Stop under mu

	mu       sync.Mutex
	next     time.Time // when the next renewal is due; guarded by mu
	cutoff   time.Time // hctx ends then unless a renewal succeeds first; guarded by mu
	stopped  bool      // guarded by mu; no renewal starts once set
	renewing bool      // a Renew is under way, outside mu; guarded by mu
	lost     bool      // the store said the lease is no longer the call's: no more renewals; guarded by mu
	recycle  bool      // stop came while a Renew was under way: its end puts r back in the pool; guarded by mu
}

// srvLeaseMargin is what is left of a lease when a handler whose renewals
// have all failed (or not come back) is cancelled: the lease's tenth, for
// the lateness of timers and the time the cancellation takes to reach the
// handler.
func srvLeaseMargin(lease time.Duration) time.Duration { return lease / 10 }

// startRenewal returns a running renewal of the claim of rk held with
// token for the handler's context hctx. claimed is a time before the claim
// was sent: the store's lease ends after claimed+lease, so the first
// renewal is due at claimed+lease/3 and the cutoff is at
// claimed+lease−lease/10.
func startRenewal(s *srvIdem, sctx context.Context, rk idempotency.RecordKey, token string, lease time.Duration,
	method string, hctx *srvDetached, claimed time.Time) *srvRenewal {
	r, _ := s.renewals.Get().(*srvRenewal)
	if r == nil {
		r = new(srvRenewal)
	}
	r.mu.Lock()
	r.s, r.sctx, r.rk, r.token, r.lease, r.method, r.hctx = s, sctx, rk, token, lease, method, hctx
	r.stopped, r.renewing, r.lost, r.recycle = false, false, false, false
	r.next = claimed.Add(lease / 3)
	r.cutoff = claimed.Add(lease - srvLeaseMargin(lease))
	now := time.Now()
	d := r.wakeLocked(now)
	if r.t == nil {
		r.t = time.AfterFunc(d, r.fire)
	} else {
		r.t.Reset(d)
	}
	r.mu.Unlock()
	return r
}

// wakeLocked returns how long from now the timer must wait: until the next
// renewal (none while one is under way, or once the lease is lost), or the
// cutoff or deadline of a handler context still live, whichever comes
// first.
func (r *srvRenewal) wakeLocked(now time.Time) time.Duration {
	at := r.next
	if r.renewing || r.lost {
		at = time.Time{}
	}
	if !r.hctx.ended() {
		at = earliest(at, r.cutoff)
		if r.hctx.hasDeadline {
			at = earliest(at, r.hctx.deadline)
		}
	}
	if at.IsZero() {
		return -1
	}
	return max(at.Sub(now), 0)
}

// earliest returns the earlier of a and b, a zero time counting as none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

// armLocked sets the timer for what is due next, if anything.
func (r *srvRenewal) armLocked(now time.Time) {
	if d := r.wakeLocked(now); d >= 0 {
		r.t.Reset(d)
	}
}

// cutLocked ends the handler's context at its deadline or the lease's
// cutoff, when now has reached either.
func (r *srvRenewal) cutLocked(now time.Time) {
	if r.hctx.ended() {
		return
	}
	if r.hctx.hasDeadline && !now.Before(r.hctx.deadline) {
		r.hctx.end(context.DeadlineExceeded) // the server's maximum, or an attached caller's deadline
		return
	}
	if !now.Before(r.cutoff) {
		r.s.log.warn("idempotency: the lease may end before a renewal reaches the store; "+
			"cancelling the handler, since a duplicate may then run it", "method", r.method)
		r.hctx.end(context.Canceled)
	}
}

// fire is the timer's function: it ends the handler's context when it is
// due to end, arms the timer for what comes next, and then, when a renewal
// is due and none is under way, renews the lease, outside mu.
func (r *srvRenewal) fire() {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return
	}
	now := time.Now()
	r.cutLocked(now)
	renew := !r.renewing && !r.lost && !now.Before(r.next)
	r.renewing = r.renewing || renew
	// A Renew that takes longer than the time to the next one is of no
	// use, nor, while the handler's context is live, one that ends after
	// the cutoff: bound it by both. (Once the context has ended, the
	// renewals go on while the handler does, so that a store that comes
	// back keeps the key from a duplicate.)
	timeout := r.lease / 3
	if !r.hctx.ended() {
		timeout = min(timeout, max(r.cutoff.Sub(now), time.Millisecond))
	}
	r.armLocked(now) // the cutoff fires while the Renew is under way
	r.mu.Unlock()
	if renew {
		r.renew(now, timeout)
	}
}

// renew sends a Renew that started at start, bounded by timeout, and takes
// its answer: a new cutoff, or the lease lost. It runs outside mu; the
// fields it reads are the call's until renewing is cleared.
func (r *srvRenewal) renew(start time.Time, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(r.sctx, timeout)
	t0 := r.s.m.start()
	err := r.s.store.Renew(ctx, r.rk, r.token, r.lease)
	cancel()
	r.s.m.storeDone(r.sctx, r.method, srvOpRenew, t0, err)
	r.mu.Lock()
	r.renewing = false
	if r.stopped { // settled meanwhile: the answer is of no use, and an ErrNotOwner is the settle's own doing
		recycle := r.recycle
		s := r.s
		if recycle {
			r.clearLocked()
		}
		r.mu.Unlock()
		if recycle {
			s.renewals.Put(r)
		}
		return
	}
	switch {
	case err == nil:
		r.cutoff = start.Add(r.lease - srvLeaseMargin(r.lease))
	case errors.Is(err, idempotency.ErrNotOwner):
		r.s.log.warn("idempotency: the lease ended while the handler ran; a duplicate may run it too",
			"method", r.method, "error", err)
		r.lost = true
		r.hctx.end(context.Canceled) // a handler is bounded by its lease
	default:
		r.s.log.warn("idempotency: renewing the lease failed; trying again", "method", r.method, "error", err)
	}
	now := time.Now()
	r.next = now.Add(r.lease / 3)
	r.cutLocked(now)
	r.armLocked(now)
	r.mu.Unlock()
}

// clearLocked drops what the next call must not keep alive.
func (r *srvRenewal) clearLocked() {
	r.s, r.sctx, r.rk, r.token, r.hctx = nil, nil, idempotency.RecordKey{}, "", nil
}

// stop ends the renewals: none starts after it, and it waits for none
// under way (the store may hang; settle must not). The caller must not use
// r afterwards: r goes back to the pool now, or when the Renew under way
// ends.
func (r *srvRenewal) stop() {
	r.mu.Lock()
	r.stopped = true
	r.t.Stop()
	s := r.s
	recycle := !r.renewing
	if recycle {
		r.clearLocked()
	} else {
		r.recycle = true
	}
	r.mu.Unlock()
	if recycle {
		s.renewals.Put(r)
	}
}
