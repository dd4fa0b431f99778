package adaptive

import (
	"errors"
	"math/rand/v2"
	"sync"
	"time"
)

// Defaults of Config.
const (
	DefaultK      = 2
	DefaultWindow = time.Minute
)

// ShortWindow is the window of the short counts (see the package doc,
// "Recovery"); a Window shorter than it has only the one window.
const ShortWindow = time.Second

// MaxRejectProbability caps the probability of a local rejection, so that
// a backend that refuses everything still receives a tenth of the
// requests: the ones that show it has recovered.
const MaxRejectProbability = 0.9

// buckets is the number of buckets in a window.
const buckets = 16

// Config is the normalized configuration of a [Throttle]. Zero fields take
// their defaults.
type Config struct {
	// K is the multiplier of accepts, in [1, 100]; 0 means DefaultK.
	K float64
	// Window is the length over which requests and accepts are counted; 0
	// means DefaultWindow. At least 16ns.
	Window time.Duration
	// Seed seeds the draws.
	Seed uint64
}

// Validate reports the first field of c out of range.
func (c Config) Validate() error {
	switch {
	case !(c.K == 0 || c.K >= 1 && c.K <= 100):
		return errors.New("adaptive: k must be between 1 and 100")
	case c.Window < 0 || c.Window > 0 && c.Window < buckets:
		return errors.New("adaptive: window must be at least 16ns")
	}
	return nil
}

// bucket holds the counts of one slice of a window.
type bucket struct {
	requests, accepts float64
}

// ring is one window's counts, in buckets rotated lazily from now.
type ring struct {
	width time.Duration // of a bucket; immutable
	b     [buckets]bucket
	head  int       // the bucket of the current slice
	start time.Time // of the current slice; zero before the first count
	sum   bucket    // the total over the buckets
}

// rotate moves the window to now, clearing the buckets it left.
func (r *ring) rotate(now time.Time) {
	if r.start.IsZero() {
		r.start = now
		return
	}
	d := now.Sub(r.start)
	if d < r.width {
		return
	}
	n := int64(d / r.width)
	if n >= buckets {
		r.b, r.sum = [buckets]bucket{}, bucket{}
	} else {
		for range n {
			r.head = (r.head + 1) % buckets
			r.sum.requests -= r.b[r.head].requests
			r.sum.accepts -= r.b[r.head].accepts
			r.b[r.head] = bucket{}
		}
	}
	r.start = r.start.Add(time.Duration(n) * r.width)
}

// add counts a request, accepted or not, in the current bucket.
func (r *ring) add(accepted bool) {
	r.b[r.head].requests++
	r.sum.requests++
	if accepted {
		r.b[r.head].accepts++
		r.sum.accepts++
	}
}

// prob is the formula of the package doc over r's window.
func (r *ring) prob(k float64) float64 {
	return max(0, (r.sum.requests-k*r.sum.accepts)/(r.sum.requests+1))
}

// A Throttle is one method's adaptive throttle. Use [New].
type Throttle struct {
	k float64 // immutable

	mu      sync.Mutex
	rng     *rand.Rand
	long    ring
	short   ring      // over ShortWindow; unused (width 0) when Window is not longer
	refused time.Time // when the backend last refused a request; zero: never
}

// New returns a Throttle for cfg, or cfg's error.
func New(cfg Config) (*Throttle, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.K == 0 {
		cfg.K = DefaultK
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	t := &Throttle{
		k:   cfg.K,
		rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
	}
	t.long.width = cfg.Window / buckets
	if cfg.Window > ShortWindow {
		t.short.width = ShortWindow / buckets
	}
	return t, nil
}

// rotate moves both windows to now.
func (t *Throttle) rotate(now time.Time) {
	t.long.rotate(now)
	if t.short.width > 0 {
		t.short.rotate(now)
	}
}

// add counts a request in both windows.
func (t *Throttle) add(accepted bool) {
	t.long.add(accepted)
	if t.short.width > 0 {
		t.short.add(accepted)
	}
}

// Allow reports whether a request tried at now may go out. A request it
// rejects is counted, as a request the backend did not accept; a request
// that goes out is counted by one Done once its outcome is known, and not
// at all when it never reaches the backend (a local rejection of another
// guard): so requests still in flight do not look refused, and only what
// the backend answered counts.
func (t *Throttle) Allow(now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rotate(now)
	p := t.probLocked(now)
	if p == 0 || t.rng.Float64() >= p {
		return true
	}
	t.add(false)
	return false
}

// Done counts, at now, a request that went out and whose outcome is known:
// accepted by the backend, or refused.
func (t *Throttle) Done(now time.Time, accepted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rotate(now)
	t.add(accepted)
	if !accepted {
		t.refused = now
	}
}

// quiet is how long the backend must go without refusing a request before
// the short window may lower the probability.
const quiet = ShortWindow / 4

// probLocked is the probability of the package doc at now: the formula over
// the long window, or, once the backend has refused nothing for quiet, over
// the short one when that is smaller; at most MaxRejectProbability.
func (t *Throttle) probLocked(now time.Time) float64 {
	p := t.long.prob(t.k)
	if t.short.width > 0 && now.Sub(t.refused) >= quiet {
		p = min(p, t.short.prob(t.k))
	}
	return min(p, MaxRejectProbability)
}

// Snapshot is a Throttle's counts over the window at an instant.
type Snapshot struct {
	Requests, Accepts float64
	// RejectProbability is the probability of a local rejection now.
	RejectProbability float64
}

// Snapshot returns the counts at now.
func (t *Throttle) Snapshot(now time.Time) Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rotate(now)
	return Snapshot{Requests: t.long.sum.requests, Accepts: t.long.sum.accepts, RejectProbability: t.probLocked(now)}
}
