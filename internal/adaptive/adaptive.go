package adaptive

import (
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Config.
const (
	DefaultK      = 2
	DefaultWindow = time.Minute
)

// MaxRejectProbability caps the probability of a local rejection, so that
// a backend that refuses everything still receives a tenth of the
// requests: the ones that show it has recovered.
const MaxRejectProbability = 0.9

// Step is the gain of the rejection probability: each outcome of a request
// that went out moves it by Step × (refused − (1 − 1/K)), up by Step/K for a
// refusal and down by Step·(1 − 1/K) for an acceptance (see the package doc).
const Step = 0.02

// minTarget is the least share of refusals among the requests sent that the
// probability settles at (1 − 1/K), so that a K near 1 still lets the
// probability fall when the backend accepts nearly everything.
const minTarget = 0.05

// buckets is the number of buckets in a window.
const buckets = 16

// Config is the normalized configuration of a [Throttle]. Zero fields take
// their defaults.
type Config struct {
	// K is the multiplier of accepts, in [1, 100]; 0 means DefaultK.
	K float64
	// Window is the length over which Snapshot counts requests and
	// accepts, and four times the half-life of the probability without an
	// answer; 0 means DefaultWindow. At least 16ns.
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

// A Throttle is one method's adaptive throttle. Use [New].
type Throttle struct {
	k      float64       // immutable
	target float64       // the share of refusals p settles at: 1 − 1/K, at least minTarget; immutable
	half   time.Duration // after half without an outcome, p halves every half: Window/4; immutable

	// free is true while p is 0 and the window has started: Allow then
	// admits without the lock (it would draw nothing and change nothing).
	// Written with mu held, by every method that may change p or start
	// the window (publishLocked).
	free atomic.Bool

	mu       sync.Mutex
	rng      *rand.Rand
	p        float64   // the rejection probability, in [0, MaxRejectProbability]
	answered time.Time // of the last outcome (Done); zero before the first
	decayed  time.Time // until when p has been decayed for the lack of outcomes
	long     ring      // the counts Snapshot reports, over Window
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
		k:      cfg.K,
		target: max(1-1/cfg.K, minTarget),
		half:   cfg.Window / 4,
		rng:    rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
	}
	t.long.width = cfg.Window / buckets
	return t, nil
}

// Allow reports whether a request tried at now may go out: a draw against
// the rejection probability. A request it rejects is counted as a request
// (for Snapshot) and changes nothing else: a local rejection says nothing
// of the backend. A request that goes out is counted by one Done once its
// outcome is known, and not at all when it never reaches the backend (a
// local rejection of another guard): so requests still in flight do not
// look refused, and only what the backend answered moves the probability.
//
// While the probability is 0 (a backend that refuses nothing) Allow takes
// no lock: every attempt of a healthy method would otherwise contend for
// it twice, here and in Done.
func (t *Throttle) Allow(now time.Time) bool {
	if t.free.Load() {
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.publishLocked()
	t.long.rotate(now)
	p := t.probLocked(now)
	if p == 0 || t.rng.Float64() >= p {
		return true
	}
	t.long.add(false)
	return false
}

// publishLocked sets free from p and the window, for Allow's lock-free
// path. mu is held.
func (t *Throttle) publishLocked() {
	t.free.Store(t.p == 0 && !t.long.start.IsZero())
}

// Done counts, at now, a request that went out and whose outcome is known:
// accepted by the backend, or refused. It moves the rejection probability
// by Step/K up for a refusal, by Step·(1 − 1/K) down for an acceptance.
func (t *Throttle) Done(now time.Time, accepted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.publishLocked()
	t.long.rotate(now)
	t.long.add(accepted)
	p := t.probLocked(now)
	if accepted {
		p -= Step * t.target
	} else {
		p += Step * (1 - t.target)
	}
	t.p = min(max(p, 0), MaxRejectProbability)
	if now.After(t.answered) {
		t.answered = now
	}
}

// probLocked returns the probability at now, decayed for the time without
// an outcome: after Window/4 without one, it halves every Window/4, so that
// a probability left high by an outage that traffic stopped showing does
// not outlive it (a state that only moves when requests complete ages with
// time too). While outcomes keep coming, time alone moves nothing: a decay
// between answers would pull p below where the answers settle it (against
// a backend accepting 30% of the offered load, with K = 2 and a 10 s
// window, the client sent 73% instead of 60%).
func (t *Throttle) probLocked(now time.Time) float64 {
	if t.p == 0 || t.answered.IsZero() {
		return t.p
	}
	from := t.answered.Add(t.half)
	if t.decayed.After(from) {
		from = t.decayed
	}
	if now.After(from) {
		t.p *= math.Exp2(-float64(now.Sub(from)) / float64(t.half))
		if t.p < 1e-6 {
			t.p = 0
		}
		t.decayed = now
	}
	return t.p
}

// Snapshot is a Throttle's counts over the window at an instant.
type Snapshot struct {
	// Requests and Accepts count the requests tried (sent or rejected
	// locally) and those the backend accepted, over the last Window.
	Requests, Accepts float64
	// RejectProbability is the probability of a local rejection now.
	RejectProbability float64
}

// Snapshot returns the counts at now, and the probability, decayed to now.
func (t *Throttle) Snapshot(now time.Time) Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.publishLocked()
	t.long.rotate(now)
	return Snapshot{Requests: t.long.sum.requests, Accepts: t.long.sum.accepts, RejectProbability: t.probLocked(now)}
}
