// Package throttle implements the retry throttling of gRFC A6
// ("retryThrottling" in a service config): one token bucket per client that
// stops retries and hedges while the client sees more failures than its
// successes pay for.
//
// # Algorithm (gRFC A6, exactly)
//
// The bucket holds token_count, which starts at MaxTokens and stays in
// [0, MaxTokens]. Across all services and methods of the client:
//
//   - every attempt that fails with a retryable status code (for hedging: a
//     non-fatal one), or that receives server pushback saying not to retry,
//     takes 1 token ([Throttle.OnFailure]); the count never goes below 0;
//   - every successful RPC adds TokenRatio ([Throttle.OnSuccess]); the count
//     never goes above MaxTokens;
//   - while token_count ≤ MaxTokens / 2, no retry is made and no further
//     hedge is sent ([Throttle.Allow], and the result of OnFailure). The
//     first attempt of a call is never throttled.
//
// Attempts that fail with any other code (such as INVALID_ARGUMENT) change
// nothing: they say the request was bad, not that the server is sick. With
// MaxTokens 10 and TokenRatio 0.1, five failures in a row stop retries; one
// success lets them resume, and from then on each further failure must be
// paid for by ten successes: retries continue only while failures stay under
// about 10 % of successes.
//
// # Units
//
// gRFC A6 supports three decimal places in tokenRatio, so the bucket counts
// integer milli-tokens: TokenRatio and MaxTokens are used to three decimals
// (further digits are ignored; a positive TokenRatio under 0.001, which A6
// allows, adds 0.001 rather than nothing), and the arithmetic is exact. A float count drifts, and at the threshold the drift
// decides: with MaxTokens 10 and TokenRatio 0.2, ten successes after the
// count fell to 3 give 5.000000000000002 in float64, which would allow a
// retry, where A6's count is exactly 5 and throttles it.
//
// # Concurrency
//
// A Throttle is safe for concurrent use. The count is one atomic integer
// updated by compare-and-swap: no locks, no allocation. OnSuccess on a full
// bucket, the common case, is a single atomic load.
//
// See https://github.com/grpc/proposal/blob/master/A6-client-retries.md#throttling-retry-attempts-and-hedged-rpcs.
package throttle
