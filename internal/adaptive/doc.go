// Package adaptive is client-side adaptive throttling after the SRE book
// ("Handling Overload"): a client rejects requests locally, before they
// cost the backend anything, with a probability p that settles where the
// client sends K times what the backend accepts. With a backend whose
// capacity is 30% of the offered load and K = 2, 60% of the requests go out
// and 40% are rejected locally. K trades the waste of requests the backend
// rejects (larger K) against the backend's headroom when it recovers
// (smaller K). There are no open or closed states.
//
// # The probability
//
// The SRE book computes p = max(0, (requests − K·accepts)/(requests + 1))
// over a window of minutes, where requests include those the throttle
// rejected itself. Its equilibrium is the one above; its memory is the
// window's: after an outage the window holds the outage's refusals, and
// the local rejections keep adding requests with no accepts, so p falls
// only as fast as the few requests it lets out are accepted, and a
// residual error rate keeps it up. A fresh client at 2,000 requests a
// second, after an outage of 1 to 1.5 s, admitted 19 to 25% of the next
// 1.5 s; 12% with 1% of the requests still failing.
//
// Here p moves with the backend's answers alone. Each request that went
// out moves it, once its outcome is known (Done), by
//
//	p ← clamp(p + Step × (refused − (1 − 1/K)), 0, MaxRejectProbability)
//
// with Step = 0.02 and refused 1 for a refusal, 0 for an acceptance: up by
// Step/K for a refusal, down by Step·(1 − 1/K) for an acceptance (0.01 each
// for K = 2). A local rejection moves nothing: it says nothing of the
// backend. p stops moving when a share 1 − 1/K of the requests sent is
// refused, that is when the client sends K times what the backend accepts,
// the SRE book's equilibrium (TestSettlesNearKTimesAccepts: 0.6 sent
// against a backend accepting 0.3). In a full outage every answer is a
// refusal and p rises to MaxRejectProbability (0.9) within about
// 0.9·K/Step = 90 refusals; once the backend is back, each acceptance
// lowers it, and since more go out as p falls, p is back near 0 within
// about 0.9/(Step·(1 − 1/K)) = 90 acceptances: 0.1 s at 2,000 requests a
// second, whatever small error rate remains (1% of failures only slows it
// by 2%), and the same in an open or a closed loop, since only answers
// count (TestRecoversWithin200ms). The cap of 0.9 lets a tenth of
// the requests reach a backend that refuses everything: they are the
// requests that show it has recovered; the price is a tenth of the load on
// a backend that is down. A K below 1.05 acts as 1.05 here, so that p can
// fall when the backend accepts nearly everything.
//
// After Window/4 (15 s by default) without an answer, p halves every
// Window/4, so that a probability left high by an outage that no traffic
// shows over does not outlive it. While answers keep coming, time alone
// moves nothing: a decay between answers would settle p below the
// equilibrium above.
//
// # What counts
//
// A request that goes out counts once its outcome is known (Done), not
// when it is sent: a fresh client that sends 64 requests to a method taking
// 500ms would otherwise see 64 requests and no accept, and reject most of
// the next ones before any answer came. A request that never reached the
// backend (another guard of the client refused it: a full bulkhead, a spent
// deadline) does not count at all. Snapshot reports the requests tried and
// accepted over the last Window (one minute by default) for observability.
//
// # Window
//
// The counts are kept in 16 buckets of Window/16, so a count leaves the
// window between 15/16 and 16/16 of it after it was made. Buckets are
// rotated lazily from now on each call: no timers, no goroutines.
//
// # Randomness and concurrency
//
// The draw uses a PCG generator seeded at construction, so a test with a
// given seed sees one sequence. A [Throttle] is safe for concurrent use;
// each call allocates nothing and takes one mutex, but for Allow while the
// probability is 0, which takes none.
package adaptive
