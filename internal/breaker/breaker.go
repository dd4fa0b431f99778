package breaker

import (
	"errors"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// State is the state of a Breaker. The zero value is StateClosed.
type State uint8

// The states. Closed, Open and HalfOpen follow each other by themselves; the
// forced states are entered only by ForceOpen and ForceClosed and left only
// by Reset (or the other Force call).
const (
	// StateClosed admits every attempt and counts outcomes.
	StateClosed State = iota
	// StateOpen rejects every attempt until its open time has passed.
	StateOpen
	// StateHalfOpen admits up to HalfOpenProbes attempts at once.
	StateHalfOpen
	// StateForcedOpen rejects every attempt until Reset.
	StateForcedOpen
	// StateForcedClosed admits every attempt and counts outcomes, but never
	// trips, until Reset.
	StateForcedClosed
)

// String returns the state's name: "closed", "open", "half-open",
// "forced-open" or "forced-closed".
func (s State) String() string {
	switch s {
	case StateClosed:
		return "closed"
	case StateOpen:
		return "open"
	case StateHalfOpen:
		return "half-open"
	case StateForcedOpen:
		return "forced-open"
	case StateForcedClosed:
		return "forced-closed"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Outcome is what became of an admitted attempt. The zero value is Ignored.
type Outcome uint8

// The outcomes.
const (
	// Ignored is neither success nor failure: the caller cancelled, the
	// request was bad, or the attempt never reached the server. It is not
	// counted, but it frees a half-open probe slot. Values other than
	// Success and Failure are taken as Ignored.
	Ignored Outcome = iota
	// Success counts as a call, and as a slow call when its duration is above
	// SlowCallDuration.
	Success
	// Failure counts as a call and a failure, and as a slow call when its
	// duration is above SlowCallDuration.
	Failure
)

// String returns "ignored", "success" or "failure".
func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Failure:
		return "failure"
	}
	return "ignored"
}

// The rejections of Allow. ErrForcedOpen and ErrHalfOpenFull wrap ErrOpen, so
// errors.Is(err, ErrOpen) holds for every rejection.
var (
	// ErrOpen rejects an attempt while the breaker is open.
	ErrOpen = errors.New("breaker: circuit open")
	// ErrForcedOpen rejects an attempt while an operator holds the breaker
	// open.
	ErrForcedOpen = &wrapError{msg: "breaker: circuit forced open", err: ErrOpen}
	// ErrHalfOpenFull rejects an attempt while the breaker is half-open and
	// all its probes are in flight.
	ErrHalfOpenFull = &wrapError{msg: "breaker: circuit half-open, probes in flight", err: ErrOpen}
)

type wrapError struct {
	msg string
	err error
}

func (e *wrapError) Error() string { return e.msg }
func (e *wrapError) Unwrap() error { return e.err }

// Token admits one attempt. Pass it to Record exactly once when the attempt
// is over. The zero Token, which Allow returns with a rejection, is ignored by
// Record.
type Token struct {
	// w is the breaker's state word at admission: generation and state.
	w uint64
	// at is the admission time of a half-open probe, Unix ns; 0 otherwise.
	at int64
}

// Probe reports whether the token admits a half-open probe.
func (t Token) Probe() bool { return t.w != 0 && State(t.w&stateMask) == StateHalfOpen }

// The state word packs the generation above the state.
const (
	stateBits = 3
	stateMask = 1<<stateBits - 1
)

// Breaker is the circuit breaker of one method. Create it with New; it is
// safe for concurrent use.
type Breaker struct {
	// word is gen<<stateBits | state. It is written only with mu held and
	// read without it by the fast paths of Allow and Record.
	word atomic.Uint64
	// The padding keeps word, read by every Allow, off the cache line of mu,
	// written by every Record.
	_ [56]byte

	// openUntil mirrors the field of the same name for the lock-free
	// rejections of Allow, and probesFullUntil is, while HalfOpen has every
	// probe out, the time (Unix ns) at which all are deemed lost (the newest has been
	// out an open period); 0 otherwise. Both are written only with mu held.
	openUntilA      atomic.Int64
	probesFullUntil atomic.Int64

	// clock reads every instant given (clock.go); safe for concurrent use.
	clock clock

	mu sync.Mutex

	// hook is fixed by New. cfg and slowOn are set by New and Reconfigure,
	// and read with mu held.
	hook   func(from, to State)
	cfg    Config // normalized
	slowOn bool   // slow-call tripping is on

	// events are the changes of state not yet reported to hook, in the
	// order they happened; delivering is set while a goroutine reports
	// them (deliver). Both guarded by mu.
	events     []transition
	delivering bool

	// All guarded by mu.
	gen         uint64 // incremented on every change of state and on Reset; starts at 1
	state       State
	consecutive int           // failures in a row, in Closed and ForcedClosed
	win         window        // outcomes over Window, in Closed and ForcedClosed
	openUntil   int64         // Unix ns at which Open turns HalfOpen
	openFor     time.Duration // length of the current or last open period
	probes      int           // probes in flight, in HalfOpen
	probeLast   int64         // admission of the newest probe in flight, in HalfOpen
	successes   int           // successful probes, in HalfOpen
	trips       uint64        // trips to Open since New, ForceOpen not included
}

// New returns a closed breaker, or an error if cfg is out of range.
func New(cfg Config) (*Breaker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.normalized()
	b := &Breaker{
		cfg:     cfg,
		slowOn:  cfg.SlowCallDuration > 0,
		hook:    cfg.OnStateChange,
		gen:     1,
		openFor: cfg.OpenDuration,
	}
	if b.hook != nil {
		b.events = make([]transition, 0, 4)
	}
	b.win.width = int64(cfg.Window / numBuckets)
	b.win.end = math.MinInt64 // the first instant sets the head
	b.word.Store(b.gen << stateBits)
	return b, nil
}

// transition is one change of state, for OnStateChange.
type transition struct{ from, to State }

// Allow asks to admit one attempt at now. On admission it returns a Token for
// Record and a nil error. On rejection it returns the zero Token, one of
// ErrOpen, ErrForcedOpen and ErrHalfOpenFull, and retryAfter: the time from
// now until the breaker turns half-open and lets a probe through, > 0 with
// ErrOpen, and 0 when that time is unknown (forced open, or half-open with
// every probe in flight).
//
// Allow does not allocate, and takes no lock in Closed and ForcedClosed, nor
// to reject an attempt while Open or while HalfOpen has every probe out, so
// that a storm of rejected callers cannot delay the probe whose outcome they
// wait for. An Open breaker whose open time has passed turns HalfOpen here.
func (b *Breaker) Allow(now time.Time) (tok Token, retryAfter time.Duration, err error) {
	w := b.word.Load()
	switch State(w & stateMask) {
	case StateClosed, StateForcedClosed:
		return Token{w: w}, 0, nil
	}
	if retryAfter, err := b.Rejects(now); err != nil {
		return Token{}, retryAfter, err
	}
	return b.allowSlow(b.clock.ns(now))
}

// Admitting reports whether the breaker is Closed or ForcedClosed, where
// Allow admits every attempt, whatever the time. It takes no lock and reads
// no clock: a caller can skip reading the time when it is true.
func (b *Breaker) Admitting() bool {
	switch State(b.word.Load() & stateMask) {
	case StateClosed, StateForcedClosed:
		return true
	}
	return false
}

// Rejects returns the rejection that Allow would return for an attempt at
// now without taking its lock (Open before its open time has passed,
// HalfOpen with every probe out, ForcedOpen), and a nil error when Allow
// might admit the attempt. It changes nothing: no probe is taken, no state
// turns, so a caller may use it to refuse an attempt before it builds any
// state, and call Allow when it returns nil.
func (b *Breaker) Rejects(now time.Time) (retryAfter time.Duration, err error) {
	w := b.word.Load()
	t := b.clock.ns(now)
	switch State(w & stateMask) {
	case StateOpen:
		if until := b.openUntilA.Load(); t < until && b.word.Load() == w {
			return time.Duration(until - t), ErrOpen
		}
	case StateHalfOpen:
		if t < b.probesFullUntil.Load() && b.word.Load() == w {
			return 0, ErrHalfOpenFull
		}
	case StateForcedOpen:
		return 0, ErrForcedOpen
	}
	return 0, nil
}

func (b *Breaker) allowSlow(t int64) (tok Token, retryAfter time.Duration, err error) {
	b.mu.Lock()
	from, changed := b.maybeHalfOpenLocked(t)
	switch b.state {
	case StateClosed, StateForcedClosed:
		tok = Token{w: b.word.Load()}
	case StateOpen:
		retryAfter, err = time.Duration(b.openUntil-t), ErrOpen
	case StateForcedOpen:
		err = ErrForcedOpen
	case StateHalfOpen:
		if b.probes >= b.cfg.HalfOpenProbes && t >= b.probeLast+int64(b.openFor) {
			// Every probe has been out for a whole open period without an
			// outcome (its caller hung, or lost the token): deem them lost
			// and renew HalfOpen, in a new generation that discards their
			// outcomes should they ever come.
			b.setStateLocked(StateHalfOpen, t)
		}
		if b.probes < b.cfg.HalfOpenProbes {
			// Every probe has been out an open period once the newest
			// has: an older probe that reported made room for a newer
			// one, which must get its whole period too.
			b.probeLast = t
			b.probes++
			tok = Token{w: b.word.Load(), at: t}
			if b.probes == b.cfg.HalfOpenProbes {
				b.probesFullUntil.Store(b.probeLast + int64(b.openFor))
			}
		} else {
			err = ErrHalfOpenFull
		}
	}
	if changed {
		b.changedLocked(from, StateHalfOpen)
	}
	b.mu.Unlock()
	if tok.Probe() {
		b.deliverProbing(tok)
	} else {
		b.deliver()
	}
	return tok, retryAfter, err
}

// deliverProbing is deliver for an Allow that took the probe tok: should
// OnStateChange panic or call runtime.Goexit (on this Allow's own turn to
// HalfOpen, or a change queued before it), Allow's caller never gets tok,
// and the probe goes back, as an Ignored outcome would give it back, with
// nothing reported; the panic goes on.
func (b *Breaker) deliverProbing(tok Token) {
	returned := false
	defer func() {
		if !returned {
			b.mu.Lock()
			if b.word.Load() == tok.w {
				b.probes--
				b.probesFullUntil.Store(0)
			}
			b.mu.Unlock()
		}
	}()
	b.deliver()
	returned = true
}

// Record reports the outcome at now of the attempt tok admitted (by this
// breaker's Allow), and its duration, for slow-call accounting. An outcome for a token admitted in an
// earlier generation (before any later change of state or Reset) is
// discarded, so stale outcomes never change the state.
//
// In Closed, Record counts the outcome and trips the breaker when a trip
// condition holds. In HalfOpen it frees the probe's slot; a Failure, or a
// slow Success when slow-call tripping is on, opens the breaker again for
// twice the last open time (at most MaxOpenDuration), and the
// HalfOpenProbes-th Success closes it. Ignored outcomes take no lock except
// for half-open probes. Record does not allocate.
func (b *Breaker) Record(tok Token, now time.Time, outcome Outcome, duration time.Duration) {
	if tok.w == 0 {
		return
	}
	st := State(tok.w & stateMask)
	if outcome != Success && outcome != Failure {
		if st != StateHalfOpen {
			return
		}
		outcome = Ignored
	}
	t := b.clock.ns(now)
	b.mu.Lock()
	if b.word.Load() != tok.w {
		b.mu.Unlock()
		return
	}
	slow := b.slowOn && duration > b.cfg.SlowCallDuration
	to := st
	switch st {
	case StateClosed, StateForcedClosed:
		failed := outcome == Failure
		if failed {
			b.consecutive++
		} else {
			b.consecutive = 0
		}
		b.win.add(t, failed, slow)
		if st == StateClosed && b.shouldTripLocked() {
			b.openFor = b.cfg.OpenDuration
			b.tripLocked(t)
			to = StateOpen
		}
	case StateHalfOpen:
		b.probes--
		b.probesFullUntil.Store(0)
		switch {
		case outcome == Failure || outcome == Success && slow:
			if b.openFor > b.cfg.MaxOpenDuration/2 {
				b.openFor = b.cfg.MaxOpenDuration
			} else {
				b.openFor *= 2
			}
			// The open period counts from the probe's start: a probe sent
			// during an outage whose answer came late, after the outage
			// ended, does not cost a whole open period more.
			b.tripLocked(min(tok.at, t))
			to = StateOpen
		case outcome == Success:
			b.successes++
			if b.successes >= b.cfg.HalfOpenProbes {
				b.openFor = b.cfg.OpenDuration
				b.setStateLocked(StateClosed, t)
				to = StateClosed
			}
		}
	}
	if to != st {
		b.changedLocked(st, to)
	}
	b.mu.Unlock()
	b.deliver()
}

// shouldTripLocked reports whether a trip condition holds in Closed.
func (b *Breaker) shouldTripLocked() bool {
	if n := b.cfg.ConsecutiveFailures; n > 0 && b.consecutive >= n {
		return true
	}
	w := &b.win
	if w.calls == 0 || w.calls < b.cfg.MinimumCalls {
		return false
	}
	calls := float64(w.calls)
	if r := b.cfg.FailureRateThreshold; r > 0 && float64(w.failures)/calls >= r {
		return true
	}
	return b.slowOn && float64(w.slow)/calls >= b.cfg.SlowCallRateThreshold
}

// tripLocked opens the breaker for b.openFor from t.
func (b *Breaker) tripLocked(t int64) {
	b.trips++
	b.setStateLocked(StateOpen, t)
	b.openUntil = t + int64(b.openFor)
	b.openUntilA.Store(b.openUntil)
}

// maybeHalfOpenLocked turns an Open breaker whose open time has passed at t
// HalfOpen, and reports the state it left.
func (b *Breaker) maybeHalfOpenLocked(t int64) (from State, changed bool) {
	if b.state != StateOpen || t < b.openUntil {
		return b.state, false
	}
	b.setStateLocked(StateHalfOpen, t)
	return StateOpen, true
}

// setStateLocked enters state s at t in a new generation, with every count
// cleared.
func (b *Breaker) setStateLocked(s State, t int64) {
	b.gen++
	b.state = s
	b.consecutive = 0
	b.win.reset(t)
	b.openUntil = 0
	b.openUntilA.Store(0)
	b.probes = 0
	b.probeLast = 0
	b.probesFullUntil.Store(0)
	b.successes = 0
	b.word.Store(b.gen<<stateBits | uint64(s))
}

// changedLocked queues the change from → to for OnStateChange; deliver
// reports it once mu is released.
func (b *Breaker) changedLocked(from, to State) {
	if b.hook != nil && from != to {
		b.events = append(b.events, transition{from, to})
	}
}

// deliver reports the queued changes of state to OnStateChange, in the
// order they happened, one at a time, with mu released while the hook runs:
// the goroutine that finds changes queued and nobody reporting them reports
// them all, those queued while it does included (a hook's own ForceOpen
// among them). Called after mu is released by whoever may have queued one.
func (b *Breaker) deliver() {
	if b.hook == nil {
		return
	}
	b.mu.Lock()
	if b.delivering || len(b.events) == 0 {
		b.mu.Unlock()
		return
	}
	b.delivering = true
	for len(b.events) > 0 {
		e := b.events[0]
		n := copy(b.events, b.events[1:])
		b.events = b.events[:n]
		b.mu.Unlock()
		b.report(e)
		b.mu.Lock()
	}
	b.delivering = false
	b.mu.Unlock()
}

// report calls the hook with e, mu released; should the hook panic, the
// next change is reported all the same, by whoever makes it.
func (b *Breaker) report(e transition) {
	returned := false
	defer func() {
		if !returned {
			b.mu.Lock()
			b.delivering = false
			b.mu.Unlock()
		}
	}()
	b.hook(e.from, e.to)
	returned = true
}

// Snapshot describes a Breaker at one instant.
type Snapshot struct {
	// State is the state at the instant, an Open breaker whose open time
	// has passed being HalfOpen.
	State State
	// Calls, Failures and SlowCalls count the outcomes in the rolling
	// window, in Closed and ForcedClosed; they are cleared on every change
	// of state.
	Calls, Failures, SlowCalls int
	// ConsecutiveFailures is the number of failures in a row, in Closed and
	// ForcedClosed.
	ConsecutiveFailures int
	// OpenUntil is when an Open breaker turns HalfOpen; zero in other
	// states.
	OpenUntil time.Time
	// OpenDuration is the length of the current or last open period.
	OpenDuration time.Duration
	// Probes is the number of probes in flight, and ProbeSuccesses the
	// number that succeeded, in HalfOpen.
	Probes, ProbeSuccesses int
	// Trips counts trips to Open since New, from Closed and from HalfOpen;
	// ForceOpen is not counted and Reset does not clear it.
	Trips uint64
}

// Snapshot describes the breaker at now. It changes nothing: an Open
// breaker whose open time has passed is described as HalfOpen with no probe
// out, which it turns on the next Allow (and OnStateChange reports then),
// so that reading a breaker (a metrics callback, an admin page) never runs
// the hook.
func (b *Breaker) Snapshot(now time.Time) Snapshot {
	t := b.clock.ns(now)
	b.mu.Lock()
	defer b.mu.Unlock()
	s := Snapshot{
		State:               b.state,
		ConsecutiveFailures: b.consecutive,
		OpenDuration:        b.openFor,
		Probes:              b.probes,
		ProbeSuccesses:      b.successes,
		Trips:               b.trips,
	}
	switch {
	case b.state == StateOpen && t >= b.openUntil:
		s.State = StateHalfOpen
	case b.state == StateOpen:
		s.OpenUntil = time.Unix(0, b.openUntil)
	case b.state == StateClosed || b.state == StateForcedClosed:
		s.Calls, s.Failures, s.SlowCalls = b.win.countsAt(t)
	}
	return s
}

// Reconfigure gives b the configuration cfg from now, keeping what b was
// doing, for a change of the configuration of the method it guards: a
// forced state stays forced; an Open breaker stays open until its open
// time ends, but at most cfg's MaxOpenDuration from now (the new
// configuration bounds the wait from the change on), with its open period
// clamped to cfg's range; one whose open time has passed, or HalfOpen, is
// HalfOpen with no probe out. Counts start afresh, in a new generation (the
// outcomes of attempts admitted before are discarded, as they were counted
// against the old thresholds); Trips carries over. OnStateChange stays
// New's (cfg's is ignored), and is not called: to an observer, the state
// did not change. It returns cfg's error, and changes nothing, when cfg is
// out of range.
func (b *Breaker) Reconfigure(cfg Config, now time.Time) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.normalized()
	t := b.clock.ns(now)
	b.mu.Lock()
	defer b.mu.Unlock()
	s, until, openFor := b.state, b.openUntil, b.openFor
	if s == StateOpen && t >= until {
		s = StateHalfOpen
	}
	b.cfg, b.slowOn = cfg, cfg.SlowCallDuration > 0
	b.win.width = int64(cfg.Window / numBuckets)
	b.openFor = cfg.OpenDuration
	b.setStateLocked(s, t)
	if s == StateOpen {
		b.openFor = min(max(openFor, cfg.OpenDuration), cfg.MaxOpenDuration)
		b.openUntil = min(until, t+int64(cfg.MaxOpenDuration))
		b.openUntilA.Store(b.openUntil)
	}
	return nil
}

// ForceOpen holds the breaker open from now until Reset or ForceClosed:
// Allow rejects every attempt with ErrForcedOpen. Outcomes of attempts
// admitted before are discarded.
func (b *Breaker) ForceOpen(now time.Time) { b.force(StateForcedOpen, now) }

// ForceClosed holds the breaker closed from now until Reset or ForceOpen:
// Allow admits every attempt and Record counts outcomes, but the breaker
// never trips. Outcomes of attempts admitted before are discarded.
func (b *Breaker) ForceClosed(now time.Time) { b.force(StateForcedClosed, now) }

// Reset closes the breaker at now as if new: counts cleared, open time back
// to OpenDuration, outcomes of attempts admitted before discarded. Trips is
// kept.
func (b *Breaker) Reset(now time.Time) { b.force(StateClosed, now) }

func (b *Breaker) force(s State, now time.Time) {
	t := b.clock.ns(now)
	b.mu.Lock()
	from := b.state
	if from == s && s != StateClosed {
		b.mu.Unlock()
		return
	}
	b.openFor = b.cfg.OpenDuration
	b.setStateLocked(s, t)
	b.changedLocked(from, s)
	b.mu.Unlock()
	b.deliver()
}
