// Package limit is the engine of the server's adaptive concurrency limit: it
// decides whether one more request may run now, learns how many may run at
// once from the latencies of those that ran, and says how long a shed
// request should wait before it comes back. It knows nothing of grpc.
//
// # Algorithm
//
// The default is TCP Vegas applied to requests, as in Netflix's
// concurrency-limits. The limit L is the number of requests allowed in
// flight. The base RTT b is the smallest latency seen (the service time
// with no queueing). A request that took r while L were allowed says that
// about
//
//	queue = ceil(L · (1 − b/r))
//
// of the L were waiting rather than being served. With α = 3·log10(L) and
// β = 6·log10(L) (and at least 1 and 2), each completed request moves L:
//
//	queue ≤ log10(L):       L ← L + β       (nothing waits: grow fast)
//	queue < α:              L ← L + log10(L)
//	queue > β:              L ← L − log10(L)
//	a dropped request:      L ← L − log10(L)  (its deadline ended while it ran)
//
// and L stays within [MinLimit, MaxLimit]. L grows only while at least half
// of it is in use, so an idle server does not learn an unbounded limit. The
// limit therefore settles where α to β requests wait behind the capacity of
// the server: it keeps the server busy (goodput near capacity) and bounds the
// queueing delay to about β/L of a service time.
//
// Why Vegas and not Gradient2: Gradient2 compares a short against a long
// moving average of the latency; under sustained overload the long average
// drifts up with the short one and the limit follows it, so the queue it
// allows grows with the length of the overload. Vegas measures against the
// base RTT, which queueing cannot raise. Its weakness is the other way round:
// when the service time itself rises for good (a deploy, a slower
// dependency), the old base RTT makes every request look queued and the
// limit falls towards MinLimit, shedding traffic a server that is not
// overloaded could serve. The base RTT is the minimum of the latencies of
// the last two BaseWindow periods (30s by default), which alone would take
// up to a minute to forget the old service time.
//
// # Probe
//
// Vegas therefore probes, as Netflix's VegasLimit does: after about
// ProbeMultiplier × L samples (default 10; the count is drawn anew after
// each probe from [½, 1) of that with Config.Rand, so servers started
// together do not probe in step), the next sample becomes the base RTT
// outright, whatever the windowed minimum was, and later samples fold in as
// the minimum again. After a lasting slowdown that sample is the new
// service time: nothing looks queued any more and the limit grows back.
// The count is in samples, not seconds, so a probe comes after about
// ProbeMultiplier round trips of a server that uses its limit, and sooner
// as the limit falls: with 16 requests in flight at 200ms, within about 2s
// of fake time in the tests (TestVegasLearnsSlowdown,
// interceptor.TestSlowdownLimitRecovers), against 30 to 60s without it.
//
// Under overload the probe's sample is a queued one, and the limit grows by
// up to β before the queue it adds shows against that base; but the limit
// moves around its settling point, the samples taken at its low points see
// a shorter queue, and the minimum comes back down, so the probes do not
// ratchet: after 30 or 60s of a simulated 3× overload the limit is where it
// settled after 3s (about 1.5 times the server's concurrency), the base RTT
// between probes within 20% of the service time and the admitted p99 under
// twice it (TestConvergesOnFixedCapacity, interceptor.TestOverloadSustained).
// Gradient2's long-term average learns a slowdown without probing but has
// the drift above, which is what the limit exists to prevent; BBR's
// ProbeRTT (drain the queue to measure) would cost goodput at every probe.
// AIMD does not probe: its latency test is a Tolerance multiple of the base
// RTT, and a slowdown within Tolerance does not move it.
//
// AIMD is the simple alternative: L ← L + 1 per completed request while at
// least half of L is in use and the latency is at most Tolerance·b, and
// L ← L · Backoff (0.9) when a request is dropped or slower than that.
//
// # Criticality
//
// A request carries one of four criticalities; the lower ones may use only a
// share of L (CriticalPlus 100%, Critical 90%, SheddablePlus 75%,
// Sheddable 50%), so under pressure the server sheds Sheddable first, then
// SheddablePlus, and Critical only when the in-flight requests of the upper
// classes fill its whole share.
//
// # Pushback
//
// A shed request is told to come back after
//
//	pushback = s · (1 + x/(1 − x))
//
// where s is the smoothed latency of admitted requests (EWMA, weight 1/16)
// and x the smoothed share of requests shed (EWMA, weight 1/64): when a
// third of the requests are shed, x/(1 − x) = 0.5 and a client waits one and
// a half service times, the time in which the requests admitted before it
// drain and the excess spreads out. The result is rounded up to the
// millisecond and is at least 1ms. Once x reaches 1/2, the server sheds at
// least as many requests as it serves, and a retry could only add to the
// excess: the pushback is then [NoRetry], gRFC A6's "do not retry", as the
// SRE book's "overloaded; don't retry" answer. This is what keeps a
// retrying client from amplifying a sustained overload beyond its first
// attempts, whatever its retry budget.
//
// # CPU-aware shedding
//
// [BBR] is the alternative of Kratos and go-zero, after TCP BBR: it does
// nothing while the CPU use is below a threshold (0.8), and above it (or
// within a cool-off of 1s after a shed) admits a request only while the
// requests in flight stay below the bandwidth-delay product
// maxPass × minRT / bucket, measured over a window of 10 buckets (5s). It
// needs no latency target, but it reacts only to CPU: a server that is
// slow for another reason (a lock, a dependency) is not protected.
//
// # Concurrency
//
// A [Limiter] is safe for concurrent use; every method takes one mutex for
// a few arithmetic operations and allocates nothing.
package limit
