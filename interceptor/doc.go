// Package interceptor is the entry point of grpc-resilience: gRPC client
// interceptors that retry failed calls the way gRFC A6 describes, per method,
// driven by Go code or by a service config.
//
// # Client
//
// NewClient returns a Client; its UnaryClientInterceptor and
// StreamClientInterceptor share per-method policies and state. DialOptions
// installs both and turns off grpc's built-in retry, which would otherwise
// multiply with this one:
//
//	c, err := interceptor.NewClient(
//		interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{MaxAttempts: 4}),
//	)
//	conn, err := grpc.NewClient(target, append(c.DialOptions(), creds)...)
//
// A method's policy is resolved once, the first time it is called: the entry
// naming the exact method, else its service, else the default entry
// (serviceconfig.Config.Lookup). Calls then read it without locks.
//
// # One call
//
//	caller ─► UnaryClientInterceptor
//	           1. resolve the method's policy; apply per-call options
//	           2. deadline = min(caller's, the method's timeout)
//	           3. loop over attempts:
//	                invoker(...) with grpc-previous-rpc-attempts on retries,
//	                    under the per-attempt timeout if one is set
//	                success? ───────────────────────────────► return
//	                caller cancelled or deadline passed? ───► stop
//	                code not retryable? ────────────────────► stop
//	                server pushback says no? ───────────────► stop
//	                attempts exhausted? ────────────────────► stop
//	                delay = pushback (capped) or backoff with jitter
//	                delay ends past the deadline? ──────────► stop now
//	                OnRetry hook; wait (ends early if ctx is cancelled)
//	           4. on stop: the last attempt's error, code intact, as a
//	              *RetryError that says how many attempts ran and why
//
// # What is retried
//
// MaxAttempts counts every attempt, the first call included, and is capped
// at 5 unless WithMaxAttemptsCap raises it. Without an explicit
// RetryableStatusCodes list, UNAVAILABLE and RESOURCE_EXHAUSTED are retried;
// DEADLINE_EXCEEDED only when the attempt's own timeout fired
// (PerAttemptRecvTimeout), never when the caller's deadline passed; ABORTED
// only for idempotent methods (idempotency_level IDEMPOTENT or
// NO_SIDE_EFFECTS in the proto, or WithIdempotentMethods). An explicit list
// is honoured exactly as written.
//
// A server may steer retries (gRFC A6): a grpc-retry-pushback-ms trailer of
// n ≥ 0 means retry after exactly n ms and restart the backoff; a negative,
// malformed or repeated value means do not retry. A google.rpc.RetryInfo
// status detail is honoured the same way. Every hint is capped by
// WithMaxServerPushback.
//
// A call never waits past its deadline: when the next delay would end after
// it, the call stops at once with the last attempt's error instead of idling.
//
// # Streams
//
// Client, server and bidirectional streams are retried until they commit: an
// attempt commits when a response header or message arrives, or when the
// messages sent on it outgrow the replay buffer (WithStreamReplayBuffer, 256
// KiB by default). Until then the messages the caller sent are kept and
// replayed on each new attempt; after it, errors reach the caller unchanged,
// so no response is ever seen twice.
//
// # Concurrency
//
// A Client is safe for concurrent use. UpdateServiceConfig swaps the whole
// configuration atomically; calls in flight finish under the configuration
// they started with. Hooks run synchronously on the calling goroutine.
//
// See https://github.com/grpc/proposal/blob/master/A6-client-retries.md.
package interceptor
