// Package outlier is the passive outlier-ejection engine behind the
// endpoint load-balancing policy: one Group holds the endpoints of one
// channel, and each Endpoint is ejected (taken out of rotation) when its
// recent outcomes say it is broken, for a time that grows with each
// ejection. It knows nothing of gRPC: the caller classifies every attempt's
// outcome as Success, Failure, LocalFailure, Busy or Ignored and passes the
// time.
//
// # Algorithm
//
// Nothing runs in the background: every transition is computed from the
// outcomes and the instant passed in (`now`), on the next Record, Ejected
// or Sweep. Instants are measured from the group's creation on the
// monotonic clock (when `now` comes from time.Now), so a step of the
// system's wall clock neither lengthens nor ends an ejection.
//
//   - An endpoint is ejected after ConsecutiveFailures failures in a row,
//     when failures/outcomes over the rolling Window reach FailureRate once
//     MinimumCalls outcomes are in the window, or after
//     ConsecutiveLocalFailures local-origin failures in a row (any
//     condition; 0 is off).
//   - Local-origin failures (the connection refused or reset before any
//     response: Envoy's split of local-origin errors) count apart: not in
//     the window, neither adding to nor breaking a run of the endpoint's own
//     failures; any answer ends their run. A first ejection they cause ends
//     when the caller reports the endpoint Reconnected; a repeat (a failure
//     again on the probation that follows) waits its time.
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
//   - At most MaxEjectionPercent of the group's endpoints are out of
//     rotation at once, strictly: an ejection is refused when (ejected+1)×100
//     > MaxEjectionPercent × endpoints. Unlike gRFC A50, which always allows
//     the first ejection, this is a strict bound, so a whole-cluster outage
//     never ejects more than the configured share (with 3 endpoints and the
//     default 50%, one), and 0 ejects nothing. The bound holds at every
//     moment: when the group shrinks (Remove) or the percentage is lowered
//     (SetConfig), the longest-ejected endpoints return until it holds.
//   - Outcomes of attempts in flight when their endpoint was ejected are
//     dropped; its counters start afresh when it returns. An attempt sent to
//     an ejected endpoint as a last resort (RecordLastResort) counts: a
//     success ends the ejection at once.
//   - SetConfig keeps every endpoint's ejection, multiplier and runs; an
//     ejection longer than the new MaxEjectionTime allows for its multiplier
//     is shortened.
//
// Every call that changes an endpoint's ejection state reports it (a
// Change, or Returned for group-wide changes) once, for the caller's logs
// and metrics: an ejection, a refusal by the bound, or a return and its
// Reason. The end of an ejection by time is noticed at the endpoint's next
// outcome, or by Sweep, whichever comes first.
//
// # Concurrency
//
// Endpoint and Group methods are safe for concurrent use. Ejected is one
// atomic load (and a clock comparison); Record takes the endpoint's mutex,
// and the group's only when it ejects. Group-wide returns take each
// endpoint's mutex before the group's, as Record does.
package outlier
