package outlier

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// The defaults of a zero Config field, as documented on Config.
const (
	DefaultConsecutiveFailures = 5
	DefaultMinimumCalls        = 20
	DefaultWindow              = 10 * time.Second
	DefaultBaseEjectionTime    = 30 * time.Second
	DefaultMaxEjectionTime     = 300 * time.Second
	DefaultMaxEjectionPercent  = 50
)

// maxMultiplier bounds the ejection multiplier, far past any useful
// MaxEjectionTime/BaseEjectionTime ratio, so that products stay finite.
const maxMultiplier = 1 << 16

// numBuckets is the number of buckets of the rolling window.
const numBuckets = 10

// Config is the normalized configuration of a Group. The caller turns a
// user's policy into it; New rejects what is out of range.
type Config struct {
	// ConsecutiveFailures ejects an endpoint after that many failures in a
	// row. 0 is off.
	ConsecutiveFailures int
	// FailureRate ejects an endpoint when failures/outcomes over Window
	// reach it (≥), in (0, 1]. 0 is off.
	FailureRate float64
	// MinimumCalls is the number of outcomes Window must hold before the
	// rate can eject; ≥ 1.
	MinimumCalls int
	// Window is the span of the rolling window of the rate; > 0.
	Window time.Duration
	// BaseEjectionTime is the first ejection's length; > 0.
	BaseEjectionTime time.Duration
	// MaxEjectionTime caps an ejection's length; below BaseEjectionTime it
	// means BaseEjectionTime.
	MaxEjectionTime time.Duration
	// MaxEjectionPercent bounds the share of the group's endpoints out of
	// rotation at once, in [0, 100]. 0 ejects nothing.
	MaxEjectionPercent int
}

// Validate reports the first field out of range.
func (c Config) Validate() error {
	switch {
	case c.ConsecutiveFailures < 0:
		return fmt.Errorf("outlier: ConsecutiveFailures %d is negative", c.ConsecutiveFailures)
	case !(c.FailureRate >= 0 && c.FailureRate <= 1):
		return fmt.Errorf("outlier: FailureRate %v is not in [0, 1]", c.FailureRate)
	case c.MinimumCalls < 1:
		return errors.New("outlier: MinimumCalls must be at least 1")
	case c.Window <= 0:
		return errors.New("outlier: Window must be positive")
	case c.BaseEjectionTime <= 0:
		return errors.New("outlier: BaseEjectionTime must be positive")
	case c.MaxEjectionTime < 0:
		return errors.New("outlier: MaxEjectionTime is negative")
	case c.MaxEjectionPercent < 0 || c.MaxEjectionPercent > 100:
		return fmt.Errorf("outlier: MaxEjectionPercent %d is not in [0, 100]", c.MaxEjectionPercent)
	}
	return nil
}

// Outcome is how an attempt on an endpoint ended, for ejection.
type Outcome uint8

const (
	// Ignored says nothing of the endpoint's health: the caller cancelled,
	// the request was rejected for its content, the attempt never left.
	Ignored Outcome = iota
	// Success is a good answer.
	Success
	// Failure is an answer that says the endpoint is broken.
	Failure
	// Busy is a refusal for load (RESOURCE_EXHAUSTED, a server pushback):
	// the endpoint is healthy but full. It neither counts as a failure nor
	// breaks a run of failures.
	Busy
)

// Group is the set of endpoints of one channel, among which the share out
// of rotation is bounded.
type Group struct {
	cfg Config
	mu  sync.Mutex // guards members, and every ejection decision
	// members are the endpoints in the group, in no order.
	members []*Endpoint
	// ejections counts ejections since New, for metrics.
	ejections atomic.Uint64
	// refused counts ejections refused by MaxEjectionPercent: one each
	// time an endpoint crosses its threshold, however many failures it
	// then has while the bound holds it back.
	refused atomic.Uint64
	// epoch is the origin of the group's instants (see ns); it carries a
	// monotonic reading, so that the instants follow the monotonic clock
	// and a step of the wall clock moves no ejection's end.
	epoch time.Time
}

// origin is the instant of epoch: the instants stay positive for 146
// years either side of it.
const origin = 1 << 62

// ns returns now as an instant of the group: origin plus the time since
// epoch, which Go measures on the monotonic clock when now carries a
// monotonic reading too (time.Now's), and on the wall clock otherwise.
func (g *Group) ns(now time.Time) int64 {
	return origin + int64(min(max(now.Sub(g.epoch), -origin+1), math.MaxInt64-origin))
}

// wall returns the time of the instant t.
func (g *Group) wall(t int64) time.Time { return g.epoch.Add(time.Duration(t - origin)) }

// New returns an empty group under cfg.
func New(cfg Config) (*Group, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxEjectionTime < cfg.BaseEjectionTime {
		cfg.MaxEjectionTime = cfg.BaseEjectionTime
	}
	return &Group{cfg: cfg, epoch: time.Now()}, nil
}

// Config returns the group's configuration, normalized.
func (g *Group) Config() Config { return g.cfg }

// Add returns a new endpoint in the group.
func (g *Group) Add() *Endpoint {
	e := &Endpoint{g: g}
	e.win.width = max(int64(g.cfg.Window)/numBuckets, 1)
	g.mu.Lock()
	g.members = append(g.members, e)
	g.mu.Unlock()
	return e
}

// Remove takes e out of the group: it no longer counts toward the share of
// endpoints, nor ejects.
func (g *Group) Remove(e *Endpoint) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, m := range g.members {
		if m == e {
			last := len(g.members) - 1
			g.members[i], g.members[last] = g.members[last], nil
			g.members = g.members[:last]
			e.removed.Store(true)
			return
		}
	}
}

// Ejections returns the number of ejections since New, and of ejections
// MaxEjectionPercent refused.
func (g *Group) Ejections() (ejected, refused uint64) {
	return g.ejections.Load(), g.refused.Load()
}

// EjectedCount returns how many endpoints are out of rotation at now, and
// how many the group holds.
func (g *Group) EjectedCount(now time.Time) (ejected, total int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ejectedLocked(g.ns(now)), len(g.members)
}

func (g *Group) ejectedLocked(t int64) int {
	n := 0
	for _, m := range g.members {
		if t < m.until.Load() {
			n++
		}
	}
	return n
}

// mayEjectLocked reports whether one more endpoint may leave rotation at t.
func (g *Group) mayEjectLocked(t int64) bool {
	return (g.ejectedLocked(t)+1)*100 <= g.cfg.MaxEjectionPercent*len(g.members)
}

// Endpoint is the ejection state of one endpoint. Its zero value is not
// usable: Group.Add makes them.
type Endpoint struct {
	g       *Group
	removed atomic.Bool
	// until is the instant (Group.ns) its ejection ends; 0 or past: in
	// rotation. Written under mu and g.mu, read anywhere.
	until atomic.Int64

	mu          sync.Mutex // guards what follows
	consecutive int        // failures in a row
	win         window     // outcomes over Window
	multiplier  int        // ejections in a row, decayed in rotation
	returned    int64      // when the last ejection ended (Group.ns); 0: never ejected
	probation   bool       // back from an ejection, no success since
	count       uint64     // ejections of this endpoint
	// heldBack: over its threshold, its ejection refused by the group's
	// bound, and counted so (once) in refused; cleared when a failure finds
	// it under its threshold, or it is ejected.
	heldBack bool
}

// Ejected reports whether e is out of rotation at now.
func (e *Endpoint) Ejected(now time.Time) bool {
	u := e.until.Load()
	return u != 0 && e.g.ns(now) < u
}

// EjectedUntil returns when e's ejection ends; zero when it is in rotation
// at now.
func (e *Endpoint) EjectedUntil(now time.Time) time.Time {
	u := e.until.Load()
	if u == 0 || e.g.ns(now) >= u {
		return time.Time{}
	}
	return e.g.wall(u)
}

// Record counts an attempt's outcome at now, and reports whether it ejected
// e.
func (e *Endpoint) Record(now time.Time, o Outcome) (ejected bool) {
	if o == Ignored || o == Busy {
		return false
	}
	t := e.g.ns(now)
	e.mu.Lock()
	defer e.mu.Unlock()
	if u := e.until.Load(); u != 0 {
		if t < u {
			return false // in flight when it was ejected
		}
		e.returnLocked(u)
	}
	if o == Success {
		e.consecutive = 0
		e.probation = false
		e.win.add(t, false)
		return false
	}
	e.consecutive = min(e.consecutive+1, math.MaxInt32)
	e.win.add(t, true)
	if !e.tripsLocked() {
		e.heldBack = false
		return false
	}
	return e.ejectLocked(t)
}

// returnLocked puts e back in rotation as of u, when its ejection ended:
// its counters start afresh, on probation.
func (e *Endpoint) returnLocked(u int64) {
	e.until.Store(0)
	e.returned = u
	e.probation = true
	e.consecutive = 0
	e.win.clear()
}

func (e *Endpoint) tripsLocked() bool {
	c := e.g.cfg
	switch {
	case e.probation:
		return true
	case c.ConsecutiveFailures > 0 && e.consecutive >= c.ConsecutiveFailures:
		return true
	case c.FailureRate > 0 && e.win.calls >= c.MinimumCalls:
		return float64(e.win.failures) >= c.FailureRate*float64(e.win.calls)
	}
	return false
}

// ejectLocked ejects e at t unless the group's bound refuses it; a refusal
// leaves the counters as they are, so the next failure asks again.
func (e *Endpoint) ejectLocked(t int64) bool {
	g := e.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if e.removed.Load() {
		return false // gone from the group: no ejection, and no refusal
	}
	if !g.mayEjectLocked(t) {
		if !e.heldBack {
			e.heldBack = true
			g.refused.Add(1)
		}
		return false
	}
	e.heldBack = false
	d := e.nextEjectionLocked(t)
	e.until.Store(addSaturating(t, int64(d)))
	e.count++
	g.ejections.Add(1)
	e.probation = false
	return true
}

// addSaturating returns t+d (d ≥ 0), or math.MaxInt64 when the sum
// would pass it: an ejection of centuries ends at the end of time rather
// than at a negative instant, which would eject nothing.
func addSaturating(t, d int64) int64 {
	if t > math.MaxInt64-d {
		return math.MaxInt64
	}
	return t + d
}

// nextEjectionLocked raises the multiplier, after decaying it by one per
// BaseEjectionTime in rotation since the last ejection ended, and returns
// the ejection's length.
func (e *Endpoint) nextEjectionLocked(t int64) time.Duration {
	c := e.g.cfg
	base := int64(c.BaseEjectionTime)
	if e.returned != 0 && t > e.returned {
		decay := (t - e.returned) / base
		e.multiplier = int(max(int64(e.multiplier)-decay, 0))
	}
	e.multiplier = min(e.multiplier+1, maxMultiplier)
	return EjectionTime(c, e.multiplier)
}

// EjectionTime returns the length of an ejection with multiplier k ≥ 1
// under c: min(k × BaseEjectionTime, max(BaseEjectionTime,
// MaxEjectionTime)).
func EjectionTime(c Config, k int) time.Duration {
	limit := max(c.BaseEjectionTime, c.MaxEjectionTime)
	if int64(k) > int64(limit/c.BaseEjectionTime) {
		return limit
	}
	return time.Duration(k) * c.BaseEjectionTime
}

// State is a copy of an endpoint's ejection state, for snapshots.
type State struct {
	EjectedUntil        time.Time // zero: in rotation
	Ejections           uint64    // since the endpoint joined
	Multiplier          int       // the last ejection's multiplier, before decay
	ConsecutiveFailures int
	Calls, Failures     int // in the window
}

// State returns e's state at now.
func (e *Endpoint) State(now time.Time) State {
	e.mu.Lock()
	defer e.mu.Unlock()
	calls, failures := e.win.at(e.g.ns(now))
	return State{EjectedUntil: e.EjectedUntil(now), Ejections: e.count, Multiplier: e.multiplier,
		ConsecutiveFailures: e.consecutive, Calls: calls, Failures: failures}
}

// MaybeEjected reports whether e has been ejected and not yet counted an
// outcome since: Ejected needs the time only then. One atomic load.
func (e *Endpoint) MaybeEjected() bool { return e.until.Load() != 0 }
