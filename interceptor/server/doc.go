// Package server is the server side of grpc-resilience: a [Server] whose
// interceptors execute a keyed request once however often it arrives
// (idempotency), protect the server from overload (adaptive concurrency
// limits, shedding by criticality, CPU-aware shedding, fair shares among
// tenants), and give handlers deadlines that leave room for their own work.
// Its counterpart on the calling side is package interceptor (the client);
// what the two sides agree on over the wire (the idempotency-key and
// criticality metadata, the caller-retries mark) is package
// interceptor/wire; the idempotency stores are in package
// interceptor/idempotency and its sub-packages. Neither side imports the
// other: a server built with this package answers any gRPC client, and a
// Client of package interceptor calls any gRPC server.
//
// # Settings
//
// [New] takes options; these are all of them:
//
//	WithIdempotency(Idempotency{...})  run each keyed unary call once per (caller scope, method, key)
//	WithLimits(Limits{...})            overload protection: adaptive limits, criticality, CPU, tenants
//	WithHeadroom(headroom, floor)      handlers' deadlines end headroom before the caller's
//	WithMeterProvider(mp)              OpenTelemetry metrics (the table under Metrics)
//	WithLogger(l)                      where warnings go (slog.Default() by default)
//
// [Idempotency] and [Limits] are plain structs with Validate, like the
// structs of package serviceconfig: zero fields are off or take the
// defaults their comments give, and Limits.Config is the server document
// that serviceconfig.ParseServer reads from JSON, so Go code and JSON build
// the same values. New validates every option and returns an error naming
// the first bad field ("server: Idempotency.TTL is ..."); it never panics
// on bad configuration, and it refuses a setting that cannot apply (a
// Limits.Tenant without Config.TenantFairness, a Limits.Streams name that
// no limit covers). One rule for every option: each is given once, and a
// second of the same kind is refused, naming it, rather than silently
// replacing the first. An Option is a value: it holds a copy of what it
// was given and New does the work, so one Option may build any number of
// Servers, which share nothing through it (each seeds its own generator
// from a Limits.Rand).
//
//	srv, err := server.New(
//		server.WithIdempotency(server.Idempotency{Store: store, Scope: server.PeerScope}),
//		server.WithLimits(server.Limits{Config: serviceconfig.ServerConfig{
//			ConcurrencyLimit: &serviceconfig.ConcurrencyLimit{}, // Vegas, with its defaults
//		}}),
//		server.WithHeadroom(20*time.Millisecond, 5*time.Millisecond),
//	)
//	gs := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(recovery, auth, srv.UnaryServerInterceptor()),
//		grpc.ChainStreamInterceptor(srv.StreamServerInterceptor()),
//	)
//
// and on shutdown, beside gs.GracefulStop (see [Server.Shutdown]):
//
//	go gs.GracefulStop()
//	err := srv.Shutdown(ctx) // drains the keyed handlers detached from their callers within ctx, then cancels them
//
// Install the unary interceptor after authentication (the scope function
// reads what authentication put in the context) and after a panic-recovery
// interceptor: a panic in the handler releases the idempotency claim and
// goes on up, so the outer recovery makes it INTERNAL and a retry runs the
// handler again. A Server with no option only marks the contexts of calls
// whose caller retries (see One layer of retries).
//
// # One call, and the one admission path
//
// A unary call goes through the layers in this order, outermost first:
//
//	shutting down? ─► headroom (and the caller-retries mark) ─► idempotency (a keyed call: key, join, claim)
//	    ─► the one admission path, right before the handler, whichever way the call came:
//	         the method's rate limits: any out of tokens? ─► RESOURCE_EXHAUSTED + RetryInfo + QuotaFailure + pushback
//	         the method's limit: remaining deadline < its door's service time? ─► DEADLINE_EXCEEDED, not started
//	                             in flight ≥ the criticality's (and tenant's) share? ─► wait in the queue (MaxQueue,
//	                             MaxQueueWait; the most critical first), else RESOURCE_EXHAUSTED + pushback
//	         or, for a method without a limit, the CPU shedder
//	    ─► handler ─► a latency sample for the method's cost class when the handler answered OK
//
// Every handler the Server runs goes through the one admission path: a
// call without idempotency or without a key, a keyed call of a KeyIgnored
// method or one run plainly because the store failed (FailOpen), and the
// owner of a key, in lease or joined mode. The path admits on the caller's
// context (a caller that gives up leaves the queue at once, and a call
// whose caller has gone by the time it is admitted does not run) and runs
// the handler on the handler's own context (for a keyed call, detached from
// the caller by default). A keyed call is admitted after its claim and
// only when it runs the handler: a duplicate that waits for the running
// execution, or replays its outcome, takes no slot and gives no sample.
// What the path refuses (shed by the limit, its door or queue, or the CPU
// shedder; refused while shutting down) is never stored as a key's
// outcome, whatever Idempotency.UnstoredCodes says, so a retry runs the
// call once there is room. A stream goes through the rate limits of its
// method when it opens, then through the concurrency limit when
// Limits.Streams names its method (never for its deadline), then the
// headroom; idempotency is for unary calls only.
//
// # Rate limits
//
// The rateLimits of Limits.Config (serviceconfig.RateLimit: a rate, a burst
// and a key: the tenant, the peer's IP, the idempotency scope, or one
// shared key) are the first gate of the admission path: a call passes every
// limit of its method's entry, of its service's and of the top level, or
// none of them takes its token. So a call the rate limits refuse holds no
// concurrency slot and never waits in a limit's queue; a call they admit
// and the concurrency limit then sheds gets its tokens back, so a quota
// counts the calls the server ran. A refused call gets RESOURCE_EXHAUSTED
// with a google.rpc.RetryInfo of the exact time until it would be admitted
// (GCRA's wait, the longest of the refusing limits'), the same time rounded
// up to the millisecond in the grpc-retry-pushback-ms trailer, and a
// google.rpc.QuotaFailure with a violation per refusing limit (subject
// "ratelimit:NAME"); its handler does not run. A keyed call spends tokens
// when its handler runs: a duplicate that replays the stored outcome, or
// waits for the running one, spends none. A stream spends one token of each
// limit when it opens. Health checks and reflection are exempt from the
// top-level limits unless an entry with rateLimits names them.
// Criticality keeps a reserve of each burst for the more critical calls
// (see docs/ratelimits.md). A local limit decides with one compare-and-swap
// and allocates nothing for a key it remembers; a distributed one decides
// from the tokens its replica leased through Limits.Quota (redisquota), and
// waits for Redis only for a key's first lease. A Server's limits are fixed
// when it is built: to change them, build a new Server and swap it in.
//
// # Idempotency
//
// With [WithIdempotency], a unary call that carries idempotency-key
// metadata (wire.IdempotencyKeyHeader: 1 to 255 printable ASCII
// characters, the same on every attempt of one logical call) runs its
// handler once per record key (caller scope, full method, key):
//
//   - first request: run the handler, store its status, reply and the
//     header and trailer metadata it set (less Idempotency.OmitMetadata),
//     with a TTL (Idempotency.TTL, 24h by default);
//   - duplicate after completion: replay the stored outcome byte for byte;
//     the handler does not run;
//   - duplicate while the first runs: wait for its outcome, bounded by the
//     duplicate's own deadline (in process, coalesced; across processes, by
//     polling the store: Idempotency.PollInitial and PollMax), or with
//     Idempotency.NoWait fail at once with ABORTED and a
//     grpc-retry-pushback-ms trailer (Idempotency.Pushback, 100ms);
//   - same key, different request (a SHA-256 of the deterministically
//     marshalled request): FAILED_PRECONDITION ([ErrIdempotencyKeyReused]);
//   - an outcome whose code is in Idempotency.UnstoredCodes
//     ([DefaultUnstoredCodes]: UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED,
//     CANCELLED, DEADLINE_EXCEEDED) is not stored, so a retry runs the
//     handler again; a panic never is.
//
// Every answer the handler did not run for (a replay, or a concurrent
// duplicate's coalesced answer) carries the response header
// idempotency-replayed: true (wire.IdempotencyReplayedHeader), which
// wire.IdempotencyReplayed reads from a call's grpc.Header; the handler of
// a keyed call cannot set it, on any path (the owner's, a KeyIgnored
// method's, fail open's): it is taken out of what the handler sets.
//
// A keyed call reaches its handler through the one admission path (above),
// after its claim: the limit's or the CPU shedder's shed, and every other
// refusal of the path, ends the claim with a release, never a stored
// outcome (in lease mode, on Redis or in memory, as in joined mode, where
// the transaction is rolled back), and the call's caller, not the
// detached handler's context, bounds its wait in a limit's queue.
//
// The scope is required: Idempotency.Scope names the caller, from the
// authenticated principal or tenant, [PeerScope] for callers with verified
// client certificates (mTLS, SPIFFE), or [SharedScope] to let every caller
// share records (keys must then be unguessable). One caller never receives
// another's reply unless they share a scope.
//
// The owner of a key holds it for a lease (Idempotency.Lease, 30s),
// renewed every lease/3 while the handler runs; if its process crashes the
// key is free one lease after the last renewal. The handler's context ends
// at nine tenths of a lease that was not renewed in time, on the server's
// own clock, whatever the store does (a Renew that hangs in a partition
// does not hold the cutoff), so a duplicate on another replica, which may
// claim the key once the lease has ended, never starts while the first
// handler's context is live; every store call is bounded by its context
// (the idempotency.Store contract), and the store calls after a handler by
// one lease. By default the handler of
// a keyed call runs detached from its caller: its context keeps the
// caller's values but not its cancellation or deadline, bounded instead by
// Idempotency.DetachedMax (30s) and the lease, so a handler that committed
// its side effect finishes, its outcome is stored, and the caller's retry
// replays it; Idempotency.AttachedHandler keeps the caller's context, for
// handlers whose work is undone with it. A store that fails makes the call
// fail with UNAVAILABLE ([ErrIdempotencyStoreUnavailable]) and a retry
// hint, unless Idempotency.FailOpen runs the handler without
// deduplication. Idempotency.KeyPolicies makes a key required
// ([KeyRequired]) or ignored ([KeyIgnored]) per method or service; health
// checks and reflection run plainly, key or not, unless a policy names
// them. The stores (memory, Redis, PostgreSQL; minimum retention, per-scope
// quotas) and the full semantics are in package interceptor/idempotency.
//
// # Deadlines
//
// [WithHeadroom] gives each handler a context that ends headroom before the
// caller's deadline, so the calls it makes downstream leave it time to
// answer, and rejects with DEADLINE_EXCEEDED, before the handler runs, a
// call that arrives with less than headroom + floor left. Calls without a
// deadline are left alone.
//
// # One layer of retries
//
// Every call's context is marked when the caller says it retries the call
// itself (wire.CallerRetriesKey; wire.CallerRetries reads the mark), so
// that a client of package interceptor with WithOneLayerRetry, used in the
// handler, does not retry too: retries stay at one layer of a call chain
// instead of multiplying across hops. [SetRetryPushback] lets a handler
// tell its caller when to retry (gRFC A6's grpc-retry-pushback-ms), or,
// with a negative duration, not to.
//
// # Overload protection
//
// [WithLimits] bounds the unary calls in flight by a limit learned from
// their latencies: Limits.Config.ConcurrencyLimit for the whole server, a
// Limits.Config.MethodConfig entry for a method or a service (a full
// method's entry wins over its service's), each with the algorithm of
// serviceconfig.ConcurrencyLimit: TCP Vegas against the base RTT by
// default, AIMD as the simple alternative (the algorithm and why Vegas is
// in package internal/limit).
//
// A limit knows what each method costs: each method under it is a cost
// class of its own, with its own base RTT and door, and a window of
// latencies is judged as the sum of its latencies over the sum of their
// methods' base RTTs. So the server-wide limit is safe for a service whose
// methods differ in cost: with one shared base RTT, a method answered in
// microseconds became the base and every 10ms call looked queued (16
// callers of a 10ms method and 1% cheap calls: an AIMD limit fell to 1 and
// shed 87% of them; now it sheds none). A limit tells apart the first 63
// methods it sees; the methods beyond share one class (a proxy forwarding
// any name cannot grow it). A method with a limit of its own is still the
// better choice for a method much costlier than the rest, so that its
// callers do not take the others' slots.
//
// Vegas probes: every few round trips of a method, while the limit sheds
// nothing, it takes that method's latest latency for its base RTT, and a
// limit that falls while the latencies do not takes the new latencies too,
// so when the service itself becomes slower for good (a deploy, a slower
// dependency) the limit recovers within seconds instead of shedding a
// server that is not overloaded for a minute. While it sheds, a probe on
// one latency would take a queued latency for the base (at 1.2 times the
// capacity the limit grew without bound), so the limit probes by draining
// instead, as TCP BBR does: when 16 updates in a row called for a lower
// limit while it sheds (at most once per 64 to 128 smoothed latencies), it
// admits half of itself for two smoothed latencies, and each method's base
// RTT starts anew from the least latency admitted after that, so a limit
// that sheds never rests on a base RTT that has become wrong (an AIMD limit
// whose service became three times slower sat at 1 of 8 slots for a
// minute).
//
// Only a call the handler answered OK is a latency sample: a failure (a
// validation error returns in microseconds) or a cancelled call teaches
// nothing, and a call whose deadline ended is a drop, which lowers the
// limit, only when that deadline left it twice the base RTT: a caller's
// own short deadline is not the server's overload, whether its
// cancellation or the server's timer ends the call. The door refuses a
// call whose deadline is shorter than the least latency of its method's
// last 32 to 64 calls; it lets one such call through per service time it
// holds, so once the service is fast again the door learns it within about
// one of its service times (after a 400ms slow phase, a 150ms call was
// served 250ms after the service was fast; it used to take 3.2s), and it
// opens once none has completed for 8 smoothed latencies. Health checks
// and reflection are
// outside every limit and the CPU shedding unless a Limits.Config entry
// names them: a health check shed under overload has Kubernetes restart a
// pod that is only busy, and its load moves onto the others.
//
// A shed call costs a lock and a status: RESOURCE_EXHAUSTED with a
// google.rpc.RetryInfo detail and the grpc-retry-pushback-ms trailer, both
// saying how long to wait (the smoothed latency times 1 + shed/admitted, in
// steps of at most 25%, the status built once per step; 100ms before the
// first call completed); once the server sheds as many calls as it admits,
// the trailer says not to retry (-1) instead, so retrying clients cannot
// amplify an overload. A Client of package interceptor honours both. An
// admitted call allocates nothing for the limit. [Server.LimitStatuses]
// shows each limit's state and counts; WithMeterProvider records them
// (resilience.server.limit.*, in the table under Metrics). Limits.Rand
// seeds the probes' jitter for repeatable runs.
//
// In real time (bench/overload: loopback TCP, open loop, 3 times the
// capacity of a server of 10 tokens × 50ms, 500ms deadlines; go run
// ./overload/cmd/overload in bench), over 5 runs on a busy 2-core machine,
// the limit served a median 98.0% of the capacity (88.0–98.5%) at 1.28×
// the unloaded p99 (0.84–2.26×), against 97.0% at 2.11× for failsafe-go's
// adaptive limiter; the limit was back within 10% of its pre-overload
// value 200ms after the load dropped. The ratios move with the machine's
// noise: the worst runs are those in which the machine stalled every
// contender's service.
//
// Streams are not limited by default: a stream holds a slot for its whole
// life, so a few long streams could starve the unary calls, and their
// lifetimes say nothing of the server's load. Limits.Streams opts the
// streams of a method or service in: a stream takes a slot of its method's
// limit when it opens (queued or shed as a unary call is, by criticality,
// never at the door for its deadline) and gives it back when its handler
// returns, without a latency sample. Give streaming methods a limit of
// their own (a Limits.Config.MethodConfig entry).
//
// # Criticality
//
// Criticality rides in metadata (wire.CriticalityKey, which
// wire.ContextWithCriticality sets on a caller's context): a CRITICAL_PLUS
// call may fill the whole limit, CRITICAL (the default) 90% of it,
// SHEDDABLE_PLUS 75%, SHEDDABLE half, so the server sheds the least
// critical first. A Client of package interceptor sends every retry and
// hedged copy as SHEDDABLE_PLUS at most (the server takes the lowest value
// it gets), so that a retry never displaces a first attempt.
//
// The value is the caller's claim: a caller that could send CRITICAL_PLUS
// with every call would be shed last, take the share kept for truly
// critical work and make every other caller yield, and once several did so
// the levels would mean nothing. So by default the server takes the value
// as sent but at most CRITICAL: every caller may lower its own criticality,
// none may raise it above the default. To trust some callers with
// CRITICAL_PLUS, Limits.Criticality decides from the context (the peer,
// verified credentials) and what was sent (a [CriticalityFunc]);
// [CapCriticality](wire.CriticalPlus) trusts every caller.
//
// # CPU-aware shedding
//
// Limits.CPU ([CPUShedding]) is the alternative to a server-wide limit for
// a service whose cost is CPU: while the CPU use (cgroup-aware on Linux) is
// above CPUThreshold (0.8), or within CoolOff (1s) of the last shed, a call
// is admitted only while the calls in flight stay below the server's
// estimated bandwidth-delay product (the most calls completed in a tenth of
// Window, times the least mean latency of such a tenth, over Window: 5s),
// with the same shares by criticality as a limit; below the threshold
// every call is admitted, so an idle server never sheds. It covers the
// methods without a limit of their own; a top-level ConcurrencyLimit and
// CPU together are refused. Its state is the LimitStatus named
// [CPUSheddingName].
//
// # Tenants
//
// Limits.Config.TenantFairness shares each limit among the tenants that
// Limits.Tenant names from the context ([TenantFromMetadata] of its
// metadataKey by default, for a key an authenticating proxy sets): under
// pressure a tenant over its fair share is shed before any tenant under
// it, and a tenant under its share is admitted whatever the others hold.
// The fair share is over the tenants with calls in flight or queued (a
// tenant with one call takes one slot, the others share the rest): a
// tenant that called a second ago and holds nothing claims no share (60
// tenants calling once every 2s used to shrink every share under a slot).
// Tenants are bounded (MaxTenants per limit) and forgotten when idle.
// Fairness shares the slots, not the wait: a quiet tenant's admitted calls
// still queue, as everyone's do, behind the calls the limit admits beyond
// the service's own concurrency, so in bench/overload (one tenant at half
// its share beside one at 10 times its share; 5 runs on a busy machine)
// the quiet tenant kept 100% (98.7–100%) of its calls, 20% without
// fairness, at 2.12× (1.04–2.77×) its idle p99.
//
// # Metrics
//
// [WithMeterProvider] records through the OpenTelemetry metric API, in the
// instrumentation scope "github.com/grpc-resilience/resilience/interceptor"
// (the client's, so one selector reads both sides; it is the package path
// the server had before it moved here). Without it nothing is recorded, at
// no cost; with the no-op provider, or the SDK's, a call allocates no more
// than without (attribute sets are built once per method). grpc.method is
// gRFC A66's: the full method without its leading slash; past the first
// 1024 methods a Server has seen, the rest are "other", so that a server
// whose UnknownServiceHandler runs for any name a caller invents keeps its
// label values bounded. The gauges are read by a
// callback that the provider holds until [Server.Close]: close a Server
// that another replaces (per configuration reload), or the provider keeps
// it, and reads it, for as long as the provider lives.
//
//	name                                          kind       unit     attributes
//	resilience.server.idempotency.executions      counter    {call}   grpc.method: handler runs under a claim
//	resilience.server.idempotency.replays         counter    {call}   grpc.method, resilience.idempotency.source (store, flight)
//	resilience.server.idempotency.waits           counter    {call}   grpc.method, resilience.idempotency.wait (flight, poll)
//	resilience.server.idempotency.conflicts       counter    {call}   grpc.method, resilience.idempotency.conflict (mismatch, in_progress)
//	resilience.server.idempotency.store_errors    counter    {error}  grpc.method, resilience.idempotency.op, resilience.idempotency.mode (fail_open, fail_closed)
//	resilience.server.idempotency.store.duration  histogram  s        grpc.method, resilience.idempotency.op (claim, complete, release, renew)
//	resilience.server.limit.current               gauge      {call}   resilience.limiter: each limit now; cpu: the bandwidth-delay product
//	resilience.server.limit.in_flight             gauge      {call}   resilience.limiter
//	resilience.server.limit.queued                gauge      {call}   resilience.limiter (not cpu)
//	resilience.server.limit.admitted              counter    {call}   grpc.method, resilience.criticality
//	resilience.server.limit.shed                  counter    {call}   grpc.method, resilience.criticality, resilience.reason (limit, queue_timeout, deadline, cpu, ratelimit)
//	resilience.server.limit.queue.duration        histogram  s        grpc.method: time in a limit's queue, admitted or not
//	resilience.server.ratelimit.admitted          counter    {call}   resilience.ratelimit, resilience.criticality
//	resilience.server.ratelimit.limited           counter    {call}   resilience.ratelimit, resilience.criticality (a call refused by two limits counts under each)
//
// resilience.limiter names the limiter: server (the server-wide limit),
// cpu (Limits.CPU), or the full method (without its leading slash) or
// service of a Limits.Config.MethodConfig entry. resilience.criticality is
// the criticality the server gave the call (the wire name, after
// Limits.Criticality). A shed call counts once, with the reason that ended
// it: limit (over its criticality's share, no room in the queue),
// queue_timeout (waited in the queue without getting a slot: MaxQueueWait,
// its deadline, or its caller left), deadline (rejected at the door:
// DEADLINE_EXCEEDED), cpu (the CPU shedder), ratelimit (refused by the
// rate limits; resilience.ratelimit names the limit, in the rate limits'
// own counters, by its name in the document); a call admitted from the queue
// counts only as admitted. Store errors exclude the store's answers that
// are not failures (another owner, full, record too large) and calls whose
// context ended.
//
// # Tracing
//
// The Server adds an event to the span of the handler's context, only
// while that span records: without one, nothing is added and nothing
// allocated.
//
//	event                          attributes
//	resilience.idempotency.replay  resilience.idempotency.source (store, flight), rpc.grpc.status_code
//
// # Concurrency and cost
//
// A Server is safe for concurrent use; its per-method policy and its
// in-process coalescing state are shared by all calls. It starts no
// background goroutine and owns no store (close a store's client
// yourself). [Server.Shutdown] stops it, drains the keyed handlers that
// run detached from their callers within its context and cancels the
// rest, and unregisters its gauges; [Server.Close] only unregisters them. A call without an
// idempotency key allocates no more than under a pass-through interceptor
// (an allocation test pins it), and an admitted call allocates nothing
// for the limit.
//
// # Where things are
//
// options.go (Option, every With* option, Idempotency and Limits with their
// validation), server.go (Server, New, Shutdown, both interceptors),
// admission.go (the one admission path), headroom.go (the deadline
// headroom), pushback.go (SetRetryPushback and the shed statuses),
// idempotency.go, idempotency_call.go, idempotency_lease.go,
// idempotency_joined.go, idempotency_detached.go, idempotency_handlers.go
// and idempotency_flight.go (the idempotency path: key policies and
// scopes; one keyed call; the lease's renewal and cutoff; a handler joined
// to a pgstore transaction; the handler's context; the running handlers,
// for Shutdown; the in-process coalescing),
// limit.go, limit_stream.go and limit_tenant.go (the concurrency limits,
// streams under them, tenants), criticality.go, cpu.go, metrics.go and
// limit_metrics.go.
package server
