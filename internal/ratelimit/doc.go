// Package ratelimit is the engine of the rate limits: it decides whether
// one more call for a key (a tenant, a peer, one shared key) may go now,
// and when it could if not. It knows nothing of grpc; every method takes
// the time as a parameter.
//
// # Algorithm: GCRA
//
// A limit of Rate calls per Per with bursts of Burst is the generic cell
// rate algorithm (the leaky bucket as a meter, ITU-T I.371), which is a
// token bucket written as one number. A token comes every t = Per/Rate
// (the emission interval); the bucket holds at most Burst of them. Each
// key keeps its theoretical arrival time (TAT), the instant at which its
// bucket would be full again. A call at now moves it to
//
//	next = max(TAT, now) + t
//
// and is admitted when next − now ≤ Burst·t; then TAT = next. Refused, it
// changes nothing, and
//
//	wait = next − now − Burst·t
//
// is the exact time until a call would be admitted if none is admitted
// meanwhile: a server returns it as the pushback. Over any interval of
// length d, at most Burst + d/t calls of a key are admitted, and a
// caller that offers more than the rate gets exactly the rate: at 3×
// the rate, 1,000/s for 10 s of fake time gives 10,010 calls (the
// burst of 10 and the rest at the rate; TestAdmittedRateAtThreeTimesLoad).
//
// Why GCRA and not a counter of tokens: the state is one integer, so a
// decision is one compare-and-swap; it needs no refill step (time does
// it); and its wait is exact. x/time/rate keeps (tokens, last) as two
// floats under a mutex; failsafe-go's smooth limiter is the same idea as
// GCRA under a mutex, with no keys.
//
// Units: nanoseconds on a time line that starts at the Limiter's epoch
// (the instant given to New), read from time.Time by Sub, so on the
// monotonic clock. The interval is Per/Rate rounded to the nanosecond, so
// the rate is exact to within 0.5ns per token: 0.05% at 1,000,000 calls
// per second, nothing measurable at the rates of calls.
//
// # Criticality: who gets the last tokens
//
// A call carries one of four criticalities. Each keeps a reserve of the
// burst for the more critical ones: a call of criticality c is admitted
// only while, after it, at least (1 − BurstShare[c]) × (Burst − 1) tokens
// would be left, that is when
//
//	next − now ≤ Burst·t − (1 − BurstShare[c])·(Burst − 1)·t
//
// with BurstShare 1 for Critical and CriticalPlus, 3/4 for SheddablePlus
// and 1/2 for Sheddable. Under a sustained excess the bucket never refills
// past a token or two, so Sheddable calls are refused while Critical calls
// still get every token that comes (TestSheddableRefusedUnderSustainedExcess:
// Critical and Sheddable both at twice the rate, Sheddable gets 11 of
// 1,019). A class alone is still admitted at the full rate; it only sees a
// smaller burst. The last token is everyone's (the reserve counts the burst
// above one), so with a burst of 1 criticality changes nothing. CriticalPlus
// gets no more than Critical: the default criticality must see the burst it
// was configured with, and no call may take more.
//
// # Keys
//
// One Limiter holds a bucket per key in a hash table that decisions read
// without a lock (an atomic load, a hash with a per-Limiter random seed,
// a probe) and only new keys write to, under a mutex. The empty key has a
// bucket of its own. At most MaxKeys keys (10,000 by default) are
// remembered; when a new key comes and the bound is reached, the keys whose
// bucket is full again are forgotten (a sweep, which changes no decision:
// a full bucket is what a new key gets), and if none is, the new key
// shares the overflow bucket with every key beyond the bound, and with
// every key longer than MaxKeyLen (256 bytes). A sweep that finds nothing
// to forget is not tried again before the earliest instant at which a
// remembered key can have refilled, so a flood of new keys against a full
// set costs each O(1). Memory is bounded by MaxKeys: about 64 bytes per
// key of up to 40 bytes (held within its entry) and 32 per table slot,
// twice MaxKeys at most.
//
// # Shared limits: token leasing
//
// A Shared limiter is one replica's side of a limit whose rate is the
// total of every replica of a server. A store (Redis, in package
// interceptor/ratelimit/redisquota) runs GCRA on the whole quota, on its
// own clock, exactly as above; a replica does not ask it about each call
// but leases runs of tokens, and decides calls from what it holds.
//
//   - A lease of k tokens moves the store's TAT by k·t. The store grants
//     Want tokens, or as many as fit within the burst plus the lease period
//     L (TAT − now ≤ Burst·t + L after the grant), if at least Min fit;
//     otherwise none, and says when Min will. The tokens keep their slots
//     on the store's schedule: the i-th may be spent from its GCRA
//     admission time, TAT_before + i·t − Burst·t, on (at once, for a
//     burst), read on the replica's clock from the moment the answer
//     arrived, so never early. A lease reaching into the future is a
//     reservation: the replica admits its calls as the slots come.
//   - Want is the replica's demand over the last L/2 (its calls, admitted
//     or not), at most L of the rate; Min is L/10 of the rate, or Want if
//     less. A replica slower than the rate spends its run of slots late, at
//     its own pace: it asks for no more than it spends within L/4 of their
//     slots. So a quiet replica leases small batches and hoards nothing,
//     and a busy one leases large ones.
//   - A replica asks for its next lease when it holds less than half of
//     Want: one lease in flight per key, two held at most. A call that finds
//     nothing held and a lease on its way waits for it (Pending), bounded
//     by the caller. Tokens unspent 3·L/2 after their last slot are
//     forfeited (Forfeited counts them).
//
// Bounds. The store's schedule is exact, and a token is never spent
// before its slot, so the calls the replicas admit in any interval of
// length d are at most Burst + d/t plus the tokens whose slot came before
// the interval and that were still held when it began: at most the
// leased batches the replicas held, two leases of at most L of the rate
// each. On fake time, 4 replicas offered 4 times a per-tenant rate of
// 1,000/s, 70/10/10/10, admit 1,000 ± 12 calls each second after the first,
// at one round trip per 27 admitted calls, and a second tenant at its own
// limit on the same replicas gets, second by second, exactly what one local
// limiter gives the same calls (TestSharedFourReplicasExactEachSecond). A
// replica that dies takes with it the slots it held, at most one lease
// period of the rate; the others lease the rest (TestSharedReplicaKilled).
//
// A store that does not answer (a lease failed, or a caller gave up
// waiting for one: Expire) puts the limiter in fallback until a lease is
// answered again; in fallback it asks one lease per ProbeInterval (250ms),
// and decides by its FallbackMode: FallbackLocalShare (the default) gives
// each key a local bucket of the rate and burst divided by the replicas
// that leased tokens of the key within the ReplicaWindow (10 s, as the
// store counted them at the last grant), starting empty, for the calls
// the tokens it holds (its own: the store counted them) do not cover;
// FallbackOpen admits everything; FallbackClosed admits only what the held
// tokens cover. With the local share, the replicas together admit about
// the rate while they are as many as they were, and in the second the
// outage begins at most one lease period of the rate more (the leases they
// held, spent beside their shares); when the store is back its bucket is
// full and the replicas still in fallback keep their shares until their
// next probe, so at most the burst and a probe interval of the rate more
// (TestSharedOutageBoundAndReturn: 1,138 and 1,143 against 1,000; exact
// again the second after). Spending the held tokens keeps a brief blip (one
// lease answered late) from costing the replica its reserved slots.
//
// Criticality holds in a shared limit too: a call leaves at least its
// reserve, counted in the tokens whose slot has come and those the store's
// bucket held at the last grant, so on a saturated key Sheddable calls are
// refused while Critical ones take the slots as they come.
//
// A Shared limiter bounds its keys as a Limiter does; a key is forgotten
// when it holds no lease, has none in flight, the store set it no wait,
// its demand is a lease period old and its local share is full.
//
// # Pacing a client
//
// Pace is the client's side of a server's pushback: after an answer that
// says to come back after w, the attempts of the method go one per w (the
// longest wait asked since the pacing began), each in a slot of its own;
// each admitted attempt halves the spacing, and the pacing ends when it is
// under a millisecond. An attempt whose slot is further than its caller
// may wait fails at once, locally. So a method sends about one attempt per
// pushback period into a limit, where a plain retry loop sends one per
// call: in real time on loopback, 1.08 to 1.10 refused attempts per period
// against 10.2 to 11.3 (bench/ratelimit/cmd/pacing).
//
// # Concurrency
//
// A Limiter is safe for concurrent use. A decision on a remembered key
// takes no lock and allocates nothing: it loads the key's TAT, computes
// next, and compare-and-swaps it, again on a race; a refusal writes
// nothing. Decisions at one instant on one key admit exactly the burst,
// whatever the interleaving. A sweep forgets an entry by swapping its TAT
// to a dead mark, so a decision racing with it either moves the TAT
// first (and the entry is kept) or finds it dead and looks the key up
// again; no admission is ever lost in a forgotten entry. A Shared limiter
// takes one mutex per key for a decision, held for a few comparisons, and
// allocates nothing unless it asks for a lease; it does no I/O and starts
// no goroutine: its caller sends the leases.
package ratelimit
