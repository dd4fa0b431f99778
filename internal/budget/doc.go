// Package budget is a retry budget shared by all methods of a client, in the
// design of Finagle and Linkerd, with one change that lets it tell a broad
// outage from independent failures: a retry that succeeds is refunded.
//
// # Algorithm
//
// Over a sliding window of length TTL the budget keeps one balance, in
// retries:
//
//	balance = MinRetriesPerSecond × TTL  +  Ratio × requests  −  unrefunded retries
//
// Every logical call deposits Ratio ([Budget.OnRequest]); every retry
// withdraws 1 and is sent only if the balance stays ≥ 0 after the withdrawal
// ([Budget.TryRetry]); a retry whose attempt succeeds gets its 1 back
// ([Budget.Refund]), the way the AWS SDKs refund their retry quota. The first
// attempt of a call is never refused. The constant MinRetriesPerSecond × TTL
// is the reserve: it lets a client that makes few calls still retry.
//
// Defaults: Ratio 0.2, MinRetriesPerSecond 10, TTL 10s, so a reserve of 100
// retries per window.
//
// # Why refunds
//
// A plain budget cannot serve both ends. When failures are independent, say
// each attempt fails with probability p = 0.2, a call with MaxAttempts 4
// needs p + p² + p³ = 0.248 retries on average: more than a 0.2 budget, so a
// plain budget would cut retries that were about to succeed. When the server
// is down, every retry is wasted load and the budget should be as small as
// possible.
//
// Refunds separate the two. A retry that succeeds costs nothing, so only
// failed retries spend the budget: p² + p³ + p⁴ = 0.0496 per call at p = 0.2,
// a quarter of the 0.2 deposited, and the budget never binds; 1 − p⁴ = 99.84 %
// of calls succeed, as with unbounded retries. In general the budget binds
// once p²(1 − p³)/(1 − p) > Ratio, at p ≈ 0.365 for MaxAttempts 4. In a full
// outage no retry is refunded and
//
//	attempts per call ≤ 1 + Ratio + reserve / N
//
// for N calls within one window: with the defaults 1.2 + 100/N, at most 1.25
// once N ≥ 2000 (the worst case; a bound of 4.0 with plain retries). The
// tests simulate both cases with 32 concurrent callers.
//
// # The reserve over time
//
// The reserve is not a bucket that drips: it is a constant credit in the
// window, and each retry it paid for is forgotten when it leaves the window,
// TTL after it was taken (between TTL − TTL/16 and TTL, see below). Spent in
// full at once, it comes back in full one window later. In a sustained outage
// at λ calls per second the budget allows Ratio × λ + MinRetriesPerSecond
// retries per second, so
//
//	attempts per call → 1 + Ratio + MinRetriesPerSecond / λ
//
// which is at most 1.25 with the defaults for λ ≥ 200 calls per second. A
// quieter client keeps its MinRetriesPerSecond: that is what the reserve is
// for.
//
// # Window and units
//
// The window is 16 buckets of TTL/16 (625 ms by default) on a ring. An event
// lands in the bucket of its instant and is forgotten when that bucket
// leaves the window, 16 buckets later: between TTL − TTL/16 and TTL after the
// event. Time is a parameter (now) of every method, and the first bucket
// starts at the instant given to [New]. TTL is at least [MinTTL] (16 ms).
//
// Balances are counted in integer milli-retries: a retry costs 1000 and a
// request deposits round(Ratio × 1000). A bucket's balance is an int32 that
// saturates at ±2.1 million retries, which no client reaches in one bucket.
// A bucket records its epoch modulo 2^32, so a bucket left untouched for
// exactly 2^32 bucket lengths (85 years by default, 49 days at the minimum
// TTL) would be read as current again.
//
// # Using it
//
// One Budget per client, shared by all its methods:
//
//	b.OnRequest(now)                   // once per call, before the first attempt
//	...first attempt fails with a retryable code, attempts and time remain...
//	r, ok := b.TryRetry(now)           // last check before the backoff
//	if !ok { return lastErr }          // denied: end the call with the last error
//	...backoff, attempt...
//	if attemptSucceeded { b.Refund(r) }
//
// "Succeeded" means the attempt did not fail with a retryable code: the
// server answered. A retry that is withdrawn but never sent (the call was
// cancelled during the backoff) should be refunded too.
//
// # Concurrency
//
// A Budget is safe for concurrent use and takes no locks. OnRequest is one
// compare-and-swap on the current bucket, Refund one on the bucket of its
// withdrawal; TryRetry reads the 16 buckets, and only when the budget can pay does it withdraw with one
// compare-and-swap and read again to confirm. The budget is never overdrawn:
// two callers racing for the last retry may both be refused. Nothing
// allocates.
package budget
