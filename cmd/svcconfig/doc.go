// Command svcconfig checks a gRPC service config and explains what the
// grpc-resilience client does with it, method by method.
//
// The document is the JSON platform teams hand to grpc-go (gRFC A6), with
// this module's extension blocks (perAttemptRecvTimeout, jitter,
// circuitBreaker, bulkhead, rateLimit, retryBudget). It is read with
// [serviceconfig.Parse], so the verdict is the library's, word for word.
//
// Usage:
//
//	go run ./cmd/svcconfig check [flags] FILE
//	go run ./cmd/svcconfig explain [flags] FILE /package.Service/Method
//	go run ./cmd/svcconfig server FILE [/package.Service/Method]
//
// FILE is a path, or - for standard input. Flags may come before or after
// the arguments.
//
// # check
//
// check validates the document. A valid one gets "ok" and one line per
// methodConfig entry (its names, timeout, policy and blocks), then the
// client-wide blocks. An invalid one gets the error exactly as Parse words
// it, and exit status 1:
//
//	serviceconfig: methodConfig[1].retryPolicy.maxAttempts: must be greater than 1
//
// That includes a typo that changes which methods a policy covers, which
// Parse refuses (and so a client handed the document), though grpc-go
// accepts it:
//
//	serviceconfig: methodConfig[0].name[0].services: unknown key: did you mean "service"? grpc-go ignores it, which leaves the name {}, the default entry: its policies would apply to every method
//
// With -lenient, check and explain read the document as grpc-go does, and
// as a client reads a config its resolver delivers (serviceconfig.Lenient):
// such a typo is a warning, marked "[changes which methods a policy
// covers]", the report shows what grpc-go would run (the default entry, in
// that example), an entry without a name is listed as skipped, and the
// command still exits 1.
//
// A server document (one with concurrencyLimit or tenantFairness, as
// serviceconfig.ParseServer reads it) given to check or explain, or a
// client's service config given to server, gets exit status 1 and the
// command to use instead:
//
//	svcconfig: testdata/server.json is a server document (it has "concurrencyLimit", which serviceconfig.ParseServer reads), not a client's service config: use svcconfig server testdata/server.json
//
// Warnings (below) are printed under the entry they concern.
//
// When loadBalancingConfig selects the endpoint policy (resilience_endpoint,
// package interceptor/endpoint), check and explain describe it too: the
// order of picks (round_robin, pick_first, or peak_ewma with its decay
// time and endpoint concurrency), the failures that count (and UNKNOWN's default), the local-origin
// threshold and when its ejections end, the ejection conditions and times
// with their defaults, and the strict maxEjectionPercent bound with 3
// endpoints (0: nothing ejected); A50's interval (ignored by the passive
// policy) and a percentage that ejects nothing with fewer than a few
// endpoints are warnings.
//
// # explain
//
// explain resolves one method as the client does, exact method before
// service before default entry, never merging levels, and prints:
//   - the entry that applies, its index in the document and the level it
//     matched at, and the entries it shadows;
//   - the timeout and waitForReady;
//   - the retry policy with every default filled in and marked "(default)":
//     maxAttempts (which counts every attempt, the first call included),
//     the backoffs, the jitter and its formula, the retryable status codes
//     (the client's default rules when the list is empty),
//     perAttemptRecvTimeout; or the hedging policy, with its adaptive
//     delay (hedgingDelayQuantile, hedgingDelayFloor, hedgingDelayMinSamples)
//     and the delay it uses until it has the samples;
//   - the client-wide retry limits: the retry budget (on by default in the
//     client, 0.2 of requests plus 10/s over 10s, unless the document has a
//     retryBudget block) and gRFC A6 throttling;
//   - the circuitBreaker, bulkhead and rateLimit blocks, if any, with their
//     defaults;
//   - the retry schedule: for each attempt k, the range [lo, hi] of the
//     delay before it, and the worst-case times at which it starts and ends
//     when every delay is at its longest and every attempt takes the attempt
//     time.
//
// With d(n) = min(initialBackoff × backoffMultiplier^n, maxBackoff) before
// retry n+1, the delay ranges are, per jitter:
//
//	a6            [0.8 d, 1.2 d]   gRFC A6's ±20%, the default
//	full          [0, d]
//	equal         [d/2, d]
//	decorrelated  [initialBackoff, min(3 p, maxBackoff)], where p is the
//	              previous delay (initialBackoff at first); lo follows the
//	              shortest previous delays, hi the longest
//	none          [d, d]
//
// The attempt time is -attempt-time when given, else the policy's
// perAttemptRecvTimeout, else 0, which the output says: the times then count
// the delays alone.
//
// A circuitBreaker block in mode "adaptive" is explained as client-side
// adaptive throttling: k and window with their defaults (2, 60s) and the
// rejection probability.
//
// # server
//
// server reads a server document (serviceconfig.ParseServer: the
// concurrency and rate limits of server.Limits.Config). Without a method it
// prints "ok" and one line per limit, and warns about a per-tenant rate
// limit in a document that names no tenant and about per-peer rate limits
// (behind a proxy every caller has its address); with one, the concurrency
// limit that applies (the method's own, its service's, or the server's),
// its settings with the defaults marked, the in-flight count at which each
// criticality is shed, and what a shed call receives; then every rate
// limit the call must pass (its method's, its service's, the server's),
// what it counts by and shares with, whether it is distributed and what it
// does while Redis is unreachable, the tokens each criticality leaves for
// the more critical ones, and that health checks and reflection are exempt
// from the top-level limits. An invalid document gets its error with the
// JSON path, and exit status 1.
//
// # Warnings
//
// Both commands warn, with lines starting "WARNING:", about:
//   - an attempt that cannot fit in the method's timeout in the worst case
//     (the client does not start a retry whose delay and expected duration
//     overrun the deadline, so the call ends before it);
//   - maxAttempts above the cap, which lowers it (-max-attempts-cap, like
//     serviceconfig.WithMaxAttemptsCap when the client parses the document,
//     raises the cap);
//   - maxBackoff below initialBackoff;
//   - perAttemptRecvTimeout not below the timeout;
//   - retryable codes that a retry cannot fix (INVALID_ARGUMENT, NOT_FOUND,
//     PERMISSION_DENIED, ...) or that may follow a request the server acted
//     on (UNKNOWN, INTERNAL, DATA_LOSS);
//   - a hedged copy that would be sent after the timeout;
//   - an entry whose name list is empty, which selects nothing;
//   - an unknown key in gRFC A6's own objects, which grpc-go and the client
//     ignore, with the known key it most likely misspells (serviceconfig's
//     Config.Warnings); an unknown key in our own blocks is an error, and so
//     is one that changes which methods a policy covers (a warning under
//     -lenient, which fails the command all the same);
//
// and explain also about a method with neither retryPolicy nor
// hedgingPolicy, or that no entry applies to: there is nothing to explain.
//
// # Flags
//
//	-max-attempts-cap N  the cap on maxAttempts, as WithMaxAttemptsCap; N < 2
//	                     means the default, 5
//	-attempt-time D      the longest an attempt takes, for the schedule, as
//	                     a Go duration such as 300ms
//	-strict              treat warnings as errors: exit status 1
//	-lenient             read the document as grpc-go does (serviceconfig.Lenient)
//
// # Exit status
//
// 0 when the document is valid (with warnings, unless -strict); 1 when it is
// invalid or cannot be read, has warnings under -strict, or under -lenient
// has a warning that changes which methods a policy covers, or is a
// document of the other kind; 2 on a usage error. -h prints the usage and
// exits 0.
//
// Output is deterministic: ranges are bounds, not samples. Computed times
// are rounded for reading, to the microsecond under a second and to the
// millisecond above. A schedule of more than 24 attempts shows its first 20
// and last 3 rows; one of more than 1000 stops at attempt 1000.
package main
