// Package redisstore is an idempotency.Store in Redis (go-redis v9), so that
// every replica of a server sees the same records: a call runs once however
// many replicas its duplicates reach.
//
// # Data model
//
// Each record key (scope, method, idempotency key) is one Redis hash named
// prefix + "{" + S + ":" + p + "}" + M. S is the unpadded base64url of the
// first 16 bytes of the SHA-256 of the scope (preceded by its length); p
// is the scope's partition of the key, a hash of the record key modulo the
// partitions (WithScopePartitions); M is the unpadded base64url SHA-256
// of the scope and the method, each preceded by its length, and the key.
// The braces are a Redis Cluster hash tag: a partition's keys share one
// slot, and since the client's text is hashed, a client cannot choose the
// slot (a "{t}" in its key is just bytes) nor grow the key name; its keys
// fall in its own scope's partitions, which the server chose. The prefix
// must not contain braces. The hash has fields f (request fingerprint), o
// (owner token, while in progress) and r (the record, a
// resilience.idempotency.v1.Record with its format version, once
// completed). Its time to live is the lease while in progress and the
// record TTL once completed, so a crashed owner's claim ends by itself.
//
// Each partition also has two accounting keys in its hash tag, ending in
// "#z" (a sorted set: each entry's member M and the time, on Redis's
// clock, when it may go: its lease's end, or its record's minimum
// retention) and "#s" (a hash: each entry's bytes, and their sum); they
// live as long as the partition's longest-lived entry. This layout came
// with the scope quota (issue 21): records written under the earlier one
// (prefix + "{" + M + "}") are not found by this version, so duplicates of
// calls made before an upgrade run again; upgrade between bursts of
// retries, or give the new version its own prefix and let the old records
// age out.
//
// # Per-scope quota
//
// One tenant must not fill Redis for everyone: on a noeviction Redis
// (which Open requires), a full Redis refuses every write, so every
// tenant's keyed calls would fail. Each scope has a quota of entries and
// bytes (WithScopeQuota): by default a quarter of maxmemory in bytes (the
// smallest primary's on a Cluster; DefaultScopeBytes when Open cannot read
// it, it is not set, or the store comes from New) and no entry bound. The
// bytes counted are each entry's key names, fields and Redis's own
// structures for them (entryOverhead): within 25% of what used_memory
// grows by (a test holds leases, records of 100 bytes and records of 2 KB
// to it; measured 2% to 5% under). The claim's script checks and updates
// the quota in the same atomic step as it takes the key, on the primary
// that holds the partition: concurrent claims from any number of replicas
// never pass it together. A claim over it first drops the partition's
// ended entries and evicts its oldest completed records past the minimum
// retention (WithMinRetention, default 1 minute); then it is refused with
// an error wrapping an idempotency.FullError (Scope true) whose RetryAfter
// is when the oldest entry may go: the interceptor answers
// RESOURCE_EXHAUSTED with a google.rpc.RetryInfo, and the handler does not
// run. Nothing of another scope is read or evicted. An owner's outcome is
// always stored, even past the quota (refusing it would run the handler
// again), so calls in flight together, which all passed their claims, can
// take a scope past its quota by their records (at most
// WithMaxRecordBytes each): Complete first evicts the scope's own records
// past the minimum retention, and a record that still does not fit is
// stored and replayed, but kept for the minimum retention only, not its
// TTL. So a burst's excess goes by itself: a test's 64 concurrent calls of
// 250 KB under a 4 MB quota on a 16 MB noeviction Redis ran it out of
// memory, and other tenants were refused (RESOURCE_EXHAUSTED) until the
// minimum retention had passed, where before they were refused for the
// records' TTL, a day. Bound a tenant's calls in flight (a concurrency
// limit) or the record size where that minute matters.
//
// When Redis itself refuses a claim for memory (an OOM error: other data
// filled it, or the quotas add up past maxmemory), the error wraps a
// FullError of the store (Scope false, RetryAfter 1 s): RESOURCE_EXHAUSTED
// with a RetryInfo rather than UNAVAILABLE, and a warning in the log, at
// most every 10 s, says to lower the quotas or raise maxmemory. Size the
// quotas so that the tenants that may flood at once fit: at a quarter each,
// four flooding tenants can still fill Redis. Tests flood one tenant
// through the interceptor on a noeviction server of 8 MB and on 3 Cluster
// primaries of 4 MB each, with default options: the flooder is refused at
// its quota and no other tenant's keyed call fails (without the quota,
// Redis ran out of memory after about 1,100 calls of 4 KB and every tenant
// got UNAVAILABLE).
//
// Across slots, exactly: a scope's quota is split evenly over its
// partitions (entries/partitions and bytes/partitions each), and each
// partition is one hash tag, one slot, counted atomically on its own; no
// script reads two slots, so the quota is exact per partition, and a
// scope's total passes it only by the records of its calls in flight, for
// their minimum retention (above). A scope whose keys hash unevenly is
// refused in its fullest partition before its total reaches the quota,
// while its keys of the other partitions are still taken: with 16
// partitions, a scope of random keys is first refused at about 80% of a
// quota worth 1,000 entries, 93% of one worth 10,000 and 98% of one worth
// 100,000 (medians of simulations), and in every partition at 100%. With
// one partition (the default on a single server, or
// WithScopePartitions(1)) the quota is exact. On a Cluster a scope has 16
// partitions by default, so one scope's load (the shared scope's, a big
// tenant's) spreads over 16 slots and the primaries serving them, and it
// holds at most its quota on any one primary.
//
// # Redis Cluster
//
// The store works on Redis Cluster through a *redis.ClusterClient (any
// redis.UniversalClient will do): each script names a record's key and its
// partition's two accounting keys, all three in one hash tag, hence one
// slot, and touches no key outside that slot (an evicted record is of the
// same partition), so every operation runs on the one primary that serves
// the slot. A scope's partitions spread its records over up to 16 slots,
// and scopes spread over all of them. During a slot migration the scripts
// follow the cluster's ASK and MOVED redirections like any command
// (go-redis does; keep MaxRedirects at its default or above), and a script
// runs on whichever node holds the slot's keys at that moment, atomically.
// [Open] reads the maxmemory-policy and maxmemory of every primary. A
// primary that is down makes the calls of its slots fail (UNAVAILABLE when
// the server fails closed) until it is back or a replica took over; see
// Failover for what a promoted replica may have missed. Tests run the
// conformance suite on a local cluster of 3 primaries, and keyed calls
// through the server interceptor during a slot migration and a primary's
// SIGKILL and restart: no completed record was executed twice.
//
// # Operations and round trips
//
// Every operation is one Lua script, hence atomic, and one round trip
// (EVALSHA; the first use of each script on a server whose script cache does
// not hold it yet costs one more round trip, for the EVAL fallback):
//
//   - Claim, when the key is absent, makes room within the scope's quota
//     (or refuses), creates the hash with the fingerprint and a fresh
//     random owner token, sets the lease and accounts for the entry;
//     otherwise it returns mismatch, the stored record, or the lease's
//     remaining time, in that order of checks. A replay therefore costs one
//     round trip, and reads no accounting. A claim by the token that
//     already holds the key owns it again, with a new lease (see Failures).
//   - Complete checks the owner token (or that the key is absent: the lease
//     ended and no one claimed it since), stores the record, drops the
//     token, sets the TTL and accounts for the record's bytes, in one step.
//     The first execution of a call costs two round trips: Claim and
//     Complete.
//   - Renew checks the owner token and sets a new lease; the interceptor
//     renews every lease/3 while the handler runs.
//   - Release checks the owner token, deletes the key and its accounting.
//
// Records larger than the bound (WithMaxRecordBytes, default 1 MiB) are
// refused before anything is sent.
//
// # Failures
//
// A Redis error is returned as is (wrapped); the interceptor decides what a
// store outage means. Failing closed (the default), a keyed call whose
// Claim fails gets UNAVAILABLE with a retry hint (a google.rpc.RetryInfo
// detail and the grpc-retry-pushback-ms trailer) and the handler does not
// run; failing open (server.Idempotency.FailOpen), the
// handler runs without idempotency, and each such call is logged with
// "running the handler without idempotency (fail open)". When Claim
// succeeded and Complete then fails (Redis died while the handler ran), the
// caller still gets the handler's outcome, which is not stored: the key
// stays claimed until its lease ends (the release fails too; a Redis
// restarted without persistence has lost the claim at once), then a
// duplicate runs the handler again. A record that Redis acknowledged is
// never executed again while Redis keeps it: Redis killed (SIGKILL) during
// a burst of keyed calls, tests count 0 such executions.
//
// A Claim that fails may still have taken the key: Redis ran the script and
// the reply was lost, typically to the caller's deadline. Such an orphan
// claim would block every retry of the call, on every replica, for the
// whole lease. So a failed Claim releases its token before it returns, on a
// context detached from the caller's and bounded by 500 ms; the key is then
// free for a retry on any replica. When Redis does not confirm that release
// (it failed too, or it may have run before a delayed claim), the Store
// remembers the token, at most 1024 of them, each until the lease would end,
// and its next Claim of that key for the same request (the retry, when it
// reaches the same replica) claims with it, which takes the key over at
// once. A retry that reaches another replica then waits for the lease, as
// before.
//
// Every operation returns once its context is done (its deadline passed or
// it was cancelled), whatever Redis does, as the idempotency.Store contract
// asks: go-redis by default reads a reply until its own ReadTimeout (5 s)
// whatever the context says, and with ContextTimeoutEnabled it heeds only a
// deadline, never a cancellation, so the store runs each round trip on a
// goroutine of its own when the context can end, and returns at the
// context's end with an error wrapping the context's error. The round trip
// goes on to the client's own timeouts; a Claim that comes back having
// taken the key after its caller went is released then, and a failed
// Claim's release (above) is bounded by its 500 ms whatever the client
// does. Setting ContextTimeoutEnabled on the client also bounds the
// abandoned round trips, and so the connections they hold, by the
// contexts' deadlines.
//
// A client for this store should keep go-redis's retries low (MaxRetries, and
// DialerRetries, whose default of 5 dials 100 ms apart makes each call wait
// half a second while Redis is down), since a caller waits for them. Know
// also that once a go-redis client's dials have failed PoolSize times, it
// fails every command at once, without dialing, until a probe it dials
// once a second succeeds: after Redis is back, calls keep failing (fail
// closed: UNAVAILABLE) for up to about a second. Tests measured 10 ms to
// 970 ms from the restart to a working store.
//
// # Eviction, persistence and failover
//
// The store's guarantees hold only while Redis keeps what it was told:
//
//   - Eviction: with maxmemory set and a maxmemory-policy other than
//     noeviction, Redis drops keys under memory pressure. volatile-ttl drops
//     live claims first (their TTL is the shortest), the LRU and LFU
//     policies drop claims and records alike; a duplicate then claims the
//     key and runs the call while its owner still runs, or runs a completed
//     call again. Use noeviction: writes then fail with an OOM error, which
//     the store turns into a FullError (the interceptor answers
//     RESOURCE_EXHAUSTED with a retry hint) and the handler does not run;
//     the per-scope quota keeps one tenant from taking Redis there. [Open]
//     reads the policy at startup and refuses any other (an error naming
//     the policy and the fix) unless WithAllowEvictingPolicy accepts it,
//     with a warning; it tolerates CONFIG being disabled (a warning), as
//     managed services often disable it. It reads it then only: a policy
//     changed later (CONFIG SET, a replica promoted with another
//     configuration, a primary added to a cluster) goes unseen, so pin it
//     where Redis is configured. [New] does not contact Redis, so it checks
//     nothing: prefer Open.
//   - Persistence: a Redis restarted without persistence (no AOF, no RDB)
//     has lost every claim and record. Precisely: a duplicate of a call
//     that completed before the restart finds the key absent, claims it and
//     runs the handler again, once (its record is then stored, and later
//     duplicates replay it); a call that was running at the restart loses
//     its claim, and a duplicate may run concurrently with it. With RDB
//     snapshots the same holds for what came after the last snapshot; with
//     appendonly yes and appendfsync everysec, for at most about a second of
//     writes; with appendfsync always, every acknowledged claim and record
//     survives a SIGKILL (each write is fsynced before Redis replies), at
//     the cost of one fsync per write. Tests kill Redis during a burst and
//     show both: without persistence each completed key runs once more
//     after the restart, with appendfsync always none does. Size the TTL to
//     what the data must survive.
//   - Failover: replication is asynchronous, so a failover guarantees
//     nothing for the writes of the last moments before it. A claim or
//     record acknowledged by the primary and not yet copied to a replica is
//     lost when that replica is promoted (by Sentinel, by the cluster, or
//     REPLICAOF NO ONE): a duplicate then runs the call again, after it
//     (the record was lost) or concurrently with a live owner (the claim
//     was lost; the owner's Renew and Complete then find the key absent and
//     store the outcome anyway, or find the duplicate's claim and give up).
//     What a failover does guarantee: a write the replica received before
//     its promotion survives it (WAIT 1 on the primary confirms that), and a
//     call whose record survived replays. Tests show each case with a
//     primary, a replica cut off before the write, the primary killed and
//     the replica promoted. By default the store does not WAIT after its
//     writes, to keep one round trip per operation. WithMinReplicas(n,
//     timeout) makes a Claim that takes a key, and a Complete, WAIT for n
//     replicas on the write's connection: a claim no replica acknowledged
//     in time is released and the Claim fails (the handler does not run),
//     so a promoted replica that acknowledged it holds the claim. This
//     narrows the window, it does not close it (WAIT does not make Redis
//     strongly consistent: the promoted replica may be one that had not
//     acknowledged, unless n counts every replica), and it costs one round
//     trip more per first execution's Claim and Complete, none per replay.
//
// The Store holds no connection of its own (close the client to release
// its connections) and no goroutine but one per round trip whose context
// can end, which ends with the round trip.
package redisstore
