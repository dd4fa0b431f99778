// Package interceptor is the client side of grpc-resilience: gRPC client
// interceptors that make service-to-service calls survive failure. A
// Client retries the way gRFC A6 describes, per method, with hedging,
// circuit breakers, bulkheads, deadline budgets and retry budgets, and
// attaches idempotency keys so that a call with side effects is safe to
// retry. Go code and a service-config JSON document drive the same
// behaviour (package serviceconfig).
//
// The server side is package interceptor/server (server.New: idempotency,
// overload protection, deadline headroom); what both sides agree on over
// the wire (the idempotency-key and criticality metadata, the
// caller-retries mark) is package interceptor/wire. Neither side imports
// the other: a Client calls any gRPC server, and honours what a server of
// package interceptor/server tells it (pushback, replays, criticality).
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
// (serviceconfig.Config.Lookup); entries of different levels are not merged.
// Calls then read it without locks. UpdateServiceConfig swaps the whole
// configuration atomically; calls in flight finish under the configuration
// they started with. A method's breaker, bulkhead and latency estimate are
// its own (see Bounded state), and stay the same objects across updates
// while its entry keeps their block: a breaker whose block changed takes
// the new settings in place and keeps what it was doing (a forced state
// stays; an open period ends when it would have, at most the new block's
// maxOpenDuration after the update; its counts start afresh), so an
// operator's ForceOpen is never lost to a concurrent update. A bulkhead
// whose block changed stays, with the new limits, so they count the
// attempts already in flight and queued (Statuses and the gauges too), and
// admit the later attempts of calls begun before the update: a raised
// maxConcurrent lets queued attempts in at once; a lowered one stops no
// attempt in flight and admits none until fewer than it are in flight;
// under a lowered maxQueue the attempts queued keep their places and new
// ones are refused until fewer than it wait; a new maxQueueWait bounds the
// waits that begin after the update. A bulkhead block removed drops the
// bulkhead (its attempts in flight still release into it, and its queued
// attempts go at once); one added again takes it back, so that its limits
// count the attempts in flight since before the removal. WrapResolver
// passes the service config a resolver delivers (DNS TXT records, a control
// plane) to UpdateServiceConfig; the resolver's config then wins over the
// one given to NewClient, which stays the default (see WrapResolver).
//
// # Settings
//
// NewClient takes ClientOptions; the ones a user reaches for first:
//
//	WithRetryPolicy(p, names...)     retry the methods or services named (none: every method) with p
//	WithMethodConfig(entries...)     per method or service: retry or hedging policy, timeout,
//	                                 circuitBreaker, bulkhead, rateLimit (serviceconfig.MethodConfig)
//	WithServiceConfig(cfg)           a whole service config, as serviceconfig.Parse reads its JSON
//	WithRetryBudget(b)               the retry budget (on by default; nil turns it off)
//	WithIdempotencyKeys(names...)    a key per logical call, so calls with side effects are safe to retry
//	WithMeterProvider(mp)            OpenTelemetry metrics (the table under Metrics)
//	WithOnRetry, WithOnStop, WithOnStateChange   hooks
//
// and per call, as grpc.CallOptions: MaxAttempts(n), NoRetry(),
// PerAttemptTimeout(d). A circuit breaker is a block of a method's config:
//
//	interceptor.WithMethodConfig(serviceconfig.MethodConfig{
//		Name:           []serviceconfig.Name{{Service: "shop.Orders"}},
//		RetryPolicy:    &serviceconfig.RetryPolicy{MaxAttempts: 4},
//		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5},
//	})
//
// Every option, what it defaults to and what it costs, is on its own doc
// comment; they are all in options.go, the client's one page of settings.
//
// # Checked configuration
//
// NewClient and UpdateServiceConfig check a configuration when it is given,
// never on a call, and refuse a setting that cannot be right, naming where
// it was written: the option and the Go fields for a policy written in Go,
// the JSON path for a parsed document:
//
//	interceptor: WithRetryPolicy: InitialBackoff: must not be negative
//	interceptor: WithMethodConfig: entry 0: has no Name, so it applies to no method: ...
//	interceptor: WithRetryPolicy("Echo"): "Echo" is not a registered service but the name of a method: "/resilience.echo.v1.EchoService/Echo"
//	interceptor: WithServiceConfig: methodConfig[0].name[0]: service shop.v1.Orders has no method "Pya" (did you mean "Pay"?)
//
// Refused: an entry built in Go without a Name (it applies to no method;
// Name: []serviceconfig.Name{{}} is the default of every method); a method
// that its service, as linked into the program, does not have; a method's
// name given as a service; a hedgingPolicy on an entry naming a streaming
// method (a stream is never hedged: it runs one attempt), and
// WithIdempotencyKeys or WithFallback naming one (keys and fallbacks apply
// to unary calls). The linked-in services are those the program's
// generated code registers with protoregistry.GlobalFiles. Logged, once,
// naming the streams: a hedgingPolicy on an entry that covers streaming
// methods by their service's name or the default name [{}] (they run one
// attempt, without retries; a stream the registry does not describe is
// logged at its first call), and WithIdempotencyKeys or WithFallback naming
// a service with streaming methods (they get no key, no fallback). A service that
// is not registered may still be called without generated code, so its
// name is only logged, once, as are the warnings of a parsed config
// (serviceconfig.Config.Warnings), through WithLogger's logger or
// slog.Default(). serviceconfig.Parse itself refuses a typo that
// changes which methods a policy covers ({"services": ...} in a name);
// WrapResolver reads a resolver's config as grpc-go does
// (serviceconfig.Lenient) and applies what grpc-go would apply, logging
// each such problem once instead of refusing it.
//
// # One call, and the order of the policies
//
// The policies wrap each other in one fixed order, outermost first: the
// method's timeout, then the retry loop, then per attempt the retry budget
// and A6 throttling (before a retry), the rate limit, the circuit breaker,
// the bulkhead, and the per-attempt timeout around the invoker.
//
//	caller ─► UnaryClientInterceptor
//	           1. resolve the method's policy; apply call options; attach an
//	              idempotency key when the method gets one
//	           2. deadline = min(caller's, the method's timeout)
//	           3. loop over attempts:
//	                no time left for an attempt? ───────────► stop (DEADLINE_EXCEEDED
//	                                                            if none ran)
//	                rate limit: token and pace slot within
//	                    maxWait and the deadline? ── no ────► ErrRateLimited (RESOURCE_EXHAUSTED)
//	                circuit breaker admits? ── no ──────────► ErrCircuitOpen (UNAVAILABLE)
//	                bulkhead slot within maxQueueWait? ─ no ► ErrBulkheadFull (RESOURCE_EXHAUSTED)
//	                invoker(...) with grpc-previous-rpc-attempts on retries,
//	                    under min(per-attempt timeout, remaining − headroom)
//	                outcome → breaker, latency estimate, throttle, metrics
//	                success? ───────────────────────────────► return
//	                caller cancelled or deadline passed? ───► stop
//	                code not retryable? ────────────────────► stop
//	                server pushback says no? ───────────────► stop
//	                A6 throttling withholds retries? ───────► stop
//	                attempts exhausted? ────────────────────► stop
//	                delay = pushback (capped; on a paced method, until the
//	                    retry's slot) or backoff with jitter
//	                delay + expected attempt ends past the deadline? ► stop now
//	                retry budget spent? ────────────────────► stop
//	                OnRetry hook; wait (ends early if ctx is cancelled)
//	           4. on stop: the last attempt's error, code intact, as a
//	              *RetryError that says how many attempts ran and why
//
// Local rejections (rate limited, open breaker, full bulkhead) end the call
// at once: they are never retried and never count as failures of the
// method. A call waiting in backoff, or for its rate limit's token, holds no
// bulkhead slot and no breaker probe.
//
// # Rate limits and pacing
//
// A rateLimit block (serviceconfig.ClientRateLimit) gives each method it
// selects a gate of its own, before the breaker and the bulkhead. After an
// attempt that the server refused with RESOURCE_EXHAUSTED and a wait (a
// google.rpc.RetryInfo detail or the grpc-retry-pushback-ms trailer, capped
// by WithMaxServerPushback), the method's attempts go one per that wait
// (the longest asked since the pacing began), each in a slot of its own;
// each admitted attempt halves the spacing, and the pacing ends under a
// millisecond. So a method at its server's limit sends about one doomed
// attempt per pushback period, where a plain retry loop sends one per
// call, and one whose server recovered is at full speed again within about
// twice the last wait. A retry of the refused call takes its slot when it
// decides to wait, and waits for it (within the deadline and the retry
// budget). With a rate, the block also limits the attempts the client
// sends (GCRA: rate per period, bursts of burst; retries and hedged copies
// count), to protect a downstream or a paid quota. An attempt waits for
// its token and slot up to the block's maxWait (0: none), and never starts
// a wait that its deadline cannot cover; otherwise it fails at once with a
// *RejectedError, ErrRateLimited, RESOURCE_EXHAUSTED with a RetryInfo
// saying when it could go. An attempt whose caller gives up while it waits
// gives its token and slot back. Hedged copies after the first never wait.
// The pace is per method, not per tenant: a server that limits each tenant
// paces every tenant's calls of the method through this client.
// MethodStatus.RateLimit shows the attempts waiting and the pace in force;
// local refusals are counted as rejections with reason rate_limited.
// Allocations: none for a call under the rate with nothing paced; a wait
// costs a timer.
//
// # Commit, and what is never retried
//
// An attempt whose response headers arrived is committed (gRFC A6): its
// failure is final and reaches the caller as a *RetryError with reason
// StopCommitted, so a handler that answered and then failed is never run
// again. A unary request whose message, with gRPC's 5-byte prefix, is larger
// than the replay buffer (WithStreamReplayBuffer) commits its attempt as it
// is sent, as grpc-go's per-call retry buffer does: its failure is final
// (StopCommitted). Unary calls and streams count one way: each message as
// the call's codec encodes it (proto.Size for a proto message under the
// default codec; any other message, or any under a codec a call option
// chose, encoded by that codec to be measured), plus the prefix; a message
// no codec can encode counts as past the bound. grpc-go counts compressed
// messages at their compressed size, the client before compression.
// grpc-go's own statuses for a message it could not send or receive
// (larger than a MaxCallSendMsgSize or MaxCallRecvMsgSize, or not
// marshalled, unmarshalled, compressed or decompressed) are never retried
// and never count against the breaker: they say nothing of the server's
// health, and a retry would meet them again.
//
// # What is retried
//
// MaxAttempts counts every attempt, the first call included, and is capped
// once, by where the policy came from: a config from serviceconfig.Parse at
// Parse's cap (5 unless serviceconfig.WithMaxAttemptsCap raises it), which
// the client honours; call options at the client's (5 unless
// WithMaxAttemptsCap raises it). A policy built in Go that asks for more
// than the client's cap is refused by NewClient (and UpdateServiceConfig)
// with an error naming WithMaxAttemptsCap, never lowered in silence.
// Without an explicit
// RetryableStatusCodes list, UNAVAILABLE and RESOURCE_EXHAUSTED are retried;
// DEADLINE_EXCEEDED when the attempt's own timeout fired
// (PerAttemptRecvTimeout), never when the caller's deadline passed; ABORTED,
// and a server's DEADLINE_EXCEEDED, only for idempotent calls: methods whose
// proto declares idempotency_level IDEMPOTENT or NO_SIDE_EFFECTS, methods
// named by WithIdempotentMethods, and calls that carry an idempotency key.
// An explicit list is honoured exactly as written.
//
// A server may steer retries (gRFC A6): a grpc-retry-pushback-ms trailer of
// n ≥ 0 means retry after exactly n ms and restart the backoff; a negative,
// malformed or repeated value means do not retry (a handler under package
// interceptor/server writes it with server.SetRetryPushback; its overload
// protection sends it with every call it sheds). A google.rpc.RetryInfo status detail is honoured the same way. Every
// hint is capped by WithMaxServerPushback.
//
// # Where the client differs from grpc-go's built-in retry
//
// Given a service config with gRFC A6 fields only and the retry budget off
// (WithRetryBudget(nil)), the client retries as grpc-go's built-in retry
// does: the same attempts, grpc-previous-rpc-attempts, final codes,
// responses, headers and trailers, and the same A6 throttle accounting. A
// differential test in this package runs both against the same scripted
// servers and compares, call by call, what the
// server and the caller saw and the A6 throttle's token count. The
// differences are intended:
//
//   - A stream's Context() does not commit its attempt. gRFC A6 commits an
//     attempt when a response header or message arrives, or when the
//     messages sent outgrow the replay buffer; grpc-go also commits when
//     the caller asks for the stream's context, after which a failure it
//     could have retried is final.
//   - The A6 throttle counts in exact thousandths of a token (A6: "up to 3
//     decimal places are supported"); grpc-go's float64 count drifts over
//     many calls, and at the threshold the drift decides whether a retry
//     is allowed (see package serviceconfig for tokenRatio under 0.001).
//   - The caller's own DEADLINE_EXCEEDED is never retried, even when the
//     policy lists the code (it is charged to the throttle all the same,
//     on streams too, where grpc-go charges it only if its retry code wins
//     a race with the stream's context watcher); a retry that cannot finish before the deadline is not started, where
//     grpc-go waits out the backoff and fails with DEADLINE_EXCEEDED.
//   - A server's google.rpc.RetryInfo detail is honoured like a pushback;
//     grpc-go reads the trailer only.
//
// # Hedging
//
// A hedgingPolicy sends copies of a unary call without waiting for the
// first to fail (gRFC A6): the first at once, another after each
// HedgingDelay without an answer, another at once after each failure with a
// non-fatal code, up to MaxAttempts copies. The first success wins and
// cancels the rest; a fatal code ends the call, and so does any outcome of a
// copy that received response headers (A6 commits the call to it). Each copy
// after the first is a retry for the budget, throttling and the deadline,
// and carries the call's idempotency key. Copies get their own reply,
// header, trailer and peer; the caller's grpc.Header, grpc.Trailer and
// grpc.Peer options receive those of the copy the call returns. A panic
// below the interceptor in a copy panics again in the caller's goroutine.
// Every copy goes through the method's breaker and bulkhead; a copy that
// must wait in the bulkhead's queue waits on its own goroutine, so a
// sibling's answer ends the call at once. PerAttemptTimeout (and
// WithDeadlineHeadroom) bound every copy; a copy cut by its own timeout is
// a non-fatal failure, and the next copy goes out at once. A pushback after
// which no copy could follow (none left, or its wait past the deadline)
// ends the call as soon as nothing runs, with the server's status. Only
// proto messages are hedged (copies clone the request and make their own
// reply); a call of a hedged method with other messages, and a stream, runs
// one attempt through the guards.
//
// A limit, and why: gRFC A6 commits a hedged call to the copy that received
// the server's response headers, at once. grpc-go hands a unary call's
// headers to its caller only when the call returns (grpc.Header is filled
// then; no call option, and nothing an interceptor can install per call,
// tells of their arrival earlier, short of a stats handler on every call of
// the connection, which would cost every call its allocations), so the
// client commits when that copy ends: until then the other copies run, and
// the delay may send more, up to MaxAttempts (headers sent at once, an
// answer at 300 ms, a 50 ms delay and 3 attempts: 3 copies, as a test of
// this package pins). The committed copy's
// outcome then decides the call, as A6 says, a failure included
// (StopCommitted).
//
// # What a hedge may spend
//
// One rule: a copy goes to a call when it has run for the method's hedging
// delay, and the delay is the longest of the policy's and of the latency
// that the share s of calls outlasts, where s is the policy's share (1 −
// HedgingDelayQuantile; every call past HedgingDelay for a fixed one) and
// at most three quarters of the share b of calls the retry budget pays a
// retry for (Ratio + MinRetriesPerSecond ÷ the calls per second that
// deposit in it, those of the client's methods under a retry or hedging
// policy; the last quarter is left for retries): the hedges the budget affords go
// to the slowest calls. Where that latency falls past a gap into a cluster
// of slow calls (a slow backend, a cache miss) no bigger than twice the
// policy's share and than b, the delay is the gap's fast edge (at most
// 1.25× the latency that share outlasts), so the cluster is hedged whole
// rather than its own tail. Each copy after the first takes a budget token,
// as a retry does, and goes only while gRFC A6 throttling allows it (A6
// first, as A6 specifies for hedging); a timed copy the budget or A6
// refuses is not sent and the call goes on, and a copy after a non-fatal
// failure is A6's retry: it goes when they allow it, whatever became of the
// timed ones; a call that ends for want of a copy says which refused it
// (StopBudget, StopThrottled). The latency is read from a histogram of the
// method's last 256 to 512 copies (eight logarithmic buckets per octave,
// rounded up to the bucket: at most 12.5 % above), where a copy that a
// sibling's answer cut off counts as at least as long as it ran, once past
// the delay; it carries over config updates. When the latency moves up
// past the delay (12 of the 16 copies since the last recompute at or above
// it), the histogram restarts from the last 16 copies, so the delay
// follows within a few calls instead of hedging every call until the old
// copies are a small enough share; when the latency then comes back below
// the delay it left (12 of 16 copies: the move was a burst of slow calls,
// or the drift is over), it restarts again from those of the last 16
// copies below it. Until HedgingDelayMinSamples copies were observed (100
// by default; 32 for a fixed delay) the call waits HedgingDelay, or,
// without one, sends further copies only after non-fatal failures. Client.HedgingDelay reports the delay in force; a
// call reads it in one or two atomic loads, and it is recomputed every 16
// copies (hedge_delay.go).
//
// What hedging can and cannot do under a budget follows: it can lower the
// latency of the calls above the (1 − s)-quantile to about the delay plus
// a fast call's, so the p99 drops when the slow calls are fewer than the
// budget pays for; when more calls are slow, the delay stays above them
// (hedging a part of them, picked at random by the budget's refusals,
// would spend the budget for nothing), and if they are more than 1% of the
// calls, the p99 stays where it was. With one backend of three 50×
// slower, fixed 5ms delay and the default budget, on fake time (a test of
// this package runs it): at 40 calls a
// second the budget pays for 45% of the calls, more than the slow third,
// and the p99 drops to 0.04× the unhedged for 33% extra attempts; at 400 a
// second it pays for 22.5%, less than the slow third, and the delay stays
// above the slow calls once the budget's share shows it (18.5% extra
// attempts, spent in the run's first seconds): the p99 stays at 1.00×. On
// a model of bench/'s slow tail that triples (a test of this package runs
// it), the adaptive p95 keeps the p99 at 0.14× the unhedged for 6.0% extra
// attempts, and a fixed 5ms delay, below every call of the second half, at
// 0.12× for 12.8%: three quarters of the budget's share over that half. bench/ measures both in
// real time (the slow-backend and drift scenarios, BENCHMARKS.md).
//
// # Another endpoint for each retry and hedge
//
// On a channel whose load-balancing policy is the one of package
// interceptor/endpoint (resilience_endpoint, selected in the service
// config's loadBalancingConfig), every attempt of a call that may send more
// than one (first attempt included) carries in its context the call's
// trail, in which the policy records the endpoint it picks: it sends each
// retry and hedged copy to an endpoint the call has not used, whatever
// address the connection reports, and ejects failing endpoints. The trail
// is one allocation per such call, on such channels only; the Client also
// marks there when its own per-attempt timeout, not the caller's deadline,
// ended an attempt, which the policy counts against the endpoint.
//
// # Deadlines and retry storms
//
// A call never waits past its deadline, and never starts an attempt it
// cannot finish: a retry starts only if its delay plus the method's expected
// attempt duration (a running p90 of its recent attempts, never below
// WithAttemptEstimateFloor) ends before the deadline minus
// WithDeadlineHeadroom; otherwise the call ends at once with the last
// attempt's error. The first attempt always starts while any time is left.
// A method whose config says "timeout": "0s" (which gRFC A6 leaves
// undefined; package serviceconfig keeps it as 1ns) fails every call at
// once with DEADLINE_EXCEEDED, before any attempt, as grpc-go does.
//
// The retry budget (on by default; the serviceconfig.RetryBudget block or
// WithRetryBudget) lets retries be at most 20% of requests over 10 seconds,
// plus 10 per second, shared by all methods (the requests are the calls
// that may be retried or hedged: under a policy of more than one attempt); a retry that succeeds is
// refunded, so independent failures are retried freely while a full outage
// costs about 1.2 attempts per call instead of MaxAttempts. A hedged copy
// after the first is never refunded once sent, won or cancelled: it was
// extra load, so the budget bounds hedging too (see What a hedge may
// spend). A block with ratio and minRetriesPerSecond both written out as 0
// is a zero budget, an incident's kill switch: no call is retried and no
// copy sent after the first (serviceconfig.RetryBudget.Zero). gRFC A6
// retryThrottling runs exactly as A6 specifies when the config has it, and
// counts what grpc-go counts: every successful call on the client, and every
// uncommitted attempt that fails with a code its method's retry policy lists
// (the caller's own DEADLINE_EXCEEDED included, though it is never retried)
// or whose server pushback says not to retry, whatever its code and whether
// or not the method has a retry policy.
// WithOneLayerRetry keeps retries from multiplying across hops: a client
// marks the calls it retries (wire.CallerRetriesKey), the interceptors of
// package interceptor/server mark the handler's context
// (wire.ContextWithCallerRetries does it for other servers), and a client
// used in that handler does not retry.
//
// # Circuit breakers and bulkheads
//
// A circuitBreaker block gives each method it selects a breaker of its own:
// it trips on consecutive failures, on a failure rate or on a slow-call rate
// over a rolling window, stays open for an open duration that grows on
// repeated trips, and closes after successful probes. Failures are the codes
// of codes.DefaultBreakerFailures unless the block says otherwise; a
// caller's own cancellation and client errors never count. A bulkhead block
// bounds each method's attempts in flight and waiting. Health checks and
// reflection are exempt (WithExemptMethods); WithFallback answers rejected
// unary calls. Status, Statuses, ForceOpen, ForceClosed and ResetBreaker are
// for operators; WithOnStateChange reports transitions.
//
// A rejection is built once per method and shared by the calls it rejects:
// a rejected call allocates nothing and takes no lock, even with the
// caller's status.Code of its error, and its RetryInfo hint (the time until
// the next probe) is rounded up to 10ms. A call rejected before its first
// attempt returns the *RejectedError (inside a *RetryError with 0 attempts
// when a retry policy applies); do not modify it. While a half-open probe is
// out, a rejected caller yields its processor before it returns, so that
// callers retrying in a closed loop cannot starve the probe; a probe that
// fails reopens the breaker for the open time counted from the probe's
// start, and a probe that never reports (its caller hung) is deemed lost
// after one open time.
//
// A circuitBreaker block with "mode": "adaptive" is the SRE book's
// client-side adaptive throttling instead (see serviceconfig.CircuitBreaker):
// no states, but each attempt is rejected locally (ErrCircuitOpen, without
// a hint) with a probability that settles where the client sends K times
// what the backend accepts, at most 0.9. Only the backend's answers move
// it: a RESOURCE_EXHAUSTED or UNAVAILABLE up, any other outcome down, by
// steps of 0.02/K and 0.02·(1 − 1/K); the client's own rejections, the
// caller's cancellations, a CANCELLED (a call cut on the client: its
// connection closed, a hedged copy's sibling answered) and attempts the
// method's other guards refused (a full bulkhead) move nothing. So it sheds 90% of an outage within about 90
// refusals and lets go within about 90 acceptances after it, whatever small
// error rate remains: at 1,000 calls a second over gRPC, 10 successes in a
// row 0.21 s after a 1.5 s outage, 92% of the calls after it succeeding (90%
// with 1% still refused; a test of this package pins it), where the SRE
// book's formula, which counts local rejections as requests with no accept,
// let 17% through and never 10 in a row (see package internal/adaptive).
// Such a rejection stops the call as
// StopAdaptiveThrottle and counts in resilience.client.rejections with
// reason adaptive_throttle; MethodStatus.Adaptive shows its counts, and
// resilience.client.adaptive.reject_probability the probability.
//
// # Streams
//
// Client, server and bidirectional streams are retried until they commit: an
// attempt commits when a response header or message arrives, or when the
// messages sent on it outgrow the replay buffer (WithStreamReplayBuffer, 256
// KiB by default; a message counts its size plus grpc's 5-byte prefix).
// Until then the messages the caller sent are kept and replayed on each new
// attempt; after it, errors reach the caller unchanged, so no response is
// ever seen twice. Header waits for the attempt that answers. A stream holds
// its bulkhead slot and breaker probe for its lifetime, which ends however
// grpc ends a stream: the final error or io.EOF from RecvMsg, a non-EOF
// error from SendMsg or Header, the caller's context, ClientConn.Close, or a
// panic below the interceptor; it never counts as slow. An idempotency key
// does not widen the codes a stream retries. Unlike grpc-go, calling the
// stream's Context does not commit it: gRFC A6 commits on headers, a
// message or the replay bound only.
//
// # Idempotency
//
// WithIdempotencyKeys and WithAutomaticIdempotencyKeys attach one random key
// (metadata idempotency-key, wire.IdempotencyKeyHeader) to every attempt of
// a logical unary call; ContextWithIdempotencyKey supplies the caller's
// own, which goes on streams too. A stream gets no key of the client's
// making: a server's idempotency applies to unary calls only. A
// keyed call is retried as an idempotent one (ABORTED and DEADLINE_EXCEEDED
// too, under the default codes), since a server with idempotency runs it
// once per key: package interceptor/server (server.WithIdempotency)
// executes a keyed call once per caller scope, replays its stored outcome
// to duplicates byte for byte and coalesces concurrent duplicates; its
// package documentation and package interceptor/idempotency tell the
// server's side. Every answer the server did not run the handler for
// carries the response header idempotency-replayed: true
// (wire.IdempotencyReplayedHeader), which wire.IdempotencyReplayed reads
// from a call's grpc.Header; a client with WithMeterProvider counts such
// attempts (resilience.client.idempotency.replays).
//
// # Criticality, and a server under overload
//
// A caller sets the criticality of its calls with
// wire.ContextWithCriticality (metadata wire.CriticalityKey: CRITICAL_PLUS,
// CRITICAL, the default, SHEDDABLE_PLUS or SHEDDABLE); a server under
// overload protection (package interceptor/server, server.WithLimits) sheds
// the least critical first. A Client sends every retry and hedged copy as
// SHEDDABLE_PLUS at most (the server takes the lowest value it gets), so
// that a retry never displaces a first attempt. A server that sheds answers
// RESOURCE_EXHAUSTED with a google.rpc.RetryInfo detail and a
// grpc-retry-pushback-ms trailer saying when to come back, and says not to
// retry (-1) once it sheds as much as it admits: the Client honours both
// (see What is retried), so retrying clients do not amplify an overload.
//
// # Observability
//
// Hooks (WithOnRetry, WithOnStop, WithOnStateChange, WithFallback) run
// outside every lock of the client's, after what they report is published,
// so a hook may call any method of the Client (UpdateServiceConfig,
// ForceOpen, a call through its interceptors;
// a test of this package calls every one from every hook, and from the
// meter provider's instruments). OnRetry, OnStop and a
// fallback run on the goroutine of the call they are about. The breaker
// transitions of one method reach WithOnStateChange one at a time, in the
// order they happened (each from is the last to), once Status shows them:
// reported by the goroutine whose call made a transition and found none
// being reported, which reports those made meanwhile too (a hook's own
// ForceOpen is reported after that hook returns). Reading a breaker
// (Status, Statuses, the gauges) changes nothing and reports nothing: an
// open breaker whose open time has passed reads as half-open, and turns so
// on its next call. The gauges' callback runs no hook and takes no lock of
// the client's.
// WithMeterProvider records attempts, retries, stops by reason, breaker
// state changes and the retry budget through the OpenTelemetry metric API.
//
// # Lifecycle of the guards
//
// Every attempt's bulkhead slot and breaker token are released exactly once,
// on every way the attempt ends: an outcome, the caller's cancellation, the
// connection closed, an error from SendMsg or Header on a stream, and a
// panic below the interceptor (then as if cancelled, and the panic goes on
// up). Copies of a hedged call, and stream attempts still running when the
// call ends, release their own. A hook that panics or calls runtime.Goexit
// on the call's goroutine (OnRetry before a retry, OnStateChange as an
// attempt's admission turns a breaker half-open) ends the call with that
// attempt unsent: its breaker probe, its slot of the method's pace and its
// retry budget token go back, and the panic goes on up. One that aborts
// after an attempt that succeeded (OnStateChange as its success closes a
// half-open breaker, the meter provider as the attempt is counted) ends a
// call settled as a success: its retry's budget token goes back and A6
// throttling counts the success (a unary call's failure is settled as its
// retry loop settles a failure before deciding). A hook's panic on
// a goroutine of the client's own (OnStateChange on the verdict of a
// stream attempt that the watch on its context released, with no call of
// the caller's at work on it) goes to the caller's next call on the
// stream, which panics with it and ends the stream; it never ends the
// process.
//
// # Bounded state
//
// A Client keeps what the calls of a method build up (breaker, bulkhead,
// rate limit, latency estimate, hedging window) in one table, one row per
// method, apart from the per-config policies; methods.go states the
// table's invariants, which a test of this package checks after each of
// 12,000 random steps against a reference model. A method has a row while
// its entry gives it state: a circuitBreaker, bulkhead or rateLimit block
// (not exempt), a retryPolicy or a hedgingPolicy. A method no entry
// applies to, or whose entry has none of these, holds nothing and counts
// nothing, whatever the number of names a proxy forwards. The methods the
// config names exactly and those its generated stubs call
// (grpc.StaticMethod) always have their row. The others, named by the
// callers (a proxy's, an admin page's ForceOpen), count against a bound of
// 1024 per entry that applies to them (a service's, the default): past it,
// a new method takes the row of one that is idle (nothing in its bulkhead,
// its breaker closed with no failure counted, its adaptive throttle
// refusing nothing, its rate limit's bucket full and no server pushback
// pacing it, and not called since the entry's clock hand last passed);
// when none is, the method runs untracked, its calls under its entry's
// policy with no breaker, bulkhead or rate limit (once per update, a
// warning says so), and ForceOpen on it returns an error saying why. A
// method is never merged into a state shared with others: a method's
// breaker opens on its own failures alone. Status and HedgingDelay keep
// nothing for a method no call has resolved.
//
// An update keeps every row whose method still has state: the pinned ones
// (named exactly, or called by a stub), then, within each entry's bound,
// the others, those live (a breaker not closed or with failures counted, a
// bulkhead in use) first, then the oldest. A row let go takes its state
// with it (a forced-open breaker included), but for a bulkhead that
// attempts still hold, kept until they end so that a block added again
// counts them. So a control plane whose every push names new methods keeps
// the rows its config names now: 3000 such updates keep 1 method and take
// 40 ms, where they once kept 3000 and took 6 s (a test of this package
// pins it). An update costs a
// resolution per method the new config names, per method a stub called and
// per row, about 1–2 µs each. With metrics on, a row costs about 2 KiB;
// 100,000 invented names keep about 2 MiB (measured by a test of this
// package).
//
// # Concurrency and cost
//
// Clients are safe for concurrent use. A successful call
// allocates nothing in the client interceptor, with every feature on, and
// neither does a call an open breaker rejects. A whole unary call through
// the client costs 4 allocations more than a bare one, grpc's copies of the
// header and trailer a retry needs (pinned exactly by a test); a call
// without grpc.StaticMethod (a hand-written Invoke, a proxy) costs the
// interceptor the same, but shows 5 against a bare Invoke without options:
// grpc-go allocates a slice for every call that has options (its
// newClientStream prepends its own), which a stub's call always pays and
// the client's calls always have (pinned exactly too).
//
// # Metrics
//
// WithMeterProvider records through the OpenTelemetry metric API, in the
// instrumentation scope "github.com/grpc-resilience/resilience/interceptor"
// (which the server of package interceptor/server shares: its
// resilience.server.* instruments are tabled in its package
// documentation). Without it nothing is recorded, at no cost; with the
// no-op provider, or the SDK's, a call allocates no more than without
// (attribute sets are built once per method, and per target for
// grpc.target). The gauges are read by a callback that the provider holds
// until Client.Close: close a Client that another replaces (per tenant, per
// configuration reload), or the provider keeps it, and reads it, for as
// long as the provider lives.
//
// The grpc.client.call.* instruments are gRFC A96's, with its names, units
// and attributes, recorded once per call that ran the retry or hedging loop
// (a method with any policy): retries and hedges only when not 0, as A96
// says, retry_delay for every such call, as grpc-java does. grpc.method and grpc.target are gRFC A66's:
// the full method without its leading slash, or "other" for a call without
// grpc.StaticMethod (not made by a generated stub); the connection's
// canonical target. grpc.client.call.transparent_retries is not recorded:
// transparent retries happen inside grpc, below the interceptors, where
// grpc's own OpenTelemetry plugin sees them. Everything else is this
// library's, under the one prefix "resilience.", with grpc.method and
// grpc.status (the code's name, as in A66). grpc.method follows the same
// rule on every instrument: per call, the method for a generated stub's
// call and "other" for the rest; on the gauges and breaker transitions,
// which are per method, the method once a generated stub called it or
// while a config entry names it exactly, and "other" for the rest, reported
// together (bulkhead occupancy summed, the highest rejection probability,
// the breaker state that refuses most: forced open, open, half-open,
// closed). Label values are thus bounded by the code and the config, never
// by what callers send.
//
//	name                                          kind            unit          attributes
//	grpc.client.call.retries                      histogram       {retry}       grpc.method, grpc.target; 0 not recorded
//	grpc.client.call.hedges                       histogram       {hedge}       grpc.method, grpc.target; 0 not recorded
//	grpc.client.call.retry_delay                  histogram       s             grpc.method, grpc.target: time with no attempt running
//	resilience.client.attempts                    counter         {attempt}     grpc.method, grpc.status
//	resilience.client.retries                     counter         {retry}       grpc.method: retries decided (before the backoff) and hedged copies launched
//	resilience.client.stops                       counter         {call}        grpc.method, resilience.stop_reason
//	resilience.client.rejections                  counter         {attempt}     grpc.method, resilience.reason (circuit_open, bulkhead_full, adaptive_throttle, rate_limited)
//	resilience.client.retry.denials               counter         {retry}       grpc.method, resilience.reason (budget, throttled)
//	resilience.client.retry.deadline_skips        counter         {retry}       grpc.method: retries and hedges that would not fit the deadline
//	resilience.client.idempotency.replays         counter         {attempt}     grpc.method: attempts answered by a server's replay (idempotency-replayed)
//	resilience.client.breaker.transitions         counter         {transition}  grpc.method, resilience.breaker.from, resilience.breaker.to
//	resilience.client.breaker.state               gauge           {state}       grpc.method: 0 closed, 1 open, 2 half-open, 3 forced open, 4 forced closed
//	resilience.client.bulkhead.in_flight          gauge           {attempt}     grpc.method
//	resilience.client.bulkhead.queued             gauge           {attempt}     grpc.method
//	resilience.client.adaptive.reject_probability gauge           1             grpc.method: adaptive throttling's rejection probability now
//	resilience.client.retry_budget.available      gauge           {retry}       (none)
//
// Bulkhead rejections are resilience.client.rejections with reason
// bulkhead_full. Before this table, the client's metrics carried
// rpc.method and rpc.grpc.status_code, and breaker transitions were named
// resilience.client.breaker.state_changes.
//
// # Tracing
//
// The client adds events to the span of the context a call is made with
// (trace.SpanFromContext), only while that span records: without one,
// nothing is added and nothing allocated. The events sit beside otelgrpc's
// or grpc's own per-attempt client spans (a stats handler runs below the
// interceptors, so its spans are children of the caller's, one per
// attempt). A server of package interceptor/server adds
// resilience.idempotency.replay to its handler's span.
//
//	event                          attributes
//	resilience.retry               resilience.attempt (the attempt that failed), rpc.grpc.status_code,
//	                               resilience.delay (seconds), resilience.pushback
//	resilience.hedge               resilience.attempt (the copy's number, 2 for the first hedge), resilience.delay
//	resilience.rejected            resilience.attempt (the attempt refused), resilience.reason (circuit_open, bulkhead_full, rate_limited)
//	resilience.retry.stop          resilience.attempt (attempts run), rpc.grpc.status_code, resilience.reason (a stop reason)
//
// # Where things are
//
// client.go (Client, NewClient, the unary call), options.go (every
// ClientOption) and calloptions.go (per-call options), policy.go (the
// per-config policies) and methods.go (the per-method table, its bound and
// its invariants), retry.go (the retry decision), budget.go (the retry
// budget and A6 throttling), guard.go and reject.go (breakers, bulkheads
// and their rejections), status.go (MethodStatus and the operator's
// breaker controls), hedge.go (hedged unary calls) and hedge_delay.go (the
// hedging delay: what a hedge may spend), stream.go,
// stream_attempt.go and stream_retry.go (retried streams: the caller's
// methods, one attempt and its release, the transitions of the state
// machine; the attempts' trail of endpoints, attemptBase, in client.go and
// stream_attempt.go), wiresize.go (what the replay buffer counts), keys.go
// (the idempotency keys a client attaches), resolver.go (the resolver's
// service config), names.go (the names options take, the warnings' log),
// confcheck.go (the checks of a configuration as it is given), errors.go,
// metrics.go and trace.go (metrics and span events).
//
// See https://github.com/grpc/proposal/blob/master/A6-client-retries.md,
// https://github.com/grpc/proposal/blob/master/A66-otel-stats.md and
// https://github.com/grpc/proposal/blob/master/A96-retry-otel-stats.md.
package interceptor
