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
//	WithLogger(l)                      where warnings go (grpclog's "resilience" component by default)
//
// [Idempotency] and [Limits] are plain structs with Validate, like the
// structs of package serviceconfig: zero fields are off or take the
// defaults their comments give, and Limits.Config is the server document
// that serviceconfig.ParseServer reads from JSON, so Go code and JSON build
// the same values. New validates every option and returns an error naming
// the first bad field ("server: Idempotency.TTL is ..."); it never panics
// on bad configuration.
//
//	srv, err := server.New(
//		server.WithIdempotency(server.Idempotency{Store: store, Scope: server.PeerScope}),
//		server.WithLimits(server.Limits{Config: serviceconfig.ServerConfig{
//			ConcurrencyLimit: &serviceconfig.ConcurrencyLimit{}, // Vegas, with its defaults
//		}}),
//		server.WithHeadroom(20*time.Millisecond, 5*time.Millisecond),
//	)
//	defer srv.Close() // once gs has stopped
//	gs := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(recovery, auth, srv.UnaryServerInterceptor()),
//		grpc.ChainStreamInterceptor(srv.StreamServerInterceptor()),
//	)
//
// Install the unary interceptor after authentication (the scope function
// reads what authentication put in the context) and after a panic-recovery
// interceptor: a panic in the handler releases the idempotency claim and
// goes on up, so the outer recovery makes it INTERNAL and a retry runs the
// handler again. A Server with no option only marks the contexts of calls
// whose caller retries (see One layer of retries).
//
// # One call, and the order of the layers
//
// A unary call goes through the layers in this order, outermost first:
//
//	criticality, tenant ─► remaining deadline < the door's service time? ── yes ─► DEADLINE_EXCEEDED, not started
//	                    ─► in flight ≥ the criticality's (and tenant's) share of the limit? ── yes ─► wait in the queue
//	                       (MaxQueue, MaxQueueWait; the most critical first) if it has room, else RESOURCE_EXHAUSTED + pushback
//	                    ─► headroom (and the caller-retries mark) ─► idempotency ─► handler
//	                    ─► a latency sample for the limit when the handler answered OK
//
// A keyed call on a Server with idempotency is limited around its handler
// only: a duplicate that waits for the running execution, or gets its
// stored outcome, takes no slot and gives no sample (it costs the keyed
// call one allocation). A stream goes through its method's limit only
// when Limits.Streams names it, then the headroom; idempotency is for
// unary calls only.
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
// wire.IdempotencyReplayed reads from a call's grpc.Header.
//
// The scope is required: Idempotency.Scope names the caller, from the
// authenticated principal or tenant, [PeerScope] for callers with verified
// client certificates (mTLS, SPIFFE), or [SharedScope] to let every caller
// share records (keys must then be unguessable). One caller never receives
// another's reply unless they share a scope.
//
// The owner of a key holds it for a lease (Idempotency.Lease, 30s),
// renewed every lease/3 while the handler runs; if its process crashes the
// key is free one lease after the last renewal. By default the handler of
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
// in package internal/limit). Vegas probes: every few round trips, while
// it sheds nothing, it takes the latest latency for the base RTT, and a
// limit that falls while the latency does not takes the new latency too,
// so when the service itself becomes slower for good (a deploy, a slower
// dependency) the limit recovers within seconds instead of shedding a
// server that is not overloaded for a minute; under overload there is no
// probe, so queued latencies never become the base (at 1.2 times the
// capacity they did, and the limit grew without bound).
//
// Only a call the handler answered OK is a latency sample: a failure (a
// validation error returns in microseconds) or a cancelled call teaches
// nothing, and a call whose deadline ended is a drop, which lowers the
// limit, only when that deadline left it twice the base RTT: a caller's
// own short deadline is not the server's overload, whether its
// cancellation or the server's timer ends the call. The door refuses a
// call whose deadline is shorter than the least latency of the last 32 to
// 64 calls; it opens once none has completed for 8 smoothed latencies, so
// it never rests on a stale service time. Health checks and reflection are
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
//	resilience.server.limit.shed                  counter    {call}   grpc.method, resilience.criticality, resilience.reason (limit, queue_timeout, deadline, cpu)
//	resilience.server.limit.queue.duration        histogram  s        grpc.method: time in a limit's queue, admitted or not
//
// resilience.limiter names the limiter: server (the server-wide limit),
// cpu (Limits.CPU), or the full method (without its leading slash) or
// service of a Limits.Config.MethodConfig entry. resilience.criticality is
// the criticality the server gave the call (the wire name, after
// Limits.Criticality). A shed call counts once, with the reason that ended
// it: limit (over its criticality's share, no room in the queue),
// queue_timeout (waited in the queue without getting a slot: MaxQueueWait,
// its deadline, or its caller left), deadline (rejected at the door:
// DEADLINE_EXCEEDED), cpu (the CPU shedder); a call admitted from the queue
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
// yourself): Close has only the gauges to unregister. A call without an
// idempotency key allocates no more than under a pass-through interceptor
// (an allocation test pins it), and an admitted call allocates nothing
// for the limit.
//
// # Where things are
//
// options.go (Option, every With* option, Idempotency and Limits with their
// validation), server.go (Server, New, both interceptors), headroom.go (the
// deadline headroom), pushback.go (SetRetryPushback and the shed statuses),
// idempotency.go, idempotency_call.go, idempotency_joined.go,
// idempotency_detached.go and idempotency_flight.go (the idempotency path:
// key policies and scopes; one keyed call; a handler joined to a pgstore
// transaction; the detached handler's context; the in-process coalescing),
// limit.go, limit_stream.go and limit_tenant.go (the concurrency limits,
// streams under them, tenants), criticality.go, cpu.go, metrics.go and
// limit_metrics.go.
package server
