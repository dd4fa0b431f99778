// Package latency keeps a cheap running estimate of how long one attempt of a
// method takes: a high percentile (p90 by default) of its recent latencies,
// never below a floor the user sets. The client holds one [Estimator] per
// method and asks it, before each backoff, whether the next attempt can still
// finish before the deadline (see package deadline).
//
// # Algorithm
//
// The estimate q̂ of the p-quantile is tracked by stochastic approximation in
// the logarithm of the latency (a multiplicative "frugal" quantile tracker).
// With gain δ, each observation x moves it one step:
//
//	x > q̂:  q̂ ← q̂ · e^(δ·p)
//	x ≤ q̂:  q̂ ← q̂ · e^(−δ·(1−p))
//
// The expected step is δ·(p − F(q̂)), where F is the distribution of the
// latencies, so q̂ settles where F(q̂) = p: in the long run a share 1 − p of
// the observations lies above the estimate, whatever the distribution. The
// first observation sets q̂ to itself.
//
// Because the steps are multiplicative, the estimate has no unit of its own
// and one wild observation moves it by a bounded factor. Old observations are
// forgotten geometrically, as in an exponentially weighted moving average:
// with the defaults (p = 0.9, δ = 0.1) an observation above the estimate
// raises it by e^0.09 ≈ ×1.094 (so it doubles within 8 observations and grows
// tenfold within 26 when latency jumps), and one below lowers it by
// e^−0.01 ≈ ×0.990 (it halves within 70 observations when latency falls). It
// rises fast and falls slowly, so a brief lull does not make the client
// overconfident. In steady state the estimate wanders around the true
// quantile; its spread in log units is about √(δ·p·(1−p) / (2·f)), where f is
// the density of ln x at the quantile: ±14 % for exponentially distributed
// latencies with the defaults.
//
// # Units and defaults
//
// Observations and estimates are time.Duration (nanoseconds); the state is
// one float64 of nanoseconds. Defaults: Quantile 0.9 ([DefaultQuantile]),
// Gain 0.1 ([DefaultGain]), Floor 0. Before any observation, and whenever the
// estimate is below it, [Estimator.Estimate] returns the floor.
//
// # Concurrency
//
// An Estimator is safe for concurrent use. Observe is one compare-and-swap
// on a single atomic word (under contention the losing observation is
// dropped, not retried) and Estimate one atomic load: no locks, no
// allocation.
//
// # Windows
//
// A [Window] answers a different question: the quantile of the last few
// hundred observations, read as a lower quantile from a histogram of
// logarithmic buckets (eight per octave), so that it never settles in a gap
// of a clustered distribution the way the Estimator may. The client hedges
// at a Window's quantile (hedgingDelayQuantile); see the type for its
// algorithm and costs.
package latency
