// Package adaptive is client-side adaptive throttling, as in the SRE book
// ("Handling Overload"): a client that keeps track of how many requests it
// tried and how many the backend accepted rejects new requests locally,
// before they cost the backend anything, with probability
//
//	p = max(0, (requests − K·accepts) / (requests + 1))
//
// over the last Window, at most MaxRejectProbability (0.9). requests counts
// the requests the backend answered and those the throttle rejected;
// accepts those the backend accepted. While the backend accepts everything,
// p = 0 (for K ≥ 1). When it accepts only a rate A, the client settles
// where it sends about K·A: with a backend whose capacity is 30% of the
// offered load and K = 2, 60% of the requests go out and 40% are rejected
// locally. K trades the waste of requests the backend rejects (larger K)
// against the backend's headroom when it recovers (smaller K). There are no
// open or closed states.
//
// # What counts
//
// A request that goes out is counted once its outcome is known (Done), not
// when it is sent: a fresh client that sends 64 requests to a method taking
// 500ms would otherwise see 64 requests and no accept, and reject most of
// the next ones before any answer came. A request that never reached the
// backend (another guard of the client refused it: a full bulkhead, a
// spent deadline) is not counted at all: only what the backend answered, and
// the throttle's own rejections, count.
//
// # Recovery
//
// The SRE book's window (two minutes; one by default here) is meant for
// steady rates. After an outage it remembers the refusals for a whole
// window, and since the requests rejected locally count as requests, p falls
// only as accepts catch up: a fresh client that saw a 1.5s outage at 200
// requests a second sent under 1% of them for most of a minute. So the
// throttle keeps a second, short window (ShortWindow, one second), and once
// the backend has refused nothing for a quarter of it, p is the formula over
// the short window when that is lower: the client follows the backend
// within seconds (TestRecoversWithinSeconds: 90% of the requests accepted
// again 1.5s after the backend is back). While the backend refuses, the
// long window alone decides, so the K·accepts equilibrium holds
// (TestSettlesNearKTimesAccepts: 0.68 of the load sent against a backend
// accepting 0.3, as without the short window). The cap of 0.9 lets a tenth
// of the requests reach a backend that refuses everything (the formula
// alone: about 1/requests): they are the requests that show it has
// recovered; the price is a tenth of the load on a backend that is down.
//
// # Window
//
// The counts are kept in 16 buckets of Window/16 (and of ShortWindow/16),
// so a count leaves a window between 15/16 and 16/16 of it after it was
// made. Buckets are rotated lazily from now on each call: no timers, no
// goroutines.
//
// # Randomness and concurrency
//
// The draw uses a PCG generator seeded at construction, so a test with a
// given seed sees one sequence. A [Throttle] is safe for concurrent use;
// each call takes one mutex and allocates nothing.
package adaptive
