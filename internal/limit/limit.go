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

// share is the fraction of the limit a criticality may fill.
var share = [NumCriticalities]float64{
	Critical:      0.9,
	CriticalPlus:  1,
	SheddablePlus: 0.75,
	Sheddable:     0.5,
}

// Config is the normalized configuration of a [Limiter]. The zero value of
// a field means its default.
type Config struct {
	// Algorithm is Vegas (the default) or AIMD.
	Algorithm Algorithm
	// InitialLimit is the limit before any request completed; default 20.
	InitialLimit int
	// MinLimit and MaxLimit bound the limit; defaults 1 and 1000.
	MinLimit, MaxLimit int
	// BaseWindow is the period of the base RTT's minimum (it is the minimum
	// over the last two periods, reset by each Vegas probe); default 30s.
	BaseWindow time.Duration
	// ProbeMultiplier (Vegas): about every ProbeMultiplier × limit
	// samples (jittered into [½, 1) of that), the base RTT is reset to the
	// next sample, so a lasting rise of the service time becomes the new
	// base within that many samples (see the package doc); default 10.
	ProbeMultiplier float64
	// Rand draws the probe's jitter in [0, 1); nil: math/rand/v2's
	// Float64. Tests inject a seeded source for repeatable runs.
	Rand func() float64
	// Tolerance (AIMD): a latency above Tolerance times the base RTT counts
	// as overload; default 2.
	Tolerance float64
	// Backoff (AIMD): the factor of a decrease, in (0, 1); default 0.9.
	Backoff float64
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
	return c
}

// Verdict is what Acquire decided.
type Verdict uint8

const (
	// Admitted: the request may run; end it with one Release or Abandon.
	Admitted Verdict = iota
	// ShedLimit: the in-flight requests fill the criticality's share of
	// the limit.
	ShedLimit
	// ShedDeadline: the request's remaining deadline is shorter than the
	// base RTT, so it cannot finish in time even without queueing.
	ShedDeadline
	// NumVerdicts is the number of verdicts.
	NumVerdicts
)

// NoRetry is the pushback that tells a shed request not to come back: the
// server sheds at least as many requests as it admits, so a retry would
// only add to the excess.
const NoRetry = time.Duration(-1)

// NoDeadline is the remaining time of a request without a deadline.
const NoDeadline = time.Duration(math.MaxInt64)

// Snapshot is a Limiter's state and counters.
type Snapshot struct {
	Limit    int
	InFlight int
	// BaseRTT is the base RTT; SmoothedRTT the EWMA of admitted latencies.
	BaseRTT, SmoothedRTT time.Duration
	// Count counts the verdicts by criticality.
	Count [NumVerdicts][NumCriticalities]uint64
	// Probes counts the Vegas probes: resets of the base RTT.
	Probes uint64
}

// A Limiter is one adaptive concurrency limit. Use [New]; the zero value is
// not usable.
type Limiter struct {
	cfg Config // normalized; immutable

	mu       sync.Mutex
	limit    float64                               // in [MinLimit, MaxLimit]
	caps     [NumCriticalities]int                 // in-flight at which each criticality is shed; follows limit
	inflight int                                   // admitted and not yet released
	base     [2]time.Duration                      // minimum latency of the previous and current window; 0: none
	baseEnd  time.Time                             // end of the current window; zero before the first sample
	probeN   float64                               // samples since the last probe
	probeAt  float64                               // probe when probeN reaches probeAt × limit
	probes   uint64                                // base RTT resets by a probe
	srtt     float64                               // EWMA of admitted latencies, nanoseconds
	win      window                                // samples since the last update
	shedEW   float64                               // EWMA of the shed share of decisions
	count    [NumVerdicts][NumCriticalities]uint64 // verdicts by criticality
	released chan struct{}                         // closed at the next release; nil: nobody waits
}

// New returns a Limiter for cfg, or cfg's first error.
func New(cfg Config) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &Limiter{cfg: cfg.normalize()}
	l.setLimit(float64(l.cfg.InitialLimit))
	l.nextProbe()
	return l, nil
}

// nextProbe draws the jittered multiplier of the next probe.
func (l *Limiter) nextProbe() {
	l.probeN = 0
	l.probeAt = l.cfg.ProbeMultiplier * (0.5 + 0.5*l.cfg.Rand())
}

// setLimit sets the limit, clamped, and the caps that follow from it.
func (l *Limiter) setLimit(v float64) {
	l.limit = min(max(v, float64(l.cfg.MinLimit)), float64(l.cfg.MaxLimit))
	for c, s := range share {
		l.caps[c] = max(1, int(math.Ceil(l.limit*s)))
	}
}

// Acquire decides on a request of criticality c with left of its deadline
// remaining (NoDeadline when it has none). It sheds the request when left
// is shorter than the base RTT, or when the requests in flight fill c's
// share of the limit; then pushback is how long it should wait before
// coming back, or NoRetry (0 for ShedDeadline: it has no time to come
// back). An
// admitted request must be ended by exactly one Release or Abandon.
func (l *Limiter) Acquire(c Criticality, left time.Duration) (v Verdict, pushback time.Duration) {
	if c >= NumCriticalities {
		c = Critical
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if base := l.baseLocked(); left < base {
		l.count[ShedDeadline][c]++
		return ShedDeadline, 0
	}
	if l.inflight < l.caps[c] {
		l.inflight++
		l.count[Admitted][c]++
		l.shedEW -= l.shedEW / 64
		return Admitted, 0
	}
	l.count[ShedLimit][c]++
	l.shedEW += (1 - l.shedEW) / 64
	return ShedLimit, l.pushbackLocked()
}

// pushbackLocked is the wait of the package doc, or NoRetry.
func (l *Limiter) pushbackLocked() time.Duration { return pushback(l.srtt, l.shedEW) }

// pushback is s·(1 + x/(1 − x)) rounded up to the millisecond, at least
// 1ms, or NoRetry from x = 1/2 (see the package doc).
func pushback(srtt, x float64) time.Duration {
	if x >= 0.5 {
		return NoRetry
	}
	d := time.Duration(srtt * (1 + x/(1-x)))
	const ms = time.Millisecond
	return max(ms, (d+ms-1)/ms*ms)
}

// BaseRTT returns the base RTT, 0 before the first sample.
func (l *Limiter) BaseRTT() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.baseLocked()
}

func (l *Limiter) baseLocked() time.Duration {
	b0, b1 := l.base[0], l.base[1]
	switch {
	case b0 == 0:
		return b1
	case b1 == 0:
		return b0
	}
	return min(b0, b1)
}

// TryAcquire is Acquire for a request that was shed and waits in a queue
// for a slot: it admits the request (counted as Admitted) when c's share
// has room, and otherwise counts nothing, as the shed was counted on
// arrival.
func (l *Limiter) TryAcquire(c Criticality) bool {
	if c >= NumCriticalities {
		c = Critical
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inflight >= l.caps[c] {
		return false
	}
	l.inflight++
	l.count[Admitted][c]++
	l.shedEW -= l.shedEW / 64
	return true
}

// Released returns a channel closed at the next Release or Abandon: a
// request that was shed may wait on it (with a bound of its own) and try
// Acquire again. It allocates only when nobody waits yet.
func (l *Limiter) Released() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released == nil {
		l.released = make(chan struct{})
	}
	return l.released
}

// wakeLocked closes the channel of Released, if any.
func (l *Limiter) wakeLocked() {
	if l.released != nil {
		close(l.released)
		l.released = nil
	}
}

// Release ends an admitted request that completed at now after latency
// rtt; dropped reports that its deadline ended before it did (overload).
func (l *Limiter) Release(now time.Time, rtt time.Duration, dropped bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	inflight := l.inflight
	l.inflight--
	l.wakeLocked()
	if rtt <= 0 {
		rtt = 1
	}
	l.observeBase(now, rtt)
	if l.srtt == 0 {
		l.srtt = float64(rtt)
	} else {
		l.srtt += (float64(rtt) - l.srtt) / 16
	}
	w := &l.win
	if w.n == 0 {
		w.end = now.Add(time.Duration(l.srtt))
	}
	w.n++
	w.sum += rtt
	w.inflight = max(w.inflight, inflight)
	w.dropped = w.dropped || dropped
	if now.Before(w.end) {
		return
	}
	avg := w.sum / time.Duration(w.n)
	base := l.baseLocked()
	switch l.cfg.Algorithm {
	case AIMD:
		l.aimd(w.inflight, avg, base, w.dropped)
	default:
		l.vegas(w.inflight, avg, base, w.dropped)
	}
	*w = window{}
}

// window gathers the samples of one update.
type window struct {
	end      time.Time     // the update happens at the first sample at or after end
	n        int           // samples
	sum      time.Duration // of their latencies
	inflight int           // the most in flight at a release
	dropped  bool          // any dropped
}

// Abandon ends an admitted request without a sample: it ended for a reason
// that says nothing of the server's load (the caller went away).
func (l *Limiter) Abandon() {
	l.mu.Lock()
	l.inflight--
	l.wakeLocked()
	l.mu.Unlock()
}

// observeBase folds rtt into the windowed minimum, or, at a Vegas probe,
// makes it the base RTT.
func (l *Limiter) observeBase(now time.Time, rtt time.Duration) {
	if l.cfg.Algorithm == Vegas {
		l.probeN++
		if l.probeN >= l.probeAt*l.limit {
			l.nextProbe()
			l.probes++
			l.base = [2]time.Duration{0, rtt}
			l.baseEnd = now.Add(l.cfg.BaseWindow)
			return
		}
	}
	if l.baseEnd.IsZero() {
		l.baseEnd = now.Add(l.cfg.BaseWindow)
	}
	if !now.Before(l.baseEnd) {
		l.base[0], l.base[1] = l.base[1], 0
		if now.Sub(l.baseEnd) >= l.cfg.BaseWindow {
			l.base[0] = 0 // a whole window passed without a sample
		}
		l.baseEnd = now.Add(l.cfg.BaseWindow)
	}
	if l.base[1] == 0 || rtt < l.base[1] {
		l.base[1] = rtt
	}
}

// vegas is the Vegas update for a request that ran with inflight others
// (itself included).
func (l *Limiter) vegas(inflight int, rtt, base time.Duration, dropped bool) {
	lg := max(1, math.Log10(l.limit))
	if dropped {
		l.setLimit(l.limit - lg)
		return
	}
	alpha, beta := max(1, 3*lg), max(2, 6*lg)
	queue := math.Ceil(l.limit * (1 - float64(base)/float64(rtt)))
	// An application-limited sample (under half the limit in use) may
	// lower the limit but not raise it.
	grow := 2*inflight >= int(l.limit)
	switch {
	case queue > beta:
		l.setLimit(l.limit - lg)
	case !grow:
	case queue <= lg:
		l.setLimit(l.limit + beta)
	case queue < alpha:
		l.setLimit(l.limit + lg)
	}
}

// aimd is the AIMD update.
func (l *Limiter) aimd(inflight int, rtt, base time.Duration, dropped bool) {
	if dropped || float64(rtt) > l.cfg.Tolerance*float64(base) {
		l.setLimit(l.limit * l.cfg.Backoff)
		return
	}
	if 2*inflight >= int(l.limit) {
		l.setLimit(l.limit + 1)
	}
}

// Snapshot returns l's state and counters.
func (l *Limiter) Snapshot() Snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Snapshot{
		Limit: int(l.limit), InFlight: l.inflight,
		BaseRTT: l.baseLocked(), SmoothedRTT: time.Duration(l.srtt),
		Count: l.count, Probes: l.probes,
	}
}
