// Package idempotency stores the outcomes of gRPC calls by idempotency key,
// so that a server runs each keyed call once and replays its outcome to every
// duplicate. It holds the [Store] contract, the [Record] type and
// [MemoryStore], the embedded default; package redisstore holds a Store
// shared by many replicas, package pgstore one in PostgreSQL whose joined
// mode (a [TxStore]) commits the handler's own writes with the record, and
// package storetest a conformance suite for any Store.
//
// The interceptor that uses a Store is server.Server (package
// interceptor/server), turned on with
// server.WithIdempotency(server.Idempotency{Store: s, ...}). This
// documentation describes what they do together.
//
// # Why
//
// A client whose call timed out cannot know whether the call ran. Retrying
// may run it twice; not retrying may lose it. With an idempotency key the
// client sends the same key on every attempt of one logical call; the server
// runs the call once and answers every attempt with the same outcome.
//
// # The record key
//
// A call carries its key in the metadata "idempotency-key": 1 to 255
// printable ASCII characters (0x20–0x7E), sent once. Anything else is
// rejected with INVALID_ARGUMENT and a message saying what is wrong. The
// record key is the triple [RecordKey] (caller scope, full method, key):
//
//   - The scope comes from a function the server must choose
//     (server.Idempotency.Scope), typically the authenticated
//     principal or tenant. server.PeerScope is one for mTLS:
//     the verified client certificate's issuer, Subject and subject
//     alternative names (SPIFFE IDs in URI SANs, DNS names, ...), so two
//     workloads of one CA never share a scope; a keyed call without such a
//     certificate is refused with UNAUTHENTICATED. server.New
//     refuses a store without a scope, unless the server opts in to one
//     scope shared by every caller (Scope: server.SharedScope).
//   - Risk of a shared scope: all callers of one scope share records. Any
//     caller who learns or guesses another caller's key receives that
//     caller's reply and replayed metadata, for the same method and request;
//     it can take a key first (the owner then gets FAILED_PRECONDITION for
//     the record's TTL) and can learn whether a key was used. Keys must then
//     be unguessable (random, 128 bits or more). A caller of another scope
//     using the same key runs its own call and never sees the first reply.
//   - What is replayed: the status (code, message, details) or reply, and
//     the header and trailer metadata the handler set through its context,
//     less the keys the server omits (server.Idempotency.OmitMetadata).
//     Metadata set by interceptors outside the idempotency interceptor is not
//     stored: they run again for the duplicate.
//
// # Defaults
//
// What a server gets with no option set, what each default protects, the
// option that changes it, and the risk of the change:
//
//   - Scope: none. server.New refuses an Idempotency without a Scope
//     (a function of the caller, or server.SharedScope), so one
//     caller never receives another's reply. A shared scope gives any caller
//     who learns or guesses a key its reply.
//   - Detached handler (server.Idempotency.DetachedMax, 30 s):
//     a keyed call's handler runs on a context that its caller's deadline
//     and cancellation do not reach, so a handler that commits and then
//     sees its caller gone has its outcome stored and replayed (one
//     charge). AttachedHandler puts it back on the caller's context: such a handler runs
//     twice. Any bound: the server works that long for a caller that left.
//   - Lease (server.Idempotency.Lease, 30 s), claimed for the lease
//     and renewed every lease/3: a crashed owner blocks duplicates on other
//     replicas at most one lease after its last renewal. Shorter: more
//     renewals, and a store outage longer than two thirds of it lets the
//     lease end under a running handler (a detached handler is cancelled
//     first, at nine tenths of the lease without a renewal).
//   - TTL (server.Idempotency.TTL, 24 h): duplicates within a day
//     replay. Shorter: a late retry runs the call again.
//   - Waiting (on; server.Idempotency.NoWait turns it off): a concurrent
//     duplicate waits for the first call, bounded by its own deadline. Off: ABORTED
//     with a pushback, and the client's retry comes back.
//   - Fail closed (server.Idempotency.FailOpen, false): a store
//     failure is UNAVAILABLE with a retry hint, and nothing runs
//     unrecorded. Open: a duplicate may run the handler again.
//   - Unstored codes (server.Idempotency.UnstoredCodes):
//     UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, CANCELLED and
//     DEADLINE_EXCEEDED are released so a retry runs again. Storing more
//     makes transient failures final for the key's TTL.
//   - Exempt services: health and reflection run plainly, key or not, so a
//     health check is never a stale replay; a key policy naming them wins.
//   - Scope quota: a quarter of the store (WithScopeQuota here,
//     redisstore.WithScopeQuota for Redis, where it is a quarter of
//     maxmemory): one tenant's flood is refused at its quota, with
//     RESOURCE_EXHAUSTED and a RetryInfo, and the other tenants go on.
//     Off (WithScopeQuota(0, 0)): one scope can fill the store for all.
//   - Minimum retention (WithMinRetention, 1 minute): a duplicate within it
//     is replayed whatever others do. 0: a record may be evicted at once
//     when room is needed, and its duplicate run again.
//   - Redis eviction policy: redisstore.Open refuses one that may evict;
//     redisstore.WithAllowEvictingPolicy accepts it, and under memory
//     pressure a live claim may be evicted and its call run twice.
//   - Replays are marked: every answer for which the handler did not run
//     carries the response header idempotency-replayed: true
//     (wire.IdempotencyReplayed reads it); not configurable.
//
// Each call is also fingerprinted: SHA-256 of its request, marshalled
// deterministically. A key reused with a different request is refused with
// FAILED_PRECONDITION, and nothing of the first request or reply is
// revealed.
//
// # Semantics
//
//	first call with a key      claim the key under a lease, run the handler,
//	                           store its outcome with a TTL (default 24 h):
//	                           status code, message and details, reply bytes
//	                           (deterministic marshalling), the response header
//	                           and trailer metadata the handler set
//	duplicate, completed       replay the stored outcome: same reply bytes,
//	                           status with details, header and trailer, and
//	                           the header idempotency-replayed: true; the
//	                           handler does not run
//	duplicate, in progress     wait for the outcome (marked as a replay),
//	                           bounded by the duplicate's own deadline; or,
//	                           with waiting off, ABORTED with
//	                           grpc-retry-pushback-ms
//	same key, other request    FAILED_PRECONDITION
//	retryable failure          not stored; the claim is released, so a retry
//	                           runs the handler again: UNAVAILABLE,
//	                           RESOURCE_EXHAUSTED, ABORTED, CANCELLED and
//	                           DEADLINE_EXCEEDED (configurable), and a panic
//	store or scope full        RESOURCE_EXHAUSTED with RetryInfo; the handler
//	                           does not run, fail open or not (see below)
//	caller gives up            the handler goes on, detached (at most 30 s by
//	                           default), and its outcome is stored
//	owner crashed              its lease ends (default 30 s; renewed every
//	                           lease/3 while the handler runs): a duplicate then
//	                           claims the key and runs the call
//	health, reflection         run plainly, key or not, unless a key policy
//	                           names them
//	reply over the store bound not stored, claim released, reply returned,
//	                           a warning logged; duplicates run again
//	no key                     the handler runs, unless the method requires a
//	                           key (INVALID_ARGUMENT) or ignores keys
//	streaming method           runs, key or not: keys apply to unary methods
//	                           only, and a key policy (other than Ignored)
//	                           naming a streaming method is refused: by
//	                           server.New when the protobuf
//	                           registry knows the method, else each call
//	                           fails with FAILED_PRECONDITION
//
// Waiting: duplicates in the same process coalesce, singleflight-style, on
// the first call; they take its outcome when it was stored (or was a
// mismatch), and otherwise compete for the key again. Duplicates in other
// processes poll the store with a backoff (10 ms doubling to 500 ms, never
// past the owner's lease) until the key completes, is released (then one of
// them claims it and runs the call) or their deadline passes.
//
// Outcomes are stored even when the caller has gone: an OK reply produced
// after the caller's deadline is stored, and the caller's retry gets it.
// That is the point of the key.
//
// A keyed call belongs to the server once its handler starts. By default
// the owner's handler runs on a context that the caller's deadline and
// cancellation do not reach, bounded instead by a server-side maximum
// (server.Idempotency.DetachedMax, default 30 s from the
// handler's start) and by its lease (if the lease is lost, the handler's
// context is cancelled). So a handler that commits (a card charged) and
// finishes after its caller's deadline has passed stores its outcome, and
// the caller's retry replays it: one charge. What it protects: exactly
// once for handlers that cannot undo their work when their context ends.
// The cost: the server works, up to the maximum, for a caller that may not
// come back, and the handler's downstream calls carry the server's bound,
// not the caller's deadline. The opt-out,
// server.Idempotency.AttachedHandler, runs the handler on the
// caller's context: the caller's end cancels it, and its CANCELLED or
// DEADLINE_EXCEEDED is released, not stored, so the retry runs it again
// (right only for handlers whose work is undone with their context).
//
// # The lease
//
// A claim is held under a lease. If the owner's process dies, the lease ends
// and the key is free again (default 30 s). The key is claimed for the
// lease, never for the caller's deadline (which the caller chooses), and
// while the handler runs the interceptor renews the lease every lease/3
// ([Store.Renew]), so a slow handler keeps its key however long it runs.
// The bound an operator gets: when an owner dies, a duplicate on another
// replica runs the call at most one lease after the owner's last renewal,
// so at most one lease after the owner died (a test measures 1.0 s with a
// 1 s lease, where a first caller with an hour left used to hold the key
// for that hour). A lease can still end under a
// running handler when renewals fail (the store is unreachable for longer
// than two thirds of the lease) or the store loses it (see the Redis
// store's documentation on eviction and failover); then:
//
//   - the outcome is stored all the same if no other call has claimed the
//     key since ([Store.Complete] takes an absent key);
//   - duplicates waiting in the same process take the outcome in every
//     case, stored or not;
//   - a duplicate in another process may have claimed the key and run the
//     call too: that is the one case where a call runs twice, and it is
//     logged. A detached handler (the default) is cancelled before that can
//     happen: when nine tenths of its lease have passed since the last
//     renewal the store granted (or its claim), its context ends, since the
//     interceptor cannot know whether the store still holds the key; a
//     duplicate elsewhere claims the key only once the lease has ended, so
//     it never starts while the handler's context is live. A handler that
//     ignores its context, or one on the caller's context
//     (server.Idempotency.AttachedHandler), may still run concurrently with it.
//
// # Store outages: fail closed or open
//
// When the store fails (an outage, a timeout), a keyed call fails closed by
// default: UNAVAILABLE, which clients retry, and the
// handler does not run. With server.Idempotency.FailOpen the
// handler runs without idempotency instead, logged, and a duplicate may run
// it again.
//
// # The memory store
//
// [MemoryStore] keeps records in process memory, for a single replica. It is
// split into shards (default 16), each with its own lock and an equal share
// of the bounds: entries (default 100,000) and bytes (default 64 MiB of
// heap: [Record.Size] and each entry's slot, index and key strings, rounded
// to the allocator's size classes, which a test holds within 20% of what
// runtime.MemStats measures). One record is at most 1 MiB by default. Expiry is lazy: leases and records that have
// ended are dropped when touched or when room is needed, so the store has no
// goroutine and nothing to close.
//
// Retention, exactly: a completed record is replayed until its TTL ends
// (default 24 h), unless it is evicted for room; it is never evicted before
// the minimum retention (WithMinRetention, default 1 minute, or its TTL if
// shorter). When a shard needs room it drops ended entries, then evicts the
// oldest completed records past their minimum retention; it never evicts a
// live lease or a younger record. When that is not enough, the claim is
// refused with a [*FullError] (wrapping [ErrStoreFull]) whose RetryAfter
// says when room may come; the interceptor answers RESOURCE_EXHAUSTED with
// a google.rpc.RetryInfo, and the handler does not run. So a duplicate that
// arrives within the minimum retention is replayed, whatever other callers
// do, and one that arrives later is replayed if no newer call needed its
// room. [MemoryStore.Stats] counts evictions and refusals.
//
// Per-scope quotas (WithScopeQuota) bound what one scope holds, so a flood
// from one caller is refused at its quota and leaves room for the others; a
// scope over its quota evicts only its own records past the minimum
// retention. By default a scope holds at most a quarter of the store (of
// its entries and of its bytes: 25,000 entries and 16 MiB with the
// defaults), so one tenant's flood of unique keys leaves three quarters to
// the others. A server whose callers all share one scope
// (server.SharedScope) sets the quota to what that
// scope may use, or turns it off with WithScopeQuota(0, 0); without a
// quota one scope can fill the store, and then every scope's new claims are
// refused until records age past the minimum retention (nobody's record is
// lost, but new calls wait).
//
// The byte bounds are checked when a key is claimed: an owner's outcome is
// always stored, even past a bound (refusing it would run the handler
// again), and claims are refused while a shard or scope is over. The excess
// is at most the records of the calls in flight at once.
//
// # Concurrency
//
// Every Store method is safe for concurrent use, and each operation on one
// key is atomic. Records returned by Claim are shared and must not be
// modified.
package idempotency
