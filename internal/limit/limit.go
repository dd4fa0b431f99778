package limit

import (
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// Algorithm names how a [Limiter] learns its limit.
type Algorithm uint8

const (
	// Vegas compares each latency with the base RTT (see the package doc).
	Vegas Algorithm = iota
	// AIMD adds one per fast request and multiplies by Backoff on a slow or
	// dropped one.
	AIMD
)

// Criticality orders requests for shedding, most important first. The zero
// value is Critical, the default of a request that names none.
type Criticality uint8

const (
	// Critical is the default.
	Critical Criticality = iota
	// CriticalPlus is shed last.
	CriticalPlus
	// SheddablePlus is shed before Critical.
	SheddablePlus
	// Sheddable is shed first.
	Sheddable
	// NumCriticalities is the number of criticalities, for arrays indexed by
	// one.
	NumCriticalities
)

// valid is c, or Critical for a value out of range.
func (c Criticality) valid() Criticality {
	if c >= NumCriticalities {
		return Critical
	}
	return c
}

// share is the fraction of the limit a criticality may fill.
var share = [NumCriticalities]float64{
	Critical:      0.9,
	CriticalPlus:  1,
	SheddablePlus: 0.75,
	Sheddable:     0.5,
}

// Defaults of Config.
const (
	DefaultMaxTenants = 1024
	DefaultTenantIdle = 5 * time.Second
)

// MaxClasses is the number of cost classes a Limiter tells apart
// (Request.Class): each has a base RTT and a door of its own.
const MaxClasses = 64

// Config is the normalized configuration of a [Limiter]. The zero value of
// a field means its default.
type Config struct {
	// Algorithm is Vegas (the default) or AIMD.
	Algorithm Algorithm
	// InitialLimit is the limit before any request completed, and the
	// limit that a server using less than half of it returns to after an
	// overload lowered it; default 20.
	InitialLimit int
	// MinLimit and MaxLimit bound the limit; defaults 1 and 1000.
	MinLimit, MaxLimit int
	// BaseWindow is the period of the base RTT's estimate (it is over the
	// last two periods, reset by each Vegas probe); default 30s.
	BaseWindow time.Duration
	// ProbeMultiplier (Vegas): about every ProbeMultiplier × limit
	// samples (jittered into [½, 1) of that), the base RTT starts anew
	// from the next sample, so a lasting rise of the service time becomes
	// the new base within that many samples (see the package doc); default
	// 10.
	ProbeMultiplier float64
	// Rand draws the probe's jitter in [0, 1); nil: math/rand/v2's
	// Float64. Servers inject a seeded source for repeatable runs. It is
	// called with the Limiter's mutex held.
	Rand func() float64
	// Tolerance (AIMD): a latency above Tolerance times the base RTT counts
	// as overload; default 2.
	Tolerance float64
	// Backoff (AIMD): the factor of a decrease, in (0, 1); default 0.9.
	Backoff float64
	// MaxQueue is how many requests over the limit may wait for a slot
	// (Enqueue); 0: none.
	MaxQueue int
	// MaxTenants bounds the named tenants remembered at once; the names
	// beyond share one tenant. Default DefaultMaxTenants.
	MaxTenants int
	// TenantIdle is how long a tenant with nothing in flight or queued
	// keeps its share after its last request; default DefaultTenantIdle.
	TenantIdle time.Duration
}

// Validate reports the first field of c out of range.
func (c Config) Validate() error {
	switch {
	case c.Algorithm > AIMD:
		return errors.New("limit: unknown algorithm")
	case c.InitialLimit < 0, c.MinLimit < 0, c.MaxLimit < 0:
		return errors.New("limit: limits must not be negative")
	case c.BaseWindow < 0:
		return errors.New("limit: baseWindow must not be negative")
	case c.Tolerance != 0 && !(c.Tolerance >= 1 && c.Tolerance <= 100):
		return errors.New("limit: tolerance must be in [1, 100]")
	case c.Backoff != 0 && !(c.Backoff > 0 && c.Backoff < 1):
		return errors.New("limit: backoff must be in (0, 1)")
	case c.ProbeMultiplier != 0 && !(c.ProbeMultiplier >= 1 && c.ProbeMultiplier <= 1000):
		return errors.New("limit: probeMultiplier must be in [1, 1000]")
	case c.MaxQueue < 0:
		return errors.New("limit: maxQueue must not be negative")
	case c.MaxTenants < 0:
		return errors.New("limit: maxTenants must not be negative")
	case c.TenantIdle < 0:
		return errors.New("limit: tenantIdle must not be negative")
	}
	n := c.normalize()
	if n.MinLimit > n.MaxLimit {
		return errors.New("limit: minLimit must not exceed maxLimit")
	}
	if n.InitialLimit < n.MinLimit || n.InitialLimit > n.MaxLimit {
		return errors.New("limit: initialLimit must lie within [minLimit, maxLimit]")
	}
	return nil
}

// normalize fills the defaults.
func (c Config) normalize() Config {
	if c.MinLimit == 0 {
		c.MinLimit = 1
	}
	if c.MaxLimit == 0 {
		c.MaxLimit = 1000
	}
	if c.InitialLimit == 0 {
		c.InitialLimit = min(max(20, c.MinLimit), c.MaxLimit)
	}
	if c.BaseWindow == 0 {
		c.BaseWindow = 30 * time.Second
	}
	if c.Tolerance == 0 {
		c.Tolerance = 2
	}
	if c.Backoff == 0 {
		c.Backoff = 0.9
	}
	if c.ProbeMultiplier == 0 {
		c.ProbeMultiplier = 10
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	if c.MaxTenants == 0 {
		c.MaxTenants = DefaultMaxTenants
	}
	if c.TenantIdle == 0 {
		c.TenantIdle = DefaultTenantIdle
	}
	return c
}

// Verdict is what Acquire decided.
type Verdict uint8

const (
	// Admitted: the request may run; end it with one Release or Abandon.
	Admitted Verdict = iota
	// ShedLimit: the requests in flight fill the criticality's share of
	// the limit (or the tenant's, see the package doc).
	ShedLimit
	// ShedDeadline: the request's remaining deadline is shorter than the
	// door's service time, so it cannot finish in time even without
	// queueing.
	ShedDeadline
	// NumVerdicts is the number of verdicts.
	NumVerdicts
)

// Outcome is how an admitted request ended, for Release: what, if
// anything, it says of the server's load.
type Outcome uint8

const (
	// Completed: the request completed (the server answered it with OK);
	// its latency is a sample.
	Completed Outcome = iota
	// Ignored: it ended for a reason that says nothing reliable of the
	// server's load (it failed, or its caller went away): no sample.
	Ignored
	// DeadlineEnded: its deadline ended while it ran. It is a drop (a sign
	// of overload) when the deadline left it at least twice the base RTT
	// when it was admitted; otherwise the caller's deadline was too short
	// for the service, and it is Ignored.
	DeadlineEnded
)

// NoRetry is the pushback that tells a shed request not to come back: the
// server sheds at least as many requests as it admits, so a retry would
// only add to the excess.
const NoRetry = time.Duration(-1)

// NoDeadline is the remaining time of a request without a deadline.
const NoDeadline = time.Duration(math.MaxInt64)

// Request is what Acquire and Enqueue decide on.
type Request struct {
	// Crit is its criticality; a value out of range counts as Critical.
	Crit Criticality
	// Left is what remains of its deadline; NoDeadline when it has none.
	Left time.Duration
	// Tenant names who sent it; "" is the default tenant, the only one of
	// a server that names none.
	Tenant string
	// Class is its cost class, in [0, MaxClasses) (a value out of range
	// counts as 0): requests of one class cost about the same, those of
	// different classes need not (a server gives each method its own). Each
	// class has its own base RTT and door, so that a class answered in
	// microseconds never makes another's latencies look queued (see the
	// package doc, "Cost classes").
	Class int
}

// Slot is an admitted request's hold on the Limiter, ended by one Release
// or Abandon. The zero Slot holds nothing.
type Slot struct {
	t     *tenant
	left  time.Duration // of the deadline when admitted
	class uint8         // the request's cost class
	probe bool          // let through the door to test it (passDoorLocked)
}

// Snapshot is a Limiter's state and counters.
type Snapshot struct {
	Limit    int
	InFlight int
	Queued   int
	// BaseRTT is the base RTT and DoorRTT the door's service time of the
	// busiest cost class (the one with the most latencies in the base
	// RTT's windows); SmoothedRTT the EWMA of the samples of every class.
	BaseRTT, DoorRTT, SmoothedRTT time.Duration
	// Classes is the number of cost classes seen.
	Classes int
	// Count counts the verdicts by criticality.
	Count [NumVerdicts][NumCriticalities]uint64
	// Probes counts the Vegas probes: restarts of the base RTT.
	Probes uint64
	// Tenants is the number of tenants sharing the limit.
	Tenants int
}

// A Limiter is one adaptive concurrency limit. Use [New]; the zero value is
// not usable.
type Limiter struct {
	cfg Config // normalized; immutable

	mu       sync.Mutex
	limit    float64               // in [MinLimit, MaxLimit]
	caps     [NumCriticalities]int // in-flight at which each criticality is shed; follows limit
	inflight int                   // admitted and not yet released
	cls      []class               // the cost classes seen, by Request.Class; cls[0] always
	anchorL  float64               // the limit and the queueing ratio of the update when the limit last grew,
	anchorR  float64               // or the ratio last moved by 10%: a slowdown shows as the limit falling from there while the ratio does not
	probes   uint64                // restarts of the base RTT by a probe
	srtt     float64               // EWMA of the samples of every class, nanoseconds; 0 before the first
	win      window                // samples and drops since the last update
	shedEW   float64               // EWMA of the shed share of decisions
	drain    drain                 // the probe of a limit that sheds (see drainLocked)
	count    [NumVerdicts][NumCriticalities]uint64
	yield    [NumCriticalities]time.Time // a request of this criticality is shed until then: a more critical one was shed
	ten      tenants
	q        queue
}

// class is the state of one cost class: its base RTT, its door and its
// probe. Guarded by the Limiter's mutex.
type class struct {
	base     windowed      // the base RTT: BaseWindow windows, restarted by each probe
	door     door          // the door's service time
	doorPass time.Time     // the last request let past the door, or the first sample
	srtt     float64       // EWMA of the class's samples, nanoseconds; 0 before the first
	probeN   float64       // samples since the last probe
	probeAt  float64       // probe when probeN reaches probeAt × limit
	drainMin time.Duration // the least latency of a request admitted after a drain began; 0: none
	// retry is set when the last request let through the door to test it
	// taught it nothing (its deadline cut it, with probeMin left of it, or
	// it was shed over the limit, probeMin 0): the next request with more
	// than probeMin left tests it at once.
	retry    bool
	probeMin time.Duration
}

// New returns a Limiter for cfg, or cfg's first error.
func New(cfg Config) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &Limiter{cfg: cfg.normalize()}
	l.ten.max, l.ten.idle = l.cfg.MaxTenants, l.cfg.TenantIdle
	l.q.max, l.q.ten = l.cfg.MaxQueue, &l.ten
	l.setLimit(float64(l.cfg.InitialLimit))
	l.classLocked(0)
	return l, nil
}

// classLocked returns the state of cost class c (0 for a value out of
// range), made when first seen.
func (l *Limiter) classLocked(c int) *class {
	if c < 0 || c >= MaxClasses {
		c = 0
	}
	for len(l.cls) <= c {
		l.cls = append(l.cls, class{})
		l.nextProbe(&l.cls[len(l.cls)-1])
	}
	return &l.cls[c]
}

// nextProbe draws the jittered multiplier of k's next probe.
func (l *Limiter) nextProbe(k *class) {
	k.probeN = 0
	k.probeAt = l.cfg.ProbeMultiplier * (0.5 + 0.5*l.cfg.Rand())
}

// setLimit sets the limit, clamped, and the caps that follow from it.
func (l *Limiter) setLimit(v float64) {
	l.limit = min(max(v, float64(l.cfg.MinLimit)), float64(l.cfg.MaxLimit))
	for c, s := range share {
		l.caps[c] = max(1, int(math.Ceil(l.limit*s)))
	}
}

// doorStale is how long k's door keeps its service time without a new
// latency: 8 of the class's smoothed latencies, within [1ms, BaseWindow].
// Then it is open to every deadline until a request of the class
// completes.
func (l *Limiter) doorStale(k *class) time.Duration {
	return min(max(8*time.Duration(k.srtt), time.Millisecond), l.cfg.BaseWindow)
}

// doorLocked is k's door's service time at now.
func (l *Limiter) doorLocked(now time.Time, k *class) time.Duration {
	return k.door.value(now, l.doorStale(k))
}

// rotateLocked moves the windows of the base RTTs to now.
func (l *Limiter) rotateLocked(now time.Time) {
	for i := range l.cls {
		l.cls[i].base.rotate(now, l.cfg.BaseWindow)
	}
}

// passDoorLocked reports whether a request of class k with left of its
// deadline passes the door at now, and whether it is let through to test
// the door (probe): when left is at least the door's service time, and
// otherwise once per service time (counted from the last request let
// through, or the first sample), so that the door learns that the service
// has become fast again within about one of its own service times (issue
// 33: after a slow phase it refused every short deadline for 8 smoothed
// latencies, 3.21s, and let one through every 64). A request whose
// deadline has passed tests nothing; a test that taught the door nothing
// (endProbeLocked) lets the next request with more time left through at
// once: otherwise callers whose deadlines leave no time for any service,
// arriving more often than the others, took nearly every test, and the
// door stayed shut until it aged out.
func (l *Limiter) passDoorLocked(now time.Time, k *class, left time.Duration) (pass, probe bool) {
	d := l.doorLocked(now, k)
	if left >= d {
		return true, false
	}
	if left <= 0 || now.Sub(k.doorPass) < d && !(k.retry && left > k.probeMin) {
		return false, false
	}
	k.doorPass, k.retry = now, false // one through, to test the door
	return true, true
}

// endProbeLocked ends the test of the door by a request of class k with
// left of its deadline when admitted, which ended with outcome o: a
// latency teaches the door (sampleLocked); a request that was not admitted
// (shed over the limit) taught it nothing, and the next request tests it
// at once; one that ended without a latency (its deadline cut it, its
// caller went away, its handler failed) showed at most that the service
// takes longer than left, and the next request with more time left tests
// it at once. Otherwise, and whichever comes first, the next test is one
// service time after this one began, as without a retry.
func (l *Limiter) endProbeLocked(k *class, left time.Duration, o Outcome, admitted bool) {
	switch {
	case !admitted:
		k.retry, k.probeMin = true, 0
	case o != Completed:
		k.retry, k.probeMin = true, left
	}
}

// Acquire decides at now on a request r. It sheds r when its deadline has
// less left than the door's service time (ShedDeadline, pushback 0: it has
// no time to come back), or when the requests in flight fill r's share of
// the limit (ShedLimit; pushback is how long it should wait before coming
// back, or NoRetry). An admitted request holds s until its one Release or
// Abandon.
func (l *Limiter) Acquire(now time.Time, r Request) (s Slot, v Verdict, pushback time.Duration) {
	c := r.Crit.valid()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rotateLocked(now)
	k := l.classLocked(r.Class)
	pass, probe := l.passDoorLocked(now, k, r.Left)
	if !pass {
		l.count[ShedDeadline][c]++
		return Slot{}, ShedDeadline, 0
	}
	l.drainLocked(now)
	t := l.ten.get(now, r.Tenant)
	if l.mayAdmitLocked(now, c, t) {
		s = l.admitLocked(c, t, r.Left, r.Class)
		s.probe = probe
		return s, Admitted, 0
	}
	if probe {
		l.endProbeLocked(k, r.Left, Ignored, false)
	}
	l.yieldLocked(now, c)
	l.count[ShedLimit][c]++
	l.shedEW += (1 - l.shedEW) / 64
	return Slot{}, ShedLimit, l.pushbackLocked()
}

// mayAdmitLocked reports whether a request of criticality c from t may
// take a slot now. With one tenant: while the requests in flight are fewer
// than c's share of the limit (half of it while the limit drains). With
// several, each tenant with requests in flight or queued has a fair
// share of c's share (tenants.fairShare: max-min, a tenant with one
// request taking one slot), against which what a tenant holds is its
// requests in flight smoothed over its last admissions and ends (so that a
// latency spike does not make a quiet tenant look greedy), and at most
// twice the fair share at any moment (so that a burst does not slip under
// the smoothing). A tenant at or over its fair share is admitted only
// while the requests in flight are fewer than c's share less a slot kept
// free for each other tenant under its fair share (at most a tenth of the
// limit in all), so it is shed before any tenant under its share. A tenant
// under its fair share (of at least one slot), smoothed and now, is
// admitted beyond c's share, by up to a fair share, whatever the others
// hold, as a partition under its share is in Netflix's partitioned
// limiter: the others' excess drains as their requests end (they are not
// admitted meanwhile), and does not yield to a more critical request shed
// (yieldLocked), which would let a tenant over its share, claiming
// CriticalPlus, shed every other tenant. With more tenants than slots, a
// tenant under its share waits for c's share to have room.
func (l *Limiter) mayAdmitLocked(now time.Time, c Criticality, t *tenant) bool {
	yielding := now.Before(l.yield[c])
	limit := l.capLocked(now, c)
	n, fair := l.ten.fairShare(t, limit)
	if n <= 1 {
		return !yielding && l.inflight < limit
	}
	switch {
	case t.over(fair):
		most := max(1, int(math.Ceil(l.limit/10)))
		return !yielding && l.inflight < limit-l.ten.under(now, t, fair, most)
	case fair >= 1 && float64(t.inflight) < fair:
		// Under its fair share, now as over time, t does not yield to a
		// more critical request shed over its tenant's share: that
		// tenant's excess is no claim on t's share.
		return l.inflight < limit+int(math.Ceil(fair))
	}
	return !yielding && l.inflight < limit
}

// yieldFor is how many smoothed latencies the less critical requests yield
// for after a more critical one was shed.
const yieldFor = 4

// yieldLocked makes the requests less critical than c, one of which was
// just shed over the limit, yield to it for 4 smoothed latencies (at least
// a millisecond): they are shed, so that the slots they would take go to
// the more critical requests as the ones in flight end. Shares alone do not do
// it: a flood of Sheddable requests filling its half of the limit slows
// every request in the server, so the Critical ones in flight grow (more of
// them wait) and fill the rest of it.
func (l *Limiter) yieldLocked(now time.Time, c Criticality) {
	until := now.Add(max(yieldFor*time.Duration(l.srtt), time.Millisecond))
	for lower := range NumCriticalities {
		if rank[lower] < rank[c] && l.yield[lower].Before(until) {
			l.yield[lower] = until
		}
	}
}

// admitLocked admits a request of criticality c and cost class k from t
// with left of its deadline.
func (l *Limiter) admitLocked(c Criticality, t *tenant, left time.Duration, k int) Slot {
	l.inflight++
	l.ten.add(t, 1)
	l.count[Admitted][c]++
	l.shedEW -= l.shedEW / 64
	if k < 0 || k >= MaxClasses {
		k = 0
	}
	return Slot{t: t, left: left, class: uint8(k)}
}

// pushbackLocked is the wait of the package doc, or NoRetry.
func (l *Limiter) pushbackLocked() time.Duration { return pushback(l.srtt, l.shedEW) }

// busiestLocked returns the cost class with the most latencies in its base
// RTT's windows (class 0 when none has any).
func (l *Limiter) busiestLocked() *class {
	k, most := &l.cls[0], -1
	for i := range l.cls {
		if n := l.cls[i].base.w[0].n + l.cls[i].base.w[1].n; n > most {
			k, most = &l.cls[i], n
		}
	}
	return k
}

// BaseRTT returns the base RTT of the busiest cost class at now (see
// Snapshot): 0 before the first sample, and again once two BaseWindows
// passed without one.
func (l *Limiter) BaseRTT(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rotateLocked(now)
	return l.busiestLocked().base.value()
}

// DoorRTT returns the door's service time of cost class c at now (see the
// package doc, "The door"); 0 when the door is open to every deadline.
func (l *Limiter) DoorRTT(now time.Time, c int) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.doorLocked(now, l.classLocked(c))
}

// Release ends at now the request that held s (the zero Slot: nothing),
// admitted rtt before (not counting its time in the queue), with outcome o
// (see Outcome), and hands the freed slot to a waiter when one may take it.
func (l *Limiter) Release(now time.Time, s Slot, rtt time.Duration, o Outcome) {
	if s.t == nil {
		return // the zero Slot
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	inflight := l.inflight
	l.inflight--
	l.ten.add(s.t, -1)
	l.rotateLocked(now)
	k := l.classLocked(int(s.class))
	if s.probe {
		l.endProbeLocked(k, s.left, o, true)
	}
	switch o {
	case Completed:
		l.sampleLocked(now, k, max(rtt, 1), inflight)
	case DeadlineEnded:
		if base := k.base.value(); base > 0 && s.left >= 2*base {
			l.dropLocked(now, inflight)
		}
	}
	l.handoffLocked(now)
}

// Abandon ends the request that held s (the zero Slot: nothing) without a
// sample or a drop: it ended for a reason that says nothing of the
// server's load. It hands the freed slot to a waiter when one may take it.
func (l *Limiter) Abandon(now time.Time, s Slot) {
	if s.t == nil {
		return // the zero Slot
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight--
	l.ten.add(s.t, -1)
	l.handoffLocked(now)
}

// window gathers the samples and drops of one update.
type window struct {
	end      time.Time     // the update happens at the first release at or after end; zero: not started
	n        int           // samples
	sum      time.Duration // of their latencies
	sumBase  time.Duration // of their classes' base RTTs when they came
	inflight int           // the most in flight at a release
	dropped  bool          // any drop
}

// startLocked starts the window at now when it has not started, and
// notes inflight.
func (l *Limiter) startLocked(now time.Time, inflight int) *window {
	w := &l.win
	if w.end.IsZero() {
		w.end = now.Add(time.Duration(l.srtt))
	}
	w.inflight = max(w.inflight, inflight)
	return w
}

// sampleLocked takes the latency rtt of a request of class k completed at
// now, which ran with inflight others (itself included).
func (l *Limiter) sampleLocked(now time.Time, k *class, rtt time.Duration, inflight int) {
	l.srtt = ewma(l.srtt, rtt)
	k.srtt = ewma(k.srtt, rtt)
	l.drainSampleLocked(now, k, rtt)
	l.observeBase(now, k, rtt)
	if k.doorPass.IsZero() {
		k.doorPass = now
	}
	k.door.add(now, rtt)
	w := l.startLocked(now, inflight)
	w.n++
	w.sum += rtt
	w.sumBase += k.base.value()
	l.updateLocked(now)
}

// ewma folds rtt into the moving average v (weight 1/16; the first sample
// is the average).
func ewma(v float64, rtt time.Duration) float64 {
	if v == 0 {
		return float64(rtt)
	}
	return v + (float64(rtt)-v)/16
}

// dropLocked takes a drop at now, with inflight in flight.
func (l *Limiter) dropLocked(now time.Time, inflight int) {
	l.startLocked(now, inflight).dropped = true
	l.updateLocked(now)
}

// updateLocked moves the limit once the window has ended. The window's
// queueing ratio is the sum of its samples' latencies over the sum of
// their classes' base RTTs: with one class, the average latency over the
// base RTT; with several, each sample compared with its own class's
// service time, the costlier weighing more, as they hold their slots
// longer.
func (l *Limiter) updateLocked(now time.Time) {
	w := &l.win
	if now.Before(w.end) {
		return
	}
	ratio := 0.0 // unknown
	if w.n > 0 && w.sumBase > 0 {
		ratio = float64(w.sum) / float64(w.sumBase)
	}
	var lower bool
	switch l.cfg.Algorithm {
	case AIMD:
		lower = l.aimd(w.inflight, ratio, w.n > 0, w.dropped)
	default:
		lower = l.vegas(w.inflight, ratio, w.dropped)
		l.slowdownLocked(now, ratio, w.inflight)
	}
	if lower {
		l.drain.lowers++
	} else {
		l.drain.lowers = 0
	}
	*w = window{}
}

// observeBase folds rtt into k's base RTT, or, at a Vegas probe, starts
// the base RTT anew from it. There is no such probe while the limit sheds:
// the latest latency may then be a queued one, and taking it for the base
// ratcheted the limit up under a mild overload (see the package doc); the
// limit then probes by draining (drainLocked). Nor is there one on a
// latency under a tenth of the base, an outlier (see windowed): the probe
// waits for the next latency that is not one.
func (l *Limiter) observeBase(now time.Time, k *class, rtt time.Duration) {
	if l.cfg.Algorithm == Vegas {
		k.probeN++
		if k.probeN >= k.probeAt*l.limit && l.shedEW < probeShedMax && 10*rtt >= k.base.value() {
			l.nextProbe(k)
			l.probes++
			k.base.reset(now, l.cfg.BaseWindow, rtt)
			return
		}
	}
	k.base.add(now, l.cfg.BaseWindow, rtt)
}

// probeShedMax is the shed share (Limiter.shedEW) from which there is no
// probe on one latency: about one shed request in the last 30 admitted.
const probeShedMax = 0.01

// drain is the probe of a limit that sheds, after TCP BBR's ProbeRTT:
// while it sheds, a queue may hide behind every latency, so no single
// latency can show a base RTT that has become wrong (a slower service,
// or, with an AIMD limit, a base that a cheaper mix of requests left
// low), and admission, which the wrong base keeps low, refuses the very
// traffic that could correct it (REVIEW class 1). A limit that rests on
// a wrong base RTT calls for a lower limit at every update, even at its
// minimum, where one that found the capacity does not for long: so when
// drainAfter updates in a row called for a lower limit while it sheds (and
// at most once per drainEvery smoothed latencies, jittered into [½, 1) of
// that), the limit admits only half of itself for drainFor smoothed
// latencies: the requests
// in flight before fall below the server's concurrency, the queue behind
// them drains, and each class's base RTT starts anew from the least
// latency of its requests admitted after that (by the class's own
// completion, drainFor·srtt after the drain began at the earliest).
type drain struct {
	from, until time.Time // the drain under way; zero: none
	next        time.Time // the next drain may begin then; zero: not yet set
	lowers      int       // updates in a row that called for a lower limit
}

const (
	drainEvery = 128 // smoothed latencies between two drains, at least half of it
	drainFor   = 2   // smoothed latencies a drain lasts
	drainAfter = 16  // updates in a row calling for a lower limit that begin a drain
)

// drainLocked begins or ends the limit's drain at now.
func (l *Limiter) drainLocked(now time.Time) {
	d := &l.drain
	srtt := time.Duration(l.srtt)
	switch {
	case srtt == 0:
	case !d.from.IsZero():
		if !now.Before(d.until) {
			l.endDrainLocked(now)
		}
	case d.next.IsZero():
		d.next = now.Add(l.drainGap(srtt))
	case l.shedEW >= probeShedMax && d.lowers >= drainAfter && !now.Before(d.next):
		d.from, d.until = now, now.Add(drainFor*srtt)
		for i := range l.cls {
			l.cls[i].drainMin = 0
		}
	}
}

// drainGap is the jittered time to the next drain.
func (l *Limiter) drainGap(srtt time.Duration) time.Duration {
	return time.Duration(float64(drainEvery*srtt) * (0.5 + 0.5*l.cfg.Rand()))
}

// endDrainLocked ends the drain: each class that completed a request
// admitted after it began starts its base RTT anew from the least of them.
func (l *Limiter) endDrainLocked(now time.Time) {
	d := &l.drain
	probed := false
	for i := range l.cls {
		if k := &l.cls[i]; k.drainMin > 0 {
			k.base.reset(now, l.cfg.BaseWindow, k.drainMin)
			k.drainMin, probed = 0, true
		}
	}
	if probed {
		l.probes++
	}
	d.from, d.until = time.Time{}, time.Time{}
	d.next = now.Add(l.drainGap(time.Duration(l.srtt)))
}

// drainSampleLocked notes the latency rtt of a request of class k that
// completed at now, when a drain is under way and the request was
// admitted after it began.
func (l *Limiter) drainSampleLocked(now time.Time, k *class, rtt time.Duration) {
	d := &l.drain
	if d.from.IsZero() || now.Add(-rtt).Before(d.from) {
		return
	}
	if k.drainMin == 0 || rtt < k.drainMin {
		k.drainMin = rtt
	}
}

// capLocked returns how many requests of criticality c may be in flight
// at now: c's share of the limit, and while the limit drains to probe its
// base RTTs, at most half the limit (at least one).
func (l *Limiter) capLocked(now time.Time, c Criticality) int {
	if l.drain.from.IsZero() || !now.Before(l.drain.until) {
		return l.caps[c]
	}
	return min(l.caps[c], max(1, int(l.limit/2)))
}

// slowdownLocked learns, from the update of a window whose samples'
// queueing ratio was ratio (see updateLocked) with at most inflight in
// flight, a slowdown that made the limit shed (so that no probe comes):
// while in use (the calls in flight at least 9/10 of it), the limit fell
// to 3/4 of what it was when it last grew, the ratio last moved by more
// than 10% or it was last not in use, while the ratio stayed within 10%
// of what it was then. Under overload the latency falls with the limit,
// as the queue shortens; a slower service does not. (A limit not in use,
// above the calls in flight, is no evidence: lowering it changes no
// latency.) Each class's base RTT then starts anew from its door's service
// time, the least of its latest latencies.
func (l *Limiter) slowdownLocked(now time.Time, ratio float64, inflight int) {
	inUse := 10*float64(inflight) >= 9*l.limit
	switch {
	case ratio == 0:
	case !inUse || l.anchorR == 0 || l.limit > l.anchorL || 10*ratio < 9*l.anchorR || 10*ratio > 11*l.anchorR:
		l.anchorL, l.anchorR = l.limit, ratio
	case 4*l.limit <= 3*l.anchorL:
		probed := false
		for i := range l.cls {
			k := &l.cls[i]
			if d := k.door.value(now, l.doorStale(k)); d > 0 {
				k.base.reset(now, l.cfg.BaseWindow, d)
				probed = true
			}
		}
		if probed {
			l.probes++
		}
		l.anchorL, l.anchorR = l.limit, ratio
	}
}

// growCeiling is the most a growth may take the limit to: MaxLimit when
// at least half of the limit was in use, else InitialLimit (an
// application-limited server returns to where it started after an
// overload lowered the limit, and grows no further: an idle server does
// not learn an unbounded limit); 0 when it may not grow.
func (l *Limiter) growCeiling(inflight int) float64 {
	switch {
	case 2*inflight >= int(l.limit):
		return float64(l.cfg.MaxLimit)
	case l.limit < float64(l.cfg.InitialLimit):
		return float64(l.cfg.InitialLimit)
	}
	return 0
}

// grow raises the limit by d, up to ceiling.
func (l *Limiter) grow(d, ceiling float64) {
	if ceiling > l.limit {
		l.setLimit(min(l.limit+d, ceiling))
	}
}

// vegas is the Vegas update for a window whose queueing ratio was ratio
// (0: unknown), the most in flight at its releases being inflight.
// It reports whether the window called for a lower limit.
func (l *Limiter) vegas(inflight int, ratio float64, dropped bool) (lower bool) {
	lg := max(1, math.Log10(l.limit))
	if dropped {
		l.setLimit(l.limit - lg)
		return true
	}
	if ratio == 0 {
		return false
	}
	alpha, beta := max(1, 3*lg), max(2, 6*lg)
	queue := math.Ceil(l.limit * (1 - 1/ratio))
	switch ceiling := l.growCeiling(inflight); {
	case queue > beta:
		l.setLimit(l.limit - lg)
		return true
	case queue <= lg:
		l.grow(beta, ceiling)
	case queue < alpha:
		l.grow(lg, ceiling)
	}
	return false
}

// aimd is the AIMD update: sampled reports whether the window had a
// sample, ratio its queueing ratio (0: no base RTT yet). It reports whether
// the window called for a lower limit.
func (l *Limiter) aimd(inflight int, ratio float64, sampled, dropped bool) (lower bool) {
	if dropped || ratio > l.cfg.Tolerance {
		l.setLimit(l.limit * l.cfg.Backoff)
		return true
	}
	if sampled {
		l.grow(1, l.growCeiling(inflight))
	}
	return false
}

// Snapshot returns l's state and counters at now.
func (l *Limiter) Snapshot(now time.Time) Snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rotateLocked(now)
	l.ten.sweep(now)
	k := l.busiestLocked()
	return Snapshot{
		Limit: int(l.limit), InFlight: l.inflight, Queued: len(l.q.w),
		BaseRTT: k.base.value(), DoorRTT: l.doorLocked(now, k), SmoothedRTT: time.Duration(l.srtt),
		Count: l.count, Probes: l.probes, Tenants: l.ten.active(now), Classes: len(l.cls),
	}
}
