// Package breaker is the circuit breaker engine: one Breaker guards one
// method, fails attempts fast while the method is unhealthy, and probes for
// its recovery. It knows nothing of gRPC: the caller decides which results
// are failures and reports each attempt as Success, Failure or Ignored.
//
// # Use
//
//	tok, retryAfter, err := b.Allow(now)
//	if err != nil {
//		// rejected: fail fast; retryAfter > 0 is the time until the next probe
//	}
//	... the attempt ...
//	b.Record(tok, time.Now(), outcome, duration)
//
// Every admitted Token must be recorded exactly once. A caller that cannot
// tell the outcome (it cancelled the call, the request was invalid, the
// attempt never left) records Ignored: it counts for nothing but frees a
// half-open probe slot, which would otherwise stay taken.
//
// # States
//
//	          trip condition            open time passed
//	Closed ────────────────────► Open ───────────────────► HalfOpen
//	  ▲                           ▲                           │ │
//	  │                           └── a failed or slow probe ─┘ │
//	  └────────────── HalfOpenProbes successful probes ─────────┘
//
//	ForceOpen ─► ForcedOpen, ForceClosed ─► ForcedClosed, from any state;
//	Reset ─► Closed, from any state.
//
// Closed admits every attempt and trips to Open when one condition holds
// after an outcome is recorded:
//   - ConsecutiveFailures failures in a row (a Success ends the streak,
//     Ignored does not);
//   - failures/calls ≥ FailureRateThreshold over the window, once the window
//     holds at least MinimumCalls calls;
//   - slow/calls ≥ SlowCallRateThreshold over the window, once it holds at
//     least MinimumCalls calls, where a call is slow when its duration is
//     above SlowCallDuration, whether it succeeded or failed.
//
// The window is a ring of 10 buckets of Window/10 each, indexed by
// floor(now/(Window/10)); the rates cover the bucket of the newest instant
// seen and the 9 before it, so between 0.9×Window and Window of history.
// Defaults: Window 10s, MinimumCalls 20. A zero trip field is off.
//
// Open rejects every attempt with ErrOpen and the time left until it turns
// HalfOpen. The first trip from Closed opens it for OpenDuration (default
// 5s); each trip from HalfOpen doubles the last open time, up to
// MaxOpenDuration (default OpenDuration: no growth); closing resets it, so
// the open times of a breaker that keeps failing its probes are
// OpenDuration × 1, 2, 4, … capped at MaxOpenDuration.
//
// HalfOpen admits at most HalfOpenProbes (default 1) attempts at once and
// rejects the others with ErrHalfOpenFull. The HalfOpenProbes-th successful
// probe closes the breaker; one failed probe opens it again, and so does a
// slow successful probe when slow-call tripping is on. An Ignored probe only
// frees its slot. The open period after a failed probe counts from the
// probe's admission, not from its outcome: a probe sent during an outage
// whose answer arrives late, after the outage ended, costs no more than the
// open time itself. Probes that have all been out for one open period
// without an outcome are deemed lost: the next Allow renews HalfOpen in a
// new generation (their outcomes, should they come, are discarded) and
// admits a fresh probe, so a probe whose caller never reports cannot hold
// the breaker half-open for good.
//
// ForcedOpen rejects every attempt with ErrForcedOpen; ForcedClosed admits
// every attempt and counts outcomes but never trips. Both last until Reset or
// the other Force call. Reset closes the breaker as new.
//
// Every change of state, and Reset, starts a new generation and clears the
// counts. A Token carries the generation that admitted it, and Record
// discards an outcome from an earlier generation, so a slow attempt admitted
// before a trip can neither trip the breaker again nor close it.
//
// # Time
//
// Time is a parameter: every method takes now, and a transition that time
// causes (Open to HalfOpen) happens on the next Allow at or after it
// (Snapshot describes it without making it); there are no timers and no
// goroutines. Instants are read as Unix nanoseconds measured from the
// first instant the breaker was given, on the monotonic clock when the
// instants carry a monotonic reading (time.Now's do): a step of the wall
// clock neither holds a breaker open longer nor cuts its open time short.
// Instants without one (time.Unix) read as their UnixNano, so now should
// come from one clock; an instant earlier than one already seen is counted
// in the newest bucket.
//
// # Concurrency
//
// A Breaker is safe for concurrent use. Allow in Closed and ForcedClosed
// reads one atomic word and takes no lock, and so does a rejection while
// Open or while HalfOpen has every probe out: rejected callers spinning in
// a closed loop never contend with the probe's Record for the lock; Record takes a mutex except for
// Ignored outcomes outside HalfOpen; neither allocates. OnStateChange runs
// with no lock held, so it may call the breaker, after the change is
// published, one change at a time and in order (see Config.OnStateChange).
// Reconfigure changes a breaker's configuration in place, keeping its
// state, so that everything holding the breaker (an operator's ForceOpen
// included) keeps acting on the one breaker of its method.
package breaker
