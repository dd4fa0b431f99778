// Package endpoint is a gRPC load-balancing policy, registered as
// "resilience_endpoint" when the package is imported, that sends each retry
// and hedged copy of a call to an endpoint the call has not used yet, and
// takes a failing endpoint out of rotation for a while (passive outlier
// ejection).
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
// (balancer.PickInfo.Ctx). The Client of package interceptor puts in each
// retry's and hedged copy's context a trail of the endpoints the call has
// used, and the picker prefers, in order: an endpoint neither used nor
// ejected; one used but not ejected; one ejected. So a retry after a
// failure goes to another endpoint whenever another is READY, and a hedged
// copy never joins its sibling on a slow endpoint. The first attempt of a
// call carries no trail and costs nothing: a unary call's first endpoint
// is recognized on retry by the address of the server it reached (grpc's
// peer), so that address must be the endpoint's resolver address, as it is
// with the dns resolver, a manual resolver or a list of IP:port. A dialer
// or proxy that reports another address (an HTTPS_PROXY's, for one) leaves
// the first retry free to land on the first attempt's endpoint, and under
// the pick_first child it always does; later retries and hedged copies
// are recorded by the picker itself and are not affected. Without the
// Client's interceptors (grpc's own retry), no trail exists and the policy
// only ejects.
//
// # Ejection
//
// Each attempt's outcome, reported by grpc when it ends, counts toward its
// endpoint's ejection (the engine computes every transition from outcomes
// and the time, with no timer or goroutine):
//
//   - success, or a failure: a code in failureStatusCodes (default
//     UNAVAILABLE, UNKNOWN, INTERNAL, DATA_LOSS);
//   - busy, never a failure and no break in a run of failures:
//     RESOURCE_EXHAUSTED, or any status with a grpc-retry-pushback-ms
//     trailer: the server is loaded, not broken (Linkerd's distinction);
//   - nothing: the caller's cancellation or deadline, application errors,
//     and a failure with nothing received from the endpoint unless it is
//     UNAVAILABLE (unreachable, or its connection broke): such a failure
//     is the client's own, e.g. grpc's INTERNAL for a request that does
//     not marshal, which a caller could send on purpose.
//
// An endpoint is ejected after consecutiveFailures failures in a row
// (default 5), or when its failures reach failurePercentageEjection's
// threshold over a rolling window. The k-th ejection in a row lasts
// min(k × baseEjectionTime, maxEjectionTime) (defaults 30s and 300s); k
// drops by one per baseEjectionTime in rotation. An endpoint back from an
// ejection is on probation: its first failure before a success ejects it
// again at once, for longer. At most maxEjectionPercent (default 50) of the
// endpoints are out at once, strictly: (ejected+1) × 100 ≤ percent ×
// endpoints, so a whole-cluster outage ejects at most that share (gRFC A50
// allows a first ejection past the percentage; this policy does not). An
// ejected endpoint is still used when no other is READY.
//
// DEADLINE_EXCEEDED never counts, since the policy cannot tell an
// attempt's own timeout from its caller's deadline: an endpoint that
// accepts calls and never answers (a black hole) is not ejected. Retries
// and hedged copies still avoid it (a per-attempt timeout, or hedging, ends
// the wait); pair the policy with a health check (healthCheckConfig) for
// that case.
//
// The configuration keeps gRFC A50's names (see
// serviceconfig.EndpointPolicy); A50's interval is accepted and ignored,
// as nothing sweeps.
//
// # Child policy
//
// The policy builds on grpc's endpointsharding, as round_robin does: each
// endpoint gets its own pick_first, so its own connection. childPolicy
// chooses the order of picks: "round_robin" (the default) rotates;
// "pick_first" sends every call to the first usable endpoint in the
// resolver's order, and a retry to the next. Unlike grpc's pick_first,
// that keeps a connection to every endpoint: a pick_first holding one
// connection could not send a retry anywhere else. Other policies
// (weighted_round_robin, least_request, ...) are not supported as the
// child: the policy must know each endpoint's picker to choose among them.
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
// operator to print. Metrics go through grpc's metrics registry (gRFC
// A79), named after gRFC A91's with this policy's prefix, off by default:
// grpc.lb.resilience_endpoint.ejections_enforced_total,
// .ejections_overflow, .attempts_avoided and the gauge .ejected_endpoints,
// each with the label grpc.target.
//
// # Cost
//
// A pick allocates nothing and takes no lock: when the rotation's endpoint
// is neither ejected nor used by the call, a few atomic loads; otherwise a
// few per READY endpoint, as the others share its turn evenly. No clock
// read unless an endpoint has been ejected. The Done
// callback reads the clock and takes the endpoint's mutex when the outcome
// counts. A retry or hedged call allocates its trail (one object).
package endpoint
