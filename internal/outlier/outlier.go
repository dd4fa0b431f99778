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
	// ConsecutiveLocalFailures ejects an endpoint after that many
	// local-origin failures in a row (LocalFailure). 0 is off.
	ConsecutiveLocalFailures int
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
	case c.ConsecutiveLocalFailures < 0:
		return fmt.Errorf("outlier: ConsecutiveLocalFailures %d is negative", c.ConsecutiveLocalFailures)
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

// normalized returns c with MaxEjectionTime at least BaseEjectionTime.
func (c Config) normalized() Config {
	if c.MaxEjectionTime < c.BaseEjectionTime {
		c.MaxEjectionTime = c.BaseEjectionTime
	}
	return c
}

// Outcome is how an attempt on an endpoint ended, for ejection.
type Outcome uint8

const (
	// Ignored says nothing of the endpoint's health: the caller cancelled,
	// the request was rejected for its content, the attempt never left.
	Ignored Outcome = iota
	// Success is a good answer.
	Success
	// Failure is an answer that says the endpoint is broken, or an
	// attempt the endpoint did not answer in the time the caller's
	// configuration gives each attempt (its external failures, in
	// Envoy's words).
	Failure
	// LocalFailure is a failure of the way to the endpoint rather than an
	// answer: its connection was refused or reset before any response
	// (Envoy's local-origin failures). It counts toward
	// ConsecutiveLocalFailures only, and an ejection it causes ends as
	// soon as the endpoint has a working connection again (Reconnected).
	LocalFailure
	// Busy is a refusal for load (RESOURCE_EXHAUSTED, a server pushback):
	// the endpoint is healthy but full. It neither counts as a failure nor
	// breaks a run of failures.
	Busy
)

// Cause says why an endpoint was ejected.
type Cause uint8

const (
	// NotEjected: no ejection.
	NotEjected Cause = iota
	// ConsecutiveFailures: ConsecutiveFailures failures in a row.
	ConsecutiveFailures
	// FailureRate: the failure rate over the window reached FailureRate.
	FailureRate
	// LocalOrigin: ConsecutiveLocalFailures local-origin failures in a
	// row, or one while on probation.
	LocalOrigin
	// Probation: a failure while on probation (the first outcome after
	// an ejection ended, before any success).
	Probation
)

var causeNames = [...]string{"none", "consecutive_failures", "failure_rate", "local_origin", "probation"}

// String returns the cause's name in snake case, for logs and metric
// labels.
func (c Cause) String() string {
	if int(c) < len(causeNames) {
		return causeNames[c]
	}
	return "cause(" + fmt.Sprint(uint8(c)) + ")"
}

// Reason says why an ejection ended.
type Reason uint8

const (
	// NotReturned: no ejection ended.
	NotReturned Reason = iota
	// Expired: its ejection time passed.
	Expired
	// Answered: an attempt sent to it while it was ejected (no other
	// endpoint was usable) succeeded.
	Answered
	// Reconnected: ejected for local-origin failures, it has a working
	// connection again.
	Reconnected
	// Bound: the endpoints shrank, or MaxEjectionPercent was lowered, and
	// the bound would otherwise be exceeded; the longest-ejected endpoints
	// return first.
	Bound
	// Shortened: a new configuration's MaxEjectionTime ended it.
	Shortened
)

var reasonNames = [...]string{"none", "expired", "answered", "reconnected", "max_ejection_percent", "max_ejection_time"}

// String returns the reason's name in snake case, for logs and metric
// labels.
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "reason(" + fmt.Sprint(uint8(r)) + ")"
}

// Change is what a call did to an endpoint's ejection state, for the
// caller's logs and metrics. The zero Change is no change.
type Change struct {
	// Return is why an ejection of the endpoint ended during the call;
	// NotReturned when none did. EjectedFor is how long it lasted.
	Return     Reason
	EjectedFor time.Duration
	// Cause is why the call ejected the endpoint; NotEjected when it did
	// not. Duration is the ejection's length, Count the endpoint's
	// ejections so far, this one included.
	Cause    Cause
	Duration time.Duration
	Count    uint64
	// Refused is the cause of an ejection MaxEjectionPercent refused (the
	// endpoint crossed its threshold): once per crossing; NotEjected when
	// none was.
	Refused Cause
}

// Ejected reports whether the call ejected the endpoint.
func (c Change) Ejected() bool { return c.Cause != NotEjected }

// Group is the set of endpoints of one channel, among which the share out
// of rotation is bounded.
type Group struct {
	cfg atomic.Pointer[Config] // normalized; replaced whole by SetConfig
	mu  sync.Mutex             // guards members, and every ejection decision
	// members are the endpoints in the group, in no order.
	members []*Endpoint
	// ejections counts ejections since New, for metrics.
	ejections atomic.Uint64
	// refused counts ejections refused by MaxEjectionPercent: one each
	// time an endpoint crosses its threshold, however many failures it
	// then has while the bound holds it back.
	refused atomic.Uint64
	// returns counts the ejections that ended, by Reason.
	returns [len(reasonNames)]atomic.Uint64
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
	g := &Group{epoch: time.Now()}
	c := cfg.normalized()
	g.cfg.Store(&c)
	return g, nil
}

// Config returns the group's configuration, normalized.
func (g *Group) Config() Config { return *g.cfg.Load() }

// Add returns a new endpoint in the group.
func (g *Group) Add() *Endpoint {
	e := &Endpoint{g: g}
	g.mu.Lock()
	g.members = append(g.members, e)
	g.mu.Unlock()
	return e
}

// Returned is an ejection a group-wide change ended: the endpoint, and the
// change (its Return and EjectedFor).
type Returned struct {
	Endpoint *Endpoint
	Change   Change
}

// Remove takes e out of the group: it no longer counts toward the share of
// endpoints, nor ejects. With fewer endpoints, the ejected ones may pass
// MaxEjectionPercent: the longest-ejected return until they do not, and
// Remove reports them.
func (g *Group) Remove(e *Endpoint, now time.Time) []Returned {
	g.mu.Lock()
	for i, m := range g.members {
		if m == e {
			last := len(g.members) - 1
			g.members[i], g.members[last] = g.members[last], nil
			g.members = g.members[:last]
			e.removed.Store(true)
			break
		}
	}
	g.mu.Unlock()
	return g.enforce(now, nil)
}

// SetConfig replaces the group's configuration, keeping every endpoint's
// state: its ejection, multiplier and runs of failures. What the new
// configuration forbids ends: an ejection longer than the new
// MaxEjectionTime allows for its multiplier is shortened (ended at once if
// that is past), and a lower MaxEjectionPercent returns the
// longest-ejected endpoints until the bound holds. It reports the
// ejections it ended. A failure-rate window of another span starts empty.
func (g *Group) SetConfig(cfg Config, now time.Time) ([]Returned, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := cfg.normalized()
	g.cfg.Store(&c)
	t := g.ns(now)
	var out []Returned
	for _, e := range g.snapshotMembers() {
		e.mu.Lock()
		g.mu.Lock()
		if u := e.until.Load(); u != 0 && t < u && !e.removed.Load() {
			end := addSaturating(e.since, int64(EjectionTime(c, max(e.multiplier, 1))))
			if end < u {
				if end <= t {
					g.mu.Unlock()
					out = append(out, Returned{e, e.returnLocked(t, Shortened)})
					e.mu.Unlock()
					continue
				}
				e.until.Store(end)
			}
		}
		g.mu.Unlock()
		e.mu.Unlock()
	}
	return g.enforce(now, out), nil
}

// Sweep ends the ejections whose time has passed at now and reports them:
// an ejection's end is otherwise noticed at the endpoint's next outcome,
// and an operator's view (a snapshot, a metric) wants it when it happens.
func (g *Group) Sweep(now time.Time) []Returned {
	t := g.ns(now)
	var out []Returned
	for _, e := range g.snapshotMembers() {
		if u := e.until.Load(); u == 0 || t < u {
			continue
		}
		e.mu.Lock()
		if u := e.until.Load(); u != 0 && t >= u {
			out = append(out, Returned{e, e.returnLocked(u, Expired)})
		}
		e.mu.Unlock()
	}
	return out
}

func (g *Group) snapshotMembers() []*Endpoint {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*Endpoint(nil), g.members...)
}

// enforce returns the longest-ejected endpoints until the ejected ones
// are within MaxEjectionPercent of the members at now, appending them to
// out. Each return takes the endpoint's lock before the group's, as Record
// does; the victim is chosen again under both.
func (g *Group) enforce(now time.Time, out []Returned) []Returned {
	t := g.ns(now)
	for {
		g.mu.Lock()
		victim := g.overBoundLocked(t)
		g.mu.Unlock()
		if victim == nil {
			return out
		}
		victim.mu.Lock()
		g.mu.Lock()
		still := g.overBoundLocked(t) == victim
		g.mu.Unlock()
		if still {
			out = append(out, Returned{victim, victim.returnLocked(t, Bound)})
		}
		victim.mu.Unlock()
	}
}

// overBoundLocked returns the longest-ejected member when the ejected
// members at t exceed MaxEjectionPercent of the members, else nil.
func (g *Group) overBoundLocked(t int64) *Endpoint {
	var oldest *Endpoint
	n := 0
	for _, m := range g.members {
		if t < m.until.Load() {
			n++
			if oldest == nil || m.since < oldest.since {
				oldest = m
			}
		}
	}
	if n*100 <= g.cfg.Load().MaxEjectionPercent*len(g.members) {
		return nil
	}
	return oldest
}

// Ejections returns the number of ejections since New, and of ejections
// MaxEjectionPercent refused.
func (g *Group) Ejections() (ejected, refused uint64) {
	return g.ejections.Load(), g.refused.Load()
}

// Returns returns the number of ejections since New that ended for r.
func (g *Group) Returns(r Reason) uint64 {
	if int(r) >= len(g.returns) {
		return 0
	}
	return g.returns[r].Load()
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
	return (g.ejectedLocked(t)+1)*100 <= g.cfg.Load().MaxEjectionPercent*len(g.members)
}

// Endpoint is the ejection state of one endpoint. Its zero value is not
// usable: Group.Add makes them.
type Endpoint struct {
	g       *Group
	removed atomic.Bool
	// until is the instant (Group.ns) its ejection ends; 0: in rotation
	// (or past: in rotation, its return not yet noticed). An ejection
	// (until raised) is written under mu and g.mu; a return (until set to
	// 0) under mu.
	until atomic.Int64
	// since, cause and multiplier are written under mu and g.mu, and read
	// under either.
	since      int64 // when the current or last ejection began (Group.ns)
	cause      Cause // why
	multiplier int   // ejections in a row, decayed in rotation

	mu               sync.Mutex // guards what follows
	consecutive      int        // failures in a row
	consecutiveLocal int        // local-origin failures in a row
	win              window     // outcomes over Window
	returned         int64      // when the last ejection ended (Group.ns); 0: never ejected
	probation        bool       // back from an ejection, no success since
	count            uint64     // ejections of this endpoint
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

// Record counts the outcome of an attempt picked while e was in rotation,
// at now. An outcome that arrives while e is ejected (the attempt was in
// flight when it was ejected) is dropped.
func (e *Endpoint) Record(now time.Time, o Outcome) Change {
	return e.record(now, o, false)
}

// RecordLastResort counts the outcome of an attempt sent to e while it was
// ejected, because no endpoint in rotation was usable. A success ends the
// ejection at once (Answered): the endpoint answers again, and waiting out
// its ejection time would leave every call on ejected endpoints. A failure
// changes nothing.
func (e *Endpoint) RecordLastResort(now time.Time, o Outcome) Change {
	return e.record(now, o, true)
}

func (e *Endpoint) record(now time.Time, o Outcome, lastResort bool) Change {
	if o == Ignored || o == Busy {
		return Change{}
	}
	t := e.g.ns(now)
	cfg := e.g.cfg.Load()
	e.mu.Lock()
	defer e.mu.Unlock()
	var ch Change
	if u := e.until.Load(); u != 0 {
		switch {
		case t >= u:
			ch = e.returnLocked(u, Expired)
		case lastResort && o == Success:
			ch = e.returnLocked(t, Answered)
		default:
			return Change{} // in flight when it was ejected, or a last resort that failed
		}
	}
	e.win.resize(cfg.Window)
	switch o {
	case Success:
		e.consecutive, e.consecutiveLocal = 0, 0
		e.probation = false
		e.win.add(t, false)
		return ch
	case LocalFailure:
		e.consecutiveLocal = min(e.consecutiveLocal+1, math.MaxInt32)
	default:
		// An answer, even a failing one, says the way to the endpoint
		// works: it ends a run of local-origin failures.
		e.consecutive = min(e.consecutive+1, math.MaxInt32)
		e.consecutiveLocal = 0
		e.win.add(t, true)
	}
	cause := e.tripsLocked(cfg, o)
	if cause == NotEjected {
		e.heldBack = false
		return ch
	}
	ej := e.ejectLocked(t, cause)
	ej.Return, ej.EjectedFor = ch.Return, ch.EjectedFor
	return ej
}

// Reconnected tells e that its connection is working again after it was
// lost (grpc's READY after another state). A first ejection for
// local-origin failures (multiplier 1) ends at once, on probation: the
// failures it counted were of a connection that no longer exists, as when
// a backend restarts in place. A repeated one (the endpoint failed again
// on probation: a backend that crashes on every call and comes back at
// once) waits its time, as any other ejection.
func (e *Endpoint) Reconnected(now time.Time) Change {
	if e.until.Load() == 0 {
		return Change{}
	}
	t := e.g.ns(now)
	e.mu.Lock()
	defer e.mu.Unlock()
	u := e.until.Load()
	switch {
	case u == 0:
		return Change{}
	case t >= u:
		return e.returnLocked(u, Expired)
	case e.cause == LocalOrigin && e.multiplier <= 1:
		return e.returnLocked(t, Reconnected)
	}
	return Change{}
}

// returnLocked puts e back in rotation as of at for reason: its counters
// start afresh, on probation unless it answered.
func (e *Endpoint) returnLocked(at int64, reason Reason) Change {
	ch := Change{Return: reason, EjectedFor: time.Duration(max(at-e.since, 0))}
	e.until.Store(0)
	e.returned = at
	e.probation = reason != Answered
	e.consecutive, e.consecutiveLocal = 0, 0
	e.win.clear()
	e.g.returns[reason].Add(1)
	return ch
}

// tripsLocked returns why the outcome o, just counted, ejects e under
// cfg, or NotEjected.
func (e *Endpoint) tripsLocked(cfg *Config, o Outcome) Cause {
	switch {
	case o == LocalFailure:
		if e.probation || cfg.ConsecutiveLocalFailures > 0 && e.consecutiveLocal >= cfg.ConsecutiveLocalFailures {
			return LocalOrigin
		}
	case e.probation:
		return Probation
	case cfg.ConsecutiveFailures > 0 && e.consecutive >= cfg.ConsecutiveFailures:
		return ConsecutiveFailures
	case cfg.FailureRate > 0 && e.win.calls >= cfg.MinimumCalls &&
		float64(e.win.failures) >= cfg.FailureRate*float64(e.win.calls):
		return FailureRate
	}
	return NotEjected
}

// ejectLocked ejects e at t for cause unless the group's bound refuses it;
// a refusal leaves the counters as they are, so the next failure asks
// again.
func (e *Endpoint) ejectLocked(t int64, cause Cause) Change {
	g := e.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if e.removed.Load() {
		return Change{} // gone from the group: no ejection, and no refusal
	}
	if !g.mayEjectLocked(t) {
		if !e.heldBack {
			e.heldBack = true
			g.refused.Add(1)
			return Change{Refused: cause}
		}
		return Change{}
	}
	e.heldBack = false
	d := e.nextEjectionLocked(t)
	e.since, e.cause = t, cause
	e.until.Store(addSaturating(t, int64(d)))
	e.count++
	g.ejections.Add(1)
	e.probation = false
	return Change{Cause: cause, Duration: d, Count: e.count}
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
	c := e.g.cfg.Load()
	base := int64(c.BaseEjectionTime)
	if e.returned != 0 && t > e.returned {
		decay := (t - e.returned) / base
		e.multiplier = int(max(int64(e.multiplier)-decay, 0))
	}
	e.multiplier = min(e.multiplier+1, maxMultiplier)
	return EjectionTime(*c, e.multiplier)
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
	EjectedUntil time.Time // zero: in rotation
	// EjectedSince is when the current ejection began; zero in rotation.
	EjectedSince time.Time
	Cause        Cause  // why it is ejected; NotEjected in rotation
	Ejections    uint64 // since the endpoint joined
	Multiplier   int    // the last ejection's multiplier, before decay
	Probation    bool   // back from an ejection, no success since
	// ConsecutiveFailures and ConsecutiveLocalFailures are its current
	// runs; Calls and Failures its outcomes in the window.
	ConsecutiveFailures      int
	ConsecutiveLocalFailures int
	Calls, Failures          int
}

// State returns e's state at now.
func (e *Endpoint) State(now time.Time) State {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.win.resize(e.g.cfg.Load().Window)
	calls, failures := e.win.at(e.g.ns(now))
	s := State{EjectedUntil: e.EjectedUntil(now), Ejections: e.count, Multiplier: e.multiplier,
		Probation: e.probation, ConsecutiveFailures: e.consecutive, ConsecutiveLocalFailures: e.consecutiveLocal,
		Calls: calls, Failures: failures}
	if !s.EjectedUntil.IsZero() {
		s.EjectedSince, s.Cause = e.g.wall(e.since), e.cause
	}
	return s
}

// MaybeEjected reports whether e has been ejected and its return not yet
// noticed: Ejected needs the time only then. One atomic load.
func (e *Endpoint) MaybeEjected() bool { return e.until.Load() != 0 }

// Saved is an endpoint's ejection state out of its group, to carry into
// another: the endpoint policy keeps it while a channel is idle (grpc
// closes the policy) and gives it to the policy grpc builds when the
// channel wakes. The failure counts and the window are not kept.
type Saved struct {
	Until      time.Time // when its ejection ends; zero: in rotation
	Since      time.Time // when its last ejection began; zero: never ejected
	Returned   time.Time // when its last ejection ended; zero: none has
	Cause      Cause
	Multiplier int
	Probation  bool
	Count      uint64
}

// Save returns e's state at now.
func (e *Endpoint) Save(now time.Time) Saved {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := Saved{Cause: e.cause, Multiplier: e.multiplier, Probation: e.probation, Count: e.count}
	if u := e.until.Load(); u != 0 {
		if e.g.ns(now) < u {
			s.Until = e.g.wall(u)
		} else {
			s.Returned, s.Probation = e.g.wall(u), true // ended, not yet noticed
		}
	} else if e.returned != 0 {
		s.Returned = e.wall(e.returned)
	}
	if e.count > 0 {
		s.Since = e.g.wall(e.since)
	}
	return s
}

func (e *Endpoint) wall(t int64) time.Time { return e.g.wall(t) }

// Fresh reports whether s holds nothing worth carrying at now under c:
// not ejected, and its multiplier decayed to zero (one BaseEjectionTime in
// rotation per unit since it returned). Probation lapses with the
// multiplier: a saved state has no outcome to end it, and one kept until
// an outcome would be kept for ever when its channel never wakes (grpc
// closes a closed channel's policy as it closes an idle one's).
func (s Saved) Fresh(now time.Time, c Config) bool {
	if !s.Until.IsZero() && now.Before(s.Until) {
		return false
	}
	if s.Multiplier == 0 {
		return true
	}
	return !s.Returned.IsZero() && now.Sub(s.Returned) >= time.Duration(s.Multiplier)*c.BaseEjectionTime
}

// AddSaved returns a new endpoint in the group with the state s (see
// Endpoint.Save). It may pass MaxEjectionPercent: the caller, having added
// every endpoint, calls Enforce.
func (g *Group) AddSaved(s Saved) *Endpoint {
	e := &Endpoint{g: g, cause: s.Cause, multiplier: s.Multiplier, probation: s.Probation, count: s.Count}
	if !s.Since.IsZero() {
		e.since = g.ns(s.Since)
	}
	if !s.Returned.IsZero() {
		e.returned = g.ns(s.Returned)
	}
	if !s.Until.IsZero() {
		e.until.Store(g.ns(s.Until))
	}
	g.mu.Lock()
	g.members = append(g.members, e)
	g.mu.Unlock()
	return e
}

// Enforce returns the longest-ejected endpoints until the ejected ones are
// within MaxEjectionPercent at now, and reports them.
func (g *Group) Enforce(now time.Time) []Returned { return g.enforce(now, nil) }
