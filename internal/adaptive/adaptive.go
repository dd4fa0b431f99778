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

// buckets is the number of buckets in the window.
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

// bucket holds the counts of one slice of the window.
type bucket struct {
	requests, accepts float64
}

// A Throttle is one method's adaptive throttle. Use [New].
type Throttle struct {
	k     float64       // immutable
	width time.Duration // of a bucket; immutable

	mu    sync.Mutex
	rng   *rand.Rand
	b     [buckets]bucket
	head  int       // the bucket of the current slice
	start time.Time // of the current slice; zero before the first call
	// sum is the total over the buckets.
	sum bucket
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
	return &Throttle{
		k:     cfg.K,
		width: cfg.Window / buckets,
		rng:   rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
	}, nil
}

// rotate moves the window to now, clearing the buckets it left.
func (t *Throttle) rotate(now time.Time) {
	if t.start.IsZero() {
		t.start = now
		return
	}
	d := now.Sub(t.start)
	if d < t.width {
		return
	}
	n := int64(d / t.width)
	if n >= buckets {
		t.b, t.sum = [buckets]bucket{}, bucket{}
	} else {
		for range n {
			t.head = (t.head + 1) % buckets
			t.sum.requests -= t.b[t.head].requests
			t.sum.accepts -= t.b[t.head].accepts
			t.b[t.head] = bucket{}
		}
	}
	t.start = t.start.Add(time.Duration(n) * t.width)
}

// Allow counts a request tried at now and reports whether it may go out;
// a request that goes out is followed by one Accepted when the backend
// accepts it, and by nothing otherwise.
func (t *Throttle) Allow(now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rotate(now)
	p := t.probLocked()
	t.b[t.head].requests++
	t.sum.requests++
	return p == 0 || t.rng.Float64() >= p
}

// Accepted counts a request the backend accepted, at now.
func (t *Throttle) Accepted(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rotate(now)
	t.b[t.head].accepts++
	t.sum.accepts++
}

// probLocked is the formula of the package doc.
func (t *Throttle) probLocked() float64 {
	return max(0, (t.sum.requests-t.k*t.sum.accepts)/(t.sum.requests+1))
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
	return Snapshot{Requests: t.sum.requests, Accepts: t.sum.accepts, RejectProbability: t.probLocked()}
}
