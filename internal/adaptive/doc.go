// Package adaptive is client-side adaptive throttling, as in the SRE book
// ("Handling Overload"): a client that keeps track of how many requests it
// tried and how many the backend accepted rejects new requests locally,
// before they cost the backend anything, with probability
//
//	p = max(0, (requests − K·accepts) / (requests + 1))
//
// over the last Window. requests counts every request the application
// tried, those rejected locally included; accepts those the backend
// accepted. While the backend accepts everything, p = 0 (for K ≥ 1). When
// it accepts only a rate A, the client settles where it sends about K·A:
// with a backend whose capacity is 30% of the offered load and K = 2, 60% of
// the requests go out and 40% are rejected locally. K trades the waste of
// requests the backend rejects (larger K) against the backend's headroom
// when it recovers (smaller K). There are no open or closed states: when
// the backend recovers, accepts catch up and p falls to 0 as the old counts
// leave the window, within one Window.
//
// # Window
//
// The counts are kept in 16 buckets of Window/16, so a count leaves the
// window between 15/16·Window and Window after it was made. Buckets are
// rotated lazily from now on each call: no timers, no goroutines.
//
// # Randomness and concurrency
//
// The draw uses a PCG generator seeded at construction, so a test with a
// given seed sees one sequence. A [Throttle] is safe for concurrent use;
// each call takes one mutex and allocates nothing.
package adaptive
