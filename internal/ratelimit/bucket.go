package ratelimit

import (
	"sync/atomic"
	"time"
)

// Bucket is one rate limit with a single bucket: GCRA on one theoretical
// arrival time, for a client that limits its own sending rate (one Bucket
// per method). It is a Limiter without keys: a decision is a load and a
// compare-and-swap, takes no lock and allocates nothing. MaxKeys of its
// Config is not used. It is safe for concurrent use.
type Bucket struct {
	p     params    // immutable
	epoch time.Time // immutable: the instant the TAT counts from
	tat   atomic.Int64
}

// NewBucket returns a full Bucket for cfg, whose epoch is now (see New).
// It returns an error naming the Config field out of range.
func NewBucket(cfg Config, now time.Time) (*Bucket, error) {
	p, err := cfg.params()
	if err != nil {
		return nil, err
	}
	b := &Bucket{p: p, epoch: now}
	b.tat.Store(fresh)
	return b, nil
}

// Reserve takes a token for a call at now that may wait up to maxWait:
// when a call would be admitted within maxWait of now, it takes that token
// and returns ok and the wait (0: at once); the caller must wait that long
// before it acts, or give the token back with Cancel. Otherwise it takes
// nothing, and wait is the exact time from now until a call would be
// admitted, if no other is meanwhile. Every call is Critical: one caller's
// own calls share its whole burst.
func (b *Bucket) Reserve(now time.Time, maxWait time.Duration) (wait time.Duration, ok bool) {
	n := int64(now.Sub(b.epoch))
	mw := int64(max(maxWait, 0))
	for {
		tat := b.tat.Load()
		next, w, ok := b.p.take(tat, n, Critical, mw)
		if !ok {
			return time.Duration(w), false
		}
		if b.tat.CompareAndSwap(tat, next) {
			return time.Duration(max(w, 0)), true
		}
	}
}

// Cancel gives back, at now, the token of a reservation whose wait has not
// passed (its caller gave up before acting): the TAT moves back one
// interval, unless the bucket is full again by now.
func (b *Bucket) Cancel(now time.Time) {
	n := int64(now.Sub(b.epoch))
	for {
		tat := b.tat.Load()
		if tat <= n || b.tat.CompareAndSwap(tat, max(tat-b.p.t, n)) {
			return
		}
	}
}

// Interval returns the emission interval: a token every Interval.
func (b *Bucket) Interval() time.Duration { return time.Duration(b.p.t) }

// Full reports whether the bucket is full at now: a fresh Bucket would
// decide every call as it does.
func (b *Bucket) Full(now time.Time) bool { return b.tat.Load() <= int64(now.Sub(b.epoch)) }
