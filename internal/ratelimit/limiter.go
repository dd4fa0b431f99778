package ratelimit

import (
	"time"
)

// Limiter is a rate limit with one bucket per key (see the package doc).
// It is safe for concurrent use; Allow, Reserve and Cancel take no lock
// and allocate nothing for a key already remembered.
type Limiter struct {
	p     params    // immutable
	epoch time.Time // immutable: the instant TATs count from
	keys  keys[struct{}]
}

// New returns a Limiter for cfg. now is its epoch: the instants given to
// its methods are read relative to it (by time.Time.Sub, so on the
// monotonic clock when both have one), and should not precede it by more
// than about 140 years. It returns an error naming the Config field out
// of range.
func New(cfg Config, now time.Time) (*Limiter, error) {
	p, err := cfg.params()
	if err != nil {
		return nil, err
	}
	l := &Limiter{p: p, epoch: now}
	max := cfg.MaxKeys
	if max == 0 {
		max = DefaultMaxKeys
	}
	l.keys.init(max, forgetTAT[struct{}])
	return l, nil
}

// Interval returns the emission interval: a token every Interval, Per/Rate
// rounded to the nanosecond.
func (l *Limiter) Interval() time.Duration { return time.Duration(l.p.t) }

// Allow decides a call of criticality c for key at now: it is admitted,
// and takes a token, or it is refused, takes nothing, and wait is the
// exact time from now until a call of c for key would be admitted, if no
// other call for key is admitted meanwhile.
func (l *Limiter) Allow(now time.Time, key string, c Criticality) (ok bool, wait time.Duration) {
	w, ok := l.reserve(l.since(now), key, c.valid(), 0)
	if ok {
		return true, 0
	}
	return false, time.Duration(w)
}

// Reserve is Allow for a caller that may wait up to maxWait: when a call
// of c for key would be admitted within maxWait of now, it takes that
// token now and returns ok and the wait (0: at once); the caller must
// wait that long before it acts, or give the token back with Cancel.
// Otherwise it takes nothing and returns the wait, as Allow does.
func (l *Limiter) Reserve(now time.Time, key string, c Criticality, maxWait time.Duration) (wait time.Duration, ok bool) {
	w, ok := l.reserve(l.since(now), key, c.valid(), int64(max(maxWait, 0)))
	return time.Duration(max(w, 0)), ok
}

// Cancel gives back the token of a reservation for key whose wait has not
// passed (the caller gave up before acting): the TAT moves back one
// interval, so the next call finds the token the reservation held. A
// reservation whose wait has passed must not be cancelled: its token was
// spent at its time.
func (l *Limiter) Cancel(now time.Time, key string) {
	n := l.since(now)
	for {
		e := l.keys.get(n, l.p.t, key)
		for {
			tat := e.tat.Load()
			if tat == dead {
				break
			}
			if tat <= n || e.tat.CompareAndSwap(tat, tat-l.p.t) {
				return // a full bucket has nothing to give back
			}
		}
	}
}

// reserve is the decision loop: GCRA on key's TAT, compare-and-swapped,
// retried when another decision moved it first; a refusal writes nothing.
func (l *Limiter) reserve(now int64, key string, c Criticality, maxWait int64) (wait int64, ok bool) {
	for {
		e := l.keys.get(now, l.p.t, key)
		for {
			tat := e.tat.Load()
			if tat == dead { // forgotten by a sweep since get: look it up again
				break
			}
			next, w, ok := l.p.take(tat, now, c, maxWait)
			if !ok {
				return w, false
			}
			if e.tat.CompareAndSwap(tat, next) {
				return w, true
			}
		}
	}
}

// since is now in nanoseconds after the epoch.
func (l *Limiter) since(now time.Time) int64 { return int64(now.Sub(l.epoch)) }

// Stats are a Limiter's counts, for metrics.
type Stats struct {
	// Keys is the number of keys remembered (besides the default and
	// overflow buckets).
	Keys int
	// Overflowed counts the decisions made on the overflow bucket: for a
	// key beyond MaxKeys or longer than MaxKeyLen.
	Overflowed uint64
}

// Stats returns l's counts. It takes a lock that only new keys take.
func (l *Limiter) Stats() Stats {
	return Stats{Keys: l.keys.len(), Overflowed: l.keys.overflow.Load()}
}
