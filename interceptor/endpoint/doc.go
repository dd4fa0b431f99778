// Package endpoint is a gRPC load-balancing policy, registered as
// "resilience_endpoint" when the package is imported, that sends each retry
// and hedged copy of a call to an endpoint the call has not used yet, takes
// a failing endpoint out of rotation for a while (passive outlier
// ejection), and can pick by latency (the peak_ewma child).
//
//	import _ "github.com/grpc-resilience/resilience/interceptor/endpoint"
//
//	conn, err := grpc.NewClient(target, append(client.DialOptions(),
//		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [
//			{"resilience_endpoint": {"childPolicy": [{"round_robin": {}}]}}]}`))...)
//
// # Avoiding endpoints a call has used
//
// grpc picks an endpoint for every attempt with the attempt's own context
// (balancer.PickInfo.Ctx). On a channel under this policy, the Client of
// package interceptor puts in every attempt's context of a call that may
// send more than one (a retry policy, hedging, a stream with a per-attempt
// timeout) the call's trail, and the picker records in it the endpoint it
// picks, the first attempt's included. Identity is exact: the picker's own
// endpoint, whatever address the connection reports (a host name in the
// resolver that connects to an IP, a proxy). Each pick prefers, in order:
// an endpoint neither used by the call nor ejected; one used but not
// ejected; one ejected. So a retry after a failure goes to another endpoint
// whenever another is READY, and a hedged copy never joins its sibling on
// a slow endpoint.
//
// The trail costs one allocation per unary call that may retry or is
// hedged (a stream holds its trail in its own allocation), on channels
// under this policy only (the Client asks whether the channel's policy
// reads trails). It is not pooled: grpc may read an attempt's context after
// the call has returned (a late RST_STREAM, a stats handler's late event),
// and a pooled context would then hand it another call's values. A call
// made while the channel has no policy built (its very first calls, and
// the call that wakes it from idle) carries none. Without the Client's
// interceptors (grpc's own retry), no trail exists and the policy only
// ejects and orders picks.
//
// # What counts against an endpoint
//
// Each attempt's outcome, reported by grpc when it ends (balancer.DoneInfo),
// counts toward its endpoint's ejection; the engine computes every
// transition from outcomes and the time, with no timer or goroutine:
//
//   - nothing: an attempt that sent nothing (grpc abandoned the pick as the
//     connection closed, or the client failed first, as failing per-RPC
//     credentials do); the caller's cancellation or deadline; a hedged copy
//     the Client cancelled because its call had ended on another copy's
//     outcome (it only raises peak_ewma's estimate: see below); an
//     application's answer (any code not listed below); and an error raised
//     on the client with nothing received, other than UNAVAILABLE (grpc's
//     INTERNAL for a request that does not marshal, which a caller could send
//     on purpose);
//   - success;
//   - busy, never a failure and no break in a run of failures:
//     RESOURCE_EXHAUSTED, or any status with a grpc-retry-pushback-ms
//     trailer: the server is loaded, not broken (Linkerd's distinction);
//   - the endpoint's own failure: an answer with a code in
//     failureStatusCodes (default UNAVAILABLE, INTERNAL, DATA_LOSS), or an
//     attempt cut by the Client's own per-attempt timeout
//     (perAttemptRecvTimeout from the service config: the attempt's
//     deadline was earlier than the caller's, less the Client's headroom;
//     for a stream, the Client's timer marks the attempt before it cancels
//     it, and it counts only when the caller had closed its sending side
//     and nothing was received: a stream commits on the caller's reads, so
//     a caller that sends or reads slowly is cut by the timer while its
//     endpoint waits on it or has answered). The caller's deadline never
//     counts, nor a per-attempt timeout a caller set by call option: a
//     caller must not be able to eject a healthy endpoint;
//   - a local-origin failure: UNAVAILABLE with nothing received, the
//     connection refused or reset before any response (Envoy's
//     split_external_local_origin_errors). Counted apart, with its own
//     threshold, consecutiveLocalOriginFailures (default 5); an answer of
//     any kind ends their run. An ejection they cause ends as soon as the
//     endpoint is READY on a new connection (a backend restarted in place
//     is back when it is), unless it is a repeat (the endpoint failed
//     again right after such a return: a crash loop), which waits its
//     time. A local-origin failure reported after the endpoint reconnected
//     (an attempt of the old connection ending late) is dropped.
//
// UNKNOWN is not a failure by default. gRPC servers send it for a
// handler's plain (non-status) error, so it is most often an application's
// answer to the request, which a caller can provoke: counting it would let
// one caller's requests eject healthy endpoints (INTERNAL, which grpc
// itself raises for a broken server, stays). List it in failureStatusCodes
// when your servers use it for their own failures.
//
// # Ejection
//
// An endpoint is ejected after consecutiveFailures failures in a row
// (default 5), when its failures reach failurePercentageEjection's
// threshold over a rolling window, or after consecutiveLocalOriginFailures
// local-origin failures in a row. The k-th ejection in a row lasts
// min(k × baseEjectionTime, maxEjectionTime) (defaults 30s and 300s); k
// drops by one per baseEjectionTime in rotation. An endpoint back from an
// ejection is on probation: its first failure before a success ejects it
// again at once, for longer.
//
// At most maxEjectionPercent (default 50) of the endpoints are out at
// once, strictly: (ejected+1) × 100 ≤ percent × endpoints, so a
// whole-cluster outage ejects at most that share (gRFC A50 allows a first
// ejection past the percentage; this policy does not), and an explicit 0
// ejects nothing (A50). The bound holds at every moment, not only when
// ejecting: when the resolver lists fewer endpoints, or a new configuration
// lowers the percentage, the longest-ejected return until it holds. An
// endpoint the resolver lists twice is one endpoint.
//
// An ejected endpoint is still used when no other is READY, and the
// outcomes of those last-resort attempts count: one that succeeds ends the
// ejection at once, so an endpoint that answers again is back without
// waiting out its time (a failure changes nothing).
//
// A new configuration keeps each endpoint's state where it allows: its
// ejection (shortened to the new maxEjectionTime for its multiplier), its
// multiplier and its runs of failures. The configuration keeps gRFC A50's
// names (see serviceconfig.EndpointPolicy); A50's interval is accepted and
// ignored, as nothing sweeps.
//
// # Child policy
//
// The policy builds on grpc's endpointsharding, as round_robin does: each
// endpoint gets its own pick_first, so its own connection. childPolicy
// chooses the order of picks:
//
//   - "round_robin" (the default) rotates; the share of an endpoint passed
//     over (ejected, or used by the call) spreads evenly over the others. The
//     rotation is the calls' first attempts': a retry or a hedged copy takes
//     no turn (it goes to the endpoints the call has not used, in a rotation
//     of their own), so each endpoint gets its share of the calls however
//     many of them are hedged. Under grpc's round_robin a hedge takes the
//     next turn: with one call in flight at a time and one endpoint of three
//     slow, the slow one gets every other call, half of them;
//   - "pick_first" sends every call to the first usable endpoint in the
//     resolver's order, and a retry to the next. Unlike grpc's pick_first,
//     it keeps a connection to every endpoint: a pick_first holding one
//     connection could not send a retry anywhere else;
//   - "peak_ewma" ({"peak_ewma": {"decayTime": "10s", "endpointConcurrency":
//     4}}) picks the cheaper of two endpoints drawn at random among the
//     READY, non-ejected ones the call has not used (power of two choices),
//     the cost being a peak-sensitive moving average of the endpoint's
//     latency weighted by its attempts outstanding: Finagle's and Linkerd's
//     algorithm, with one default changed for gRPC servers. They price each
//     attempt in flight as a whole latency, latency × (outstanding + 1), as
//     if an endpoint served one at a time; a gRPC server serves calls
//     concurrently, and its latency estimate already rises when load slows
//     it, so the cost here is latency × (1 + outstanding /
//     endpointConcurrency), default 4 (1 is theirs). With theirs, 16 callers
//     over three endpoints, one of them 10× slower, keep about 8 attempts on
//     each fast one, which then costs about as much as the idle slow one: in
//     bench/'s endpoint-slow the slow one got 1.2–1.6% of the calls and the
//     p99 was its latency (5.5–5.9× the all-healthy p99); at 4 it gets
//     0.17–0.45% and the p99 is 1.02–1.18× (3 runs), and with every endpoint
//     healthy the most loaded of three takes 35.0–35.5% of the calls
//     (34.5–34.8% with theirs). At 16 the attempts in flight hardly count
//     (43% on one of three in one run, latency noise outweighing load): 16 is
//     the most accepted. The price of 4: one slow answer (a pause) keeps an
//     endpoint from every pick until its estimate decays below a busy
//     endpoint's cost, about τ·ln(the pause / that cost): 16 callers, three
//     5ms endpoints, one 50ms answer, about 9s on fake time; in real time
//     (bench/'s endpoint-pause) it gets 0.2% of the next second's calls and a
//     quarter of them again after about 10s. With theirs a busy endpoint
//     soon costs as much and the paused one gets calls at once, if fewer
//     (an eighth at once, a quarter after about 9s, in real time). It moves load away from a slow endpoint before any
//     error, without the servers' help (grpc's weighted_round_robin needs
//     ORCA load reports; least_request sees only outstanding requests). The
//     estimate takes a slower latency at once and forgets it with the decay
//     time τ (default 10s, Finagle's and Linkerd's); between samples it
//     decays toward zero, so an endpoint not picked because it looked slow is
//     tried again in time, about once per τ·ln(its latency / the others') (a
//     10× slower one: 4% of the calls at one call a second, 0.5% at ten), and
//     an endpoint with attempts outstanding and no sample within τ gets one
//     at a time. A decay time of 1s brings a paused endpoint back within a
//     second, but tries a slow one ten times as often (20% of the calls at
//     one a second) and prices an endpoint busy with calls slower than τ as
//     never measured: keep τ well above a method's latency. A success is a
//     latency sample; an error answer (a failure or an application's) only
//     raises the estimate to its time (a caller provoking quick errors must
//     not make a slow endpoint look fast); an attempt cut short unanswered,
//     by the Client's per-attempt timeout or as a hedged copy cancelled
//     because its call ended on another copy's outcome (an answer, a fatal
//     status), raises it to its time plus the estimate it was sent under,
//     at most twice its time: the latency expected of an attempt that has
//     already lasted that long (internal/peakewma's ObserveCut; the estimate
//     read when the attempt was picked, so attempts sent together count
//     once, and sixteen callers meeting one black hole price it as one
//     does, while attempts sent one after another's cut build on it). Without it, an endpoint slower
//     than the hedging delay would never be measured, and would look cheap;
//     priced at the bare cut, one reached only by copies its hedges outran
//     looks as cheap as the delay plus a fast answer, and is tried again
//     whenever a fast endpoint's cost peaks above that (one 10× slower of
//     three, hedging after 7 ms, ten calls a second on fake time: 3.0–3.7%
//     of the first attempts, 1.3–1.5% now). A local-origin failure, the
//     caller's cancellation and a busy answer say nothing of latency. The latency is the attempt's, from pick to end: a long-lived
//     stream measures its lifetime, so use peak_ewma for unary calls and
//     short streams. A client older than v0.5.0 refuses endpointConcurrency:
//     set it in a service config such clients read only once they are
//     upgraded.
//
// Other policies (weighted_round_robin, least_request, ...) are not
// supported as the child: the policy must know each endpoint's picker to
// choose among them.
//
// # Interaction with the Client
//
// The Client's breaker, bulkhead, retry budget and throttling work per
// method above the policy, unchanged: a call they refuse never reaches a
// picker, and the policy's ejections do not count as failures for them.
// What changes is where attempts land: with one bad endpoint of three,
// retries succeed on another, and the ejection takes the bad endpoint out
// of the first attempts, so the breaker and the budget see fewer failures.
//
// # Observability
//
// [Snapshots] returns each channel's endpoints with their state, for an
// operator to print (Snapshot.String). It survives a configuration change
// and an idle channel: grpc closes an idle channel's policy, which keeps
// its ejections for the policy grpc builds when the channel wakes, and the
// channel is listed as Idle while one of its endpoints is ejected.
//
// [SetLogger] sets the slog logger of every ejection (WARN), ejection
// refused by maxEjectionPercent (WARN) and return (INFO), each logged once
// with the channel's target, the endpoint, the cause or reason, the
// endpoint's count of ejections and the duration.
//
// Metrics go through grpc's metrics registry (gRFC A79), named after gRFC
// A91's with this policy's prefix, off by default:
// grpc.lb.resilience_endpoint.ejections_enforced_total and
// .ejections_detected_total (by cause: consecutive_failures, failure_rate,
// local_origin, probation; detected counts ejections refused by the bound
// too), .ejections_overflow (refused), .unejections_total (by reason:
// expired, answered, reconnected, max_ejection_percent,
// max_ejection_time), .attempts_avoided and the gauge .ejected_endpoints,
// each with the label grpc.target. The counters of ejections and returns
// take the optional label grpc.lb.resilience_endpoint.endpoint (the
// endpoint's addresses), enabled by name in grpc's OpenTelemetry plugin
// (MetricsOptions.OptionalLabels) and bounded to 100 distinct values per
// channel over its life (later endpoints are "other"), since every value is
// a series the metrics pipeline keeps.
//
// # Cost
//
// A pick allocates nothing and takes no lock. Round robin: when the
// rotation's endpoint is neither ejected nor used by the call, a few atomic
// loads; otherwise, and for a call's later attempts, a few per READY
// endpoint, as the others share its turn evenly. peak_ewma: one read of the monotonic clock, a random draw and two
// costs (an exponential each). No wall-clock read unless an endpoint has
// been ejected. Each pick takes a record from a sync.Pool, for its Done
// callback; the callback reads the clock and takes the endpoint's mutex
// when the outcome counts (and, for peak_ewma, the estimate's).
package endpoint
