// Package peakewma estimates an endpoint's latency with a peak-sensitive
// exponentially weighted moving average (Finagle's and Linkerd's "peak
// EWMA"), and turns it into the cost that a power-of-two-choices balancer
// compares: the estimate weighted by the requests outstanding. It knows
// nothing of gRPC: the caller passes every instant (nanoseconds on a
// monotonic clock of its own) and every latency.
//
// # Algorithm
//
// The estimate c moves with each observed latency x, weighted by the time
// since the last observation, td, against the decay time τ:
//
//	x > c:  c ← x                              (a peak is taken at once)
//	x ≤ c:  c ← c·w + x·(1 − w),  w = e^(−td/τ)
//
// and between observations it decays toward zero: read at instant t, it is
// c·e^(−(t − stamp)/τ). The weighting is by time, not by count, so the
// estimate forgets at the same pace whatever the request rate: after a
// slow spell ends it takes about τ·ln(slow/fast) to look fast again. The
// decay toward zero is what brings back an endpoint that a balancer stopped
// picking because it looked slow: with no new observation its cost falls
// until it is picked again and measured (REVIEW class 1: a state that only
// moves through the traffic it refuses must also age with time).
//
// Two kinds of observation only raise the estimate: an error answer
// (ObservePeak: c ← max(c, x)), and a request cut short unanswered after x,
// by a timeout or by a hedged sibling's answer (ObserveCut: c ←
// max(c, x + min(b, x)), b the estimate the request was sent under: the
// latency expected of a request that has already lasted x, so that
// requests sent together count once; see ObserveCut).
//
// Cost, for the balancer, is c·(1 + a·outstanding): an endpoint with work
// in flight is dearer in proportion, each request outstanding weighing a
// share a of a latency. Finagle and Linkerd take a = 1, c·(outstanding +
// 1), the cost of a server that serves one request at a time; the caller
// chooses a for servers that serve several at once (interceptor/endpoint
// takes a quarter by default, and says why). An endpoint with work in
// flight and no observation within τ (never measured, or back after a long
// absence) costs Penalty + outstanding: it gets one request at a time
// until that request measures it, instead of every request while its
// stale estimate looks cheap.
//
// # Decay time
//
// Finagle and Linkerd both use τ = 10 s (DefaultDecayTime), the gRPC
// policy's default too. Shorter, one slow response is forgotten sooner but
// a slow endpoint is probed again sooner (a probe costs one caller the
// slow latency); longer, the balancer remembers a bad spell longer. 10 s
// keeps an idle 10× slower endpoint out for about τ·ln(10) ≈ 23 s between
// probes, while a healthy endpoint's estimate follows its latency within
// seconds; one slow response keeps an endpoint from the picks of a
// balancer that compares it with busier ones for about τ·ln(slow/busy
// cost).
//
// # Concurrency
//
// An Estimator is safe for concurrent use. Cost, Price and Estimate read
// two atomic words with no lock and allocate nothing; the observations
// take a mutex. A read
// racing an observation may pair the new estimate with the old instant (or
// the reverse), which decays it a little more or less for that one read.
// Observations may arrive out of order (two requests end together): the
// estimate keeps the newest instant, a late peak is taken, and a late lower
// latency weighs nothing (td ≤ 0: w = 1).
package peakewma

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultDecayTime is Finagle's and Linkerd's decay time τ.
const DefaultDecayTime = 10 * time.Second

// Penalty is the cost of an endpoint with work outstanding and no recent
// observation: far above any latency, so that it gets another request only
// when every candidate is as unknown (Finagle's penalty, about 39 hours in
// nanoseconds).
const Penalty = float64(math.MaxInt64 >> 16)

// Estimator is one endpoint's latency estimate. The zero value is an
// endpoint never measured.
type Estimator struct {
	mu    sync.Mutex    // held by Observe
	cost  atomic.Uint64 // the estimate c at stamp: float64 bits, nanoseconds
	stamp atomic.Int64  // the instant of the last observation; 0: none
}

// Observe counts the latency rtt of a request that ended at now.
func (e *Estimator) Observe(now int64, rtt time.Duration, tau time.Duration) {
	e.observe(now, rtt, tau, false)
}

// ObservePeak counts rtt as a lower bound of a latency (an error answer,
// which must not make an endpoint look fast): it raises the estimate to
// rtt when it is above it, and never lowers it.
func (e *Estimator) ObservePeak(now int64, rtt time.Duration, tau time.Duration) {
	e.observe(now, rtt, tau, true)
}

// ObserveCut counts a request cut short unanswered after elapsed (a
// timeout, or a hedged copy whose sibling answered first), sent while the
// estimate was sentUnder (Estimate when it was sent; the caller reads it
// then): its latency is more than elapsed, by how much no one saw. It
// raises the estimate (decayed to now) to
//
//	elapsed + min(sentUnder, elapsed)
//
// and never lowers it. A request still unanswered after elapsed is
// expected to take about elapsed more than its estimate: that is the
// expected latency given that it exceeded elapsed when latencies are
// memoryless (exponential, with the estimate as their mean). Taking the
// bare elapsed instead would price an endpoint by the cut, not by itself:
// one 10× slower than the others, reached only by copies that its hedges
// outran, would be known by the hedging delay plus a fast answer, and be
// tried again as soon as a fast endpoint's cost peaks above that.
//
// The estimate a request was sent under, not the estimate when it is cut,
// is what makes cuts count right whatever the traffic: requests sent
// together (sixteen callers meeting one black hole) weigh the same
// estimate, so their cuts count as one does, while requests sent one
// after another's cut build on it, up to twice the cut: the decay, not a
// growing estimate, decides when the endpoint is tried again. An endpoint
// never measured was sent requests under 0: its first cut sets the
// estimate to elapsed.
func (e *Estimator) ObserveCut(now int64, elapsed, sentUnder, tau time.Duration) {
	x := max(elapsed, 0)
	e.observe(now, x+min(max(sentUnder, 0), x), tau, true)
}

// observe counts the latency rtt, at most raising the estimate when
// peakOnly (ObservePeak, ObserveCut).
func (e *Estimator) observe(now int64, rtt, tau time.Duration, peakOnly bool) {
	x := float64(max(rtt, 0))
	e.mu.Lock()
	defer e.mu.Unlock()
	c, stamp := math.Float64frombits(e.cost.Load()), e.stamp.Load()
	switch {
	case x > c || stamp == 0:
		c = x
	case peakOnly:
		c = decay(c, now-stamp, tau) // what a read would give
		if x > c {
			c = x
		}
	default:
		w := math.Exp(-float64(max(now-stamp, 0)) / float64(tau))
		c = c*w + x*(1-w)
	}
	e.cost.Store(math.Float64bits(c))
	// An observation that arrives late (its end read before another's,
	// its lock taken after) leaves the newest instant: c is the estimate
	// as of then, and moving the stamp back would decay it again over
	// time it has already decayed through.
	e.stamp.Store(max(now, stamp, 1))
}

// Estimate returns the latency estimate at now, decayed since the last
// observation; 0 when never measured.
func (e *Estimator) Estimate(now int64, tau time.Duration) time.Duration {
	stamp := e.stamp.Load()
	if stamp == 0 {
		return 0
	}
	return time.Duration(decay(math.Float64frombits(e.cost.Load()), now-stamp, tau))
}

// Cost returns the balancer's cost of the endpoint at now with outstanding
// requests in flight, each weighing perAttempt of its latency: Estimate ×
// (1 + perAttempt × outstanding), or Penalty + outstanding when requests
// are outstanding and no observation came within tau, or the estimate is
// 0. A perAttempt of 1 is
// Finagle's and Linkerd's cost, Estimate × (outstanding + 1).
func (e *Estimator) Cost(now int64, outstanding int, perAttempt float64, tau time.Duration) float64 {
	cost, _ := e.Price(now, outstanding, perAttempt, tau)
	return cost
}

// Price returns Cost and Estimate at now together, reading the state once:
// a balancer compares the costs, and keeps the estimate of the endpoint it
// picks for ObserveCut.
func (e *Estimator) Price(now int64, outstanding int, perAttempt float64, tau time.Duration) (cost float64, estimate time.Duration) {
	stamp := e.stamp.Load()
	if stamp == 0 {
		if outstanding > 0 {
			return Penalty + float64(outstanding), 0
		}
		return 0, 0
	}
	c := decay(math.Float64frombits(e.cost.Load()), now-stamp, tau)
	// A latency of 0 (an answer within a clock tick) would make the work
	// in flight weigh nothing: price it as Finagle does, as the unmeasured.
	if outstanding > 0 && (now-stamp > int64(tau) || c == 0) {
		return Penalty + float64(outstanding), time.Duration(c)
	}
	return c * (1 + perAttempt*float64(outstanding)), time.Duration(c)
}

// decay returns c after td nanoseconds of decay with time constant tau.
func decay(c float64, td int64, tau time.Duration) float64 {
	if td <= 0 {
		return c
	}
	return c * math.Exp(-float64(td)/float64(tau))
}
