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
// # Concurrency
//
// A Limiter is safe for concurrent use. A decision on a remembered key
// takes no lock and allocates nothing: it loads the key's TAT, computes
// next, and compare-and-swaps it, again on a race; a refusal writes
// nothing. Decisions at one instant on one key admit exactly the burst,
// whatever the interleaving. A sweep forgets an entry by swapping its TAT
// to a dead mark, so a decision racing with it either moves the TAT
// first (and the entry is kept) or finds it dead and looks the key up
// again; no admission is ever lost in a forgotten entry.
package ratelimit
