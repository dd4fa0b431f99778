// Package limit is the engine of the server's adaptive concurrency limit: it
// decides whether one more request may run now, learns how many may run at
// once from the latencies of those that ran, says how long a shed request
// should wait before it comes back, queues requests over the limit by
// criticality, and shares the limit fairly among tenants. It knows nothing
// of grpc; every method takes the time as a parameter.
//
// # Algorithm
//
// The default is TCP Vegas applied to requests, as in Netflix's
// concurrency-limits. The limit L is the number of requests allowed in
// flight. The base RTT b is the service time with no queueing, estimated
// from the latencies of completed requests (see "Base RTT"). A window of
// requests (one smoothed latency long) whose latencies averaged r while L
// were allowed says that about
//
//	queue = ceil(L · (1 − b/r))
//
// of the L were waiting rather than being served. With α = 3·log10(L) and
// β = 6·log10(L) (and at least 1 and 2), each window moves L:
//
//	queue ≤ log10(L):       L ← L + β       (nothing waits: grow fast)
//	queue < α:              L ← L + log10(L)
//	queue > β:              L ← L − log10(L)
//	a drop in the window:   L ← L − log10(L)  (a deadline ended while a request ran: see "Outcomes")
//
// and L stays within [MinLimit, MaxLimit]. L grows only while at least half
// of it is in use, so an idle server does not learn an unbounded limit; but
// below InitialLimit it grows back to InitialLimit whenever nothing queues,
// so that once an overload is over the limit returns to where it was
// before it. The limit therefore settles where α to β requests wait
// behind the capacity of the server: it keeps the server busy (goodput
// near capacity) and bounds the queueing delay to about β/L of a service
// time.
//
// AIMD is the simple alternative: L ← L + 1 per window while at least half
// of L is in use (or L is below InitialLimit) and the latency is at most
// Tolerance·b, and L ← L · Backoff (0.9) on a drop or a slower window.
//
// # Outcomes
//
// Release takes what a request's end says of the load. Only a request the
// server completed (its handler answered OK) is a latency sample. A failure
// says nothing reliable: a validation error or an idempotent replay returns
// in microseconds, and three of them used to become the base RTT and make
// every honest request look queued. A request whose caller went away, or
// that panicked, says nothing either. A request whose deadline ended while
// it ran is a drop only when its deadline left it at least twice the base
// RTT when it was admitted: then the server was too slow for a reasonable
// deadline, which is overload; a shorter deadline is the caller's choice
// (a caller that never cancels, ending every request on the server's own
// timer, used to take the limit to its minimum in seconds), and teaches
// nothing.
//
// # Base RTT
//
// The base RTT is the least latency of the last one or two BaseWindow
// periods (30s by default), less outliers: a latency under a tenth of the
// 5th smallest (the largest, with fewer than 5) is ignored, so up to four
// requests that were
// much faster than the service for a reason of their own do not become
// the base, while under overload, where every latency is a queued one, the
// base is the least of them, the one that saw the shortest queue. The
// windows rotate with time, on every Acquire and Release, so an estimate
// that no latency confirms ages out: after two windows without a sample
// the base RTT is 0 (unknown) until the next.
//
// # Cost classes
//
// Requests differ in cost: a method that answers from a cache in
// microseconds beside one that takes 10ms. With one base RTT, the cheap
// one became the base and every 10ms request looked queued: with 16
// callers of a 10ms method, 1% of cheap calls took an AIMD limit to 1 and
// shed 87% of the 10ms calls (issue 33). So each request names its cost
// class (Request.Class; the server gives each method its own, at most
// MaxClasses), and each class has its own base RTT, door and probe. A
// window's queueing ratio is the sum of its latencies over the sum of
// their classes' base RTTs, r/b in the formulas: each latency compared
// with its own class's service time, the costlier weighing more, as they
// hold their slots longer. With one class it is the average latency over
// the base RTT.
//
// # Probe
//
// Vegas's weakness: when the service time itself rises for good (a
// deploy, a slower dependency), the old base RTT makes every request look
// queued and the limit falls towards MinLimit. So Vegas probes, as
// Netflix's VegasLimit does: after about ProbeMultiplier × L samples of a
// class (default 10; the count is drawn anew after each probe from [½, 1)
// of that with Config.Rand, so servers started together do not probe in
// step), the class's base RTT starts anew from its next sample, and the
// samples after it fold in as the minimum again. After a lasting slowdown
// that sample is the new service time: nothing looks queued any more and
// the limit grows back, with 16 requests in flight at 200ms within about
// 2s of fake time in the tests (TestVegasLearnsSlowdown,
// server.TestSlowdownLimitRecovers in interceptor/server).
//
// Under overload that sample is a queued one. When the overload is heavy
// the limit swings around its settling point, the samples at its low points
// see a short queue, and the minimum comes back down; but at a mild
// overload (1.2 times the capacity) the queue never drains, each probe
// raised the base RTT, and the limit grew without bound: 124 for 8 slots,
// and latencies 14 times the service time (TestNoRatchetUnderMildOverload,
// server.TestOverloadMildDoesNotRatchet). So there is no such probe while
// the limit sheds (one shed request in the last 30 or so admitted): there
// a queue cannot be told from a slowdown by one latency. Nor is there a
// probe on a latency under a tenth of the base RTT, an outlier as the base
// judges them (a cached answer in microseconds, next to a service of
// 100ms): the probe waits for the next latency that is not one
// (TestVegasProbeSkipsOutliers).
//
// While the limit sheds, it probes by draining instead, as TCP BBR's
// ProbeRTT does: a base RTT that has become wrong keeps the limit low, the
// limit refuses the very traffic whose latencies could correct it, and
// nothing would move it (an AIMD limit whose service became three times
// slower sat at 1 for a minute, using one slot of 8). A limit that rests
// on a wrong base calls for a lower limit at every update, even at its
// minimum; one that found the capacity does not for long. So when 16
// updates in a row called for a lower limit while the limit sheds (and at
// most once per 64 to 128 smoothed latencies, jittered with Config.Rand),
// the limit admits only half of itself for 2 smoothed latencies: the
// requests in flight before fall below the server's concurrency, the queue
// behind them drains, and each class's base RTT starts anew from the least
// latency of its requests admitted after the drain began
// (TestDrainLearnsASlowdownWhileShedding). A drain costs about one
// smoothed latency of half the slots.
//
// A slowdown that makes the limit shed is also learned by the slowdown
// detector: under overload, when the limit falls the queue shortens and
// the latency falls with it; when the service itself became slower, it
// does not. When the limit has fallen to 3/4 of what it was when it last
// grew (or when the queueing ratio last moved by more than 10%), while the
// ratio of the windows stayed within 10% of what it was then, each class's
// base RTT starts anew from its door's service time, the least of its
// latest latencies (TestSlowdownDetector). AIMD does not probe on one
// latency: its latency test is a Tolerance multiple of the base RTT, and a
// slowdown within Tolerance does not move it.
//
// # The door
//
// A request whose remaining deadline is shorter than its class's door's
// service time cannot finish in time even without queueing, and is shed
// at once (ShedDeadline). The door's service time is the least latency of
// the class's last 32 to 64 samples, not the base RTT: a fast latency
// lowers it at once and a probe does not move it, so the door errs
// towards letting requests in. It must never rest on a stale estimate,
// since it refuses the very requests whose completion would correct it:
// it lets one request it would refuse through per service time it holds
// (counted from the last one let through, or the first sample), so that
// once the service is fast again the door learns it within about one of
// its own service times (after a 400ms slow phase, a 150ms call is served
// within 400ms; it used to take 3.2s). A request whose deadline has passed
// is never let through, and one let through that teaches the door nothing
// (its deadline cut it, its caller went away, it failed, or the limit shed
// it) lets the next request with more time left through at once, so that
// callers whose deadlines leave no time for any service cannot take every
// test. Once no request of the class completed for 8 of its smoothed
// latencies the door is open to every deadline until one does.
//
// # Criticality
//
// A request carries one of four criticalities; the lower ones may use only a
// share of L (CriticalPlus 100%, Critical 90%, SheddablePlus 75%,
// Sheddable 50%), so under pressure the server sheds Sheddable first, then
// SheddablePlus, and Critical only when the in-flight requests of the upper
// classes fill its whole share. When a request is shed over the limit, the
// less critical ones yield for 4 smoothed latencies: they are shed even
// where their share has room, so the slots freed go to the more critical
// ones; except a tenant's under its fair share (see Tenants), which another
// tenant's excess has no claim on.
// Shares alone do not do it: a flood of Sheddable requests filling its half
// slows every request in the server, the Critical ones in flight grow (more
// of them wait) and fill the rest.
//
// # Queue
//
// With MaxQueue, a request shed over the limit may wait for a slot
// (Enqueue, then Leave). The queue serves the most critical waiter first,
// then the one whose tenant has fewest requests in flight, then the oldest;
// a freed slot goes to it at the Release, before any new request can take
// it. A full queue gives the place of its least critical waiter (of the
// tenant holding the most, the newest) to a more critical request, or to
// an as critical one of a tenant that would still hold less; the displaced
// waiter is told at once. A waiter whose share of the limit has no room is
// passed over, and the slot stays for the requests that may take it.
//
// # Tenants
//
// A request may name its tenant. Under pressure each tenant with requests
// in flight or queued has a fair share of its criticality's share of L:
// the max-min fair share, a tenant with one request taking one slot and
// those with more sharing the rest equally. A tenant that called recently
// and holds nothing is no claimant: dividing L by every tenant seen within
// TenantIdle shrank each share under a slot when 60 tenants called once
// every 2s, and a tenant at half its share lost two thirds of its calls
// beside another's flood (issue 33). A tenant under its fair share may
// fill the criticality's share of L; one at or over it only what is left
// once each other tenant under its fair share has a slot kept free (at
// most a tenth of L in all): a tenant over its share is shed before any
// tenant under it, and a lone tenant may use the whole limit. Requests in
// flight are never preempted. At most MaxTenants (1024 by default) named
// tenants are remembered at once (each for TenantIdle, 5s by default,
// after its last request, or while it has requests in flight or queued)
// and the names beyond share one, as do names longer than MaxTenantName
// (256 bytes); a tenant idle for TenantIdle is forgotten by the next
// request, whatever tenant it names. With one tenant, the limit behaves as
// without tenants.
//
// # Pushback
//
// A shed request is told to come back after
//
//	pushback = s · (1 + x/(1 − x))
//
// where s is the smoothed latency of the samples (EWMA, weight 1/16;
// InitialServiceTime, 100ms, before the first) and x the smoothed share of
// requests shed (EWMA, weight 1/64): when a third of the requests are
// shed, x/(1 − x) = 0.5 and a client waits one and a half service times,
// the time in which the requests admitted before it drain and the excess
// spreads out. The result is rounded up to the millisecond up to 10ms and
// then to the E12 series (12, 15, 18, 22, 27, 33, 39, 47, 56, 68, 82, 100,
// ... ms), so it moves in steps of at most 25% and a server keeps one
// status per step (PushbackStep). Once x reaches 1/2, the server sheds at
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
// A [Limiter] is safe for concurrent use; every method takes one mutex.
// Acquire and Release allocate nothing and do a few arithmetic operations,
// plus, with tenants under pressure, a scan of the tenants under their
// share (stopped at a tenth of L) and, with a queue, a scan of the waiters
// at each release.
package limit
