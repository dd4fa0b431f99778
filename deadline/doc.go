// Package deadline does the arithmetic of a call's time budget: how much time
// is left, how long the next attempt may run, whether a retry can still finish,
// and what deadline a server hands its handler. Every function is a pure
// function of a deadline and the instant now, both time.Time, so a test pins
// each verdict with a table of instants and nothing here reads the clock.
//
// # No deadline
//
// A zero time.Time means "no deadline", as context.Context.Deadline reports
// with ok == false. Functions that return a time or a duration say so with a
// boolean or a [Verdict]; none of them invents a deadline that was not there.
//
// # Remaining time
//
// The remaining time is deadline − now, in nanoseconds as a time.Duration. It
// is negative once the deadline has passed, as time.Until is.
//
// # The next attempt
//
// A client gives each attempt a timeout of
//
//	min(perAttempt, remaining − headroom)
//
// where perAttempt ≤ 0 means the policy sets no per-attempt timeout, and
// headroom is time the caller keeps for itself after the attempt returns (to
// record the outcome, to return the reply). A timeout of 0 with ok == true
// means no time is left: the attempt must not start.
//
// # Does a retry fit?
//
// Before a backoff begins, the client asks whether the wait plus the attempt
// that follows it can still finish before the deadline:
//
//	delay + estimate ≤ remaining − headroom
//
// where estimate is what the attempt is expected to take (a running high
// percentile of the method's latencies, never below a floor the user sets).
// Equality fits. When the inequality fails, waiting would only idle to the
// deadline, so the call should end at once with the last attempt's error. The
// answer is a [Verdict] that tells "fits" from "no deadline", "too short" and
// "already expired", so metrics can say why an attempt was skipped.
//
// # Headroom on a server
//
// A server that calls other services gives its handler a deadline earlier
// than the one it received, incoming − headroom, so the handler's outgoing
// calls inherit a deadline that leaves the server time to build its reply. A
// request is rejected at once (the interceptor answers DEADLINE_EXCEEDED)
// when it arrives with less than floor left, or with no time left once the
// headroom is taken: starting it would be wasted work the caller never sees.
//
// Negative durations given as perAttempt, headroom, delay, estimate or floor
// count as zero (perAttempt: as none), so a caller never has to clamp.
//
// The functions are safe for concurrent use: they have no state.
package deadline
