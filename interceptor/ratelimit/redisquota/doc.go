// Package redisquota shares a server's rate limits among all its replicas
// through Redis (go-redis v9, a single server or Redis Cluster), with
// token leasing: the quota is exact across the replicas, and Redis stays
// off the hot path.
//
// # How it works
//
// Redis runs GCRA on each key's whole quota, on its own clock (TIME), in
// a Lua script: one hash per key holds the theoretical arrival time. A
// replica does not ask Redis about each call: when the tokens it holds of
// a key run low, it leases the next batch in one round trip, in the
// background, and decides calls from what it holds, in memory
// (internal/ratelimit's Shared: its package doc has the algorithm and its
// bounds). A lease is a run of slots of Redis's schedule: each token may
// be spent from its slot on, never earlier, so the replicas together
// admit what one GCRA would, but for the tokens a replica spends after
// their slots. Its size follows the replica's own demand over the last
// half lease period: a quiet replica leases little and hoards nothing, a
// busy one leases up to a lease period of the rate, and leases reach at
// most a lease period (200ms by default) ahead of Redis's clock.
//
// Bounds, in any interval: at most the burst and the rate over the
// interval, plus the tokens whose slots came before it and that the
// replicas still held: at most the leased batches, two leases per replica
// and key, each at most a lease period of the rate. A replica that dies
// takes with it at most a lease period of the quota. Round trips: at most
// one per lease, a lease per half lease period at most for a replica as
// busy as the rate, fewer calls when a replica is slower. On fake time, 4
// replicas offered 4 times a per-tenant rate of 1,000/s, 70/10/10/10, admit
// 1,000 ± 12 calls each second at one round trip per 27 admitted calls;
// against a real redis-server, tests hold three replicas flooding one key
// to no more than the burst and the rate by their leases.
//
// A key's first call on a replica waits for its first lease (one round
// trip); a call that finds the replica's tokens spent and the next lease on
// its way waits for it too, at most the lease timeout (WithLeaseTimeout,
// 100ms) and never past its context.
//
// # Keys and Redis Cluster
//
// Each key of each limit is one Redis hash named prefix + "{" + limit +
// ":" + h + "}", where h is the unpadded base64url of the first 12 bytes
// of the key's SHA-256: the braces are the Cluster hash tag, so every key
// is a slot of its own, a limit's keys spread over the primaries, and a
// caller who chooses the key (a tenant name) can neither choose the slot
// nor grow the name. The script touches that one key, so it runs on the one
// primary that serves the slot; during a slot migration it follows the
// ASK and MOVED redirections like any command (go-redis does; keep
// MaxRedirects at its default or above), atomic on whichever node holds
// the key at that moment (a test migrates a key's slot while two replicas
// lease it: no call waits past the lease timeout, and the count stays
// within the burst and the rate). A key lives in Redis
// while its bucket refills or a replica counts among its sharers (the
// replica window, 10 s); an idle key costs nothing. This replica remembers
// at most MaxKeys keys of a limit (10,000); the keys beyond share one
// bucket, whose leases go to one Redis hash of their own, prefix + "{" +
// limit + ":overflow}", which the keys beyond the bound share over every
// replica.
// A key's first call on a replica costs a round trip, so a caller who may
// name any tenant can make the replica ask Redis once per new name, up to
// MaxKeys names at a time (a name is forgotten a few lease periods after
// its last call, when the replica holds nothing of it): key a limit by a
// tenant the server verified (server.Limits.Tenant), or keep MaxKeys low.
//
// # When Redis is unreachable
//
// A lease that fails (an error, Redis down, a Cluster primary down for the
// slot), or that a call waited for longer than the lease timeout, puts the
// limit in fallback: one warning in the log ("redisquota: Redis is
// unreachable: the rate limit decides by its fallback", with the limit,
// the mode and the error) and resilience.server.ratelimit.fallbacks counts
// it. In fallback no call waits for Redis, a lease goes to Redis once per
// probe interval (250ms) to find out whether it is back, and the calls are
// decided by the limit's Fallback:
//
//   - FallbackLocalShare, the default: the tokens a replica holds are
//     spent first, then each key gets a local bucket of the rate and burst
//     divided by the replicas that leased it within the replica window, as
//     Redis counted them at the last lease, starting empty. The replicas together keep about the rate while they are as
//     many as they were; in the second an outage begins, at most a lease
//     period of the rate more (what they held), and when Redis is back at
//     most its burst and a probe interval of the rate more. A replica alone
//     in a key's window takes the whole rate: a replica that never saw the
//     others (it started during the outage) overshoots by as many times as
//     there are replicas.
//   - FallbackOpen: every call is admitted; the limit is off until Redis is
//     back. For a limit that protects nothing critical.
//   - FallbackClosed: only the tokens held are spent; every other call is
//     refused, told to come back at the next probe (after a probe interval
//     while a probe waits for a Redis that hangs). For a quota that must
//     never be exceeded (a paid API's), at the price of an outage of the
//     limited calls with Redis.
//
// The first lease Redis answers ends the fallback: an info line ("redisquota:
// Redis answers again"), and the leases are exact again from there (tests
// kill redis-server and restart it: leasing again 0.1 to 0.2 s after the
// restart; go-redis may take up to a second to dial again after failed
// dials). A Redis restarted without persistence has lost the keys: each
// starts with a full burst.
//
// Redis's guarantees matter less here than for the idempotency store: a
// lost key (evicted under an evicting maxmemory-policy, lost in a failover
// or a restart without persistence) gives the key a full burst again, so
// the limit is passed by at most a burst per loss, and no call ever runs
// twice. Under memory pressure with an evicting policy a hot key may be
// lost again and again; size maxmemory for one small hash per active key
// and limit (its TAT and a field per replica), or use noeviction, where a
// lease Redis refuses for memory is a failure like any other: the
// fallback.
//
// # Metrics
//
// With WithMeterProvider, by resilience.ratelimit (the limit's name, from
// the document, so bounded): resilience.server.ratelimit.leases (round
// trips, by resilience.ratelimit.outcome: granted, refused, failed),
// .leased_tokens, .lease.duration (seconds), .fallbacks (entries),
// .in_fallback (1 while in fallback), .forfeited_tokens (leased and never
// spent). The calls admitted and refused are the server's to count.
//
// # Lifecycle
//
// A Store holds no goroutine of its own; each lease runs in a goroutine
// that ends with its round trip, bounded by the lease timeout when the
// client applies contexts to its socket I/O (ContextTimeoutEnabled; New
// warns otherwise). Close waits for the leases in flight; after it, the
// limits decide by their fallback. Close the Redis client after the store.
package redisquota
