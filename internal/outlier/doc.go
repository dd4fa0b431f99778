// Package outlier is the passive outlier-ejection engine behind the
// endpoint load-balancing policy: one Group holds the endpoints of one
// channel, and each Endpoint is ejected (taken out of rotation) when its
// recent outcomes say it is broken, for a time that grows with each
// ejection. It knows nothing of gRPC: the caller classifies every attempt's
// outcome as Success, Failure, Busy or Ignored and passes the time.
//
// # Algorithm
//
// Nothing runs in the background: every transition is computed from the
// outcomes and the instant passed in (`now`), on the next Record or Ejected.
// Instants are measured from the group's creation on the monotonic clock
// (when `now` comes from time.Now), so a step of the system's wall clock
// neither lengthens nor ends an ejection.
//
//   - An endpoint is ejected after ConsecutiveFailures failures in a row, or
//     when failures/outcomes over the rolling Window reach FailureRate, once
//     MinimumCalls outcomes are in the window (either condition; 0 is off).
//   - Busy outcomes (a server's RESOURCE_EXHAUSTED or pushback: it is
//     loaded, not broken) neither count as failures nor break a run of them;
//     Ignored outcomes (the caller cancelled, an application error) count for
//     nothing.
//   - The k-th ejection in a row lasts min(k × BaseEjectionTime,
//     max(BaseEjectionTime, MaxEjectionTime)). k drops by one for every
//     BaseEjectionTime spent in rotation since the last ejection ended (gRFC
//     A50's multiplier, decayed lazily instead of on a timer).
//   - An endpoint back from an ejection is on probation until its first
//     success: its first failure ejects it again at once, for longer.
//   - An ejection is refused when it would put more than MaxEjectionPercent
//     of the group's endpoints out of rotation at once: (ejected+1)×100 ≤
//     MaxEjectionPercent × endpoints. Unlike gRFC A50, which always allows
//     the first ejection, this is a strict bound, so a whole-cluster outage
//     never ejects more than the configured share (with 3 endpoints and the
//     default 50%, one).
//   - Outcomes reported while an endpoint is ejected (attempts that were in
//     flight) are dropped; its counters start afresh when it returns.
//
// # Concurrency
//
// Endpoint methods are safe for concurrent use. Ejected is one atomic load
// (and a clock comparison); Record takes the endpoint's mutex, and the
// group's only when it ejects.
package outlier
