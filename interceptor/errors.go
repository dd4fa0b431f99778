package interceptor

import (
	"google.golang.org/grpc/status"
)

// StopReason says why a call stopped retrying.
type StopReason uint8

// The reasons retrying stops.
const (
	// StopNone: the call did not stop retrying (it succeeded).
	StopNone StopReason = iota
	// StopExhausted: MaxAttempts attempts ran.
	StopExhausted
	// StopNonRetryable: the last attempt's code is not retryable.
	StopNonRetryable
	// StopDeadline: the next backoff or attempt cannot finish before the
	// caller's deadline, or the deadline passed.
	StopDeadline
	// StopPushback: the server said not to retry (a negative, unparseable or
	// repeated grpc-retry-pushback-ms, or a negative RetryInfo delay).
	StopPushback
	// StopCancelled: the caller cancelled the context.
	StopCancelled
	// StopCommitted: the call is committed (gRFC A6) and can no longer be
	// retried: a stream received a response or outgrew its replay buffer,
	// or a hedged copy received response headers (its outcome is final).
	StopCommitted
	// StopThrottled: gRFC A6 retry throttling is withholding retries.
	StopThrottled
	// StopBudget: the client's retry budget is spent.
	StopBudget
	// StopCircuitOpen: the method's circuit breaker rejected the attempt.
	StopCircuitOpen
	// StopBulkheadFull: the method's bulkhead rejected the attempt.
	StopBulkheadFull
	// StopNoRetry: retrying is off for this call (a call option, or an
	// incoming call from a caller that retries itself).
	StopNoRetry
	// StopAdaptiveThrottle: the method's adaptive throttling (a
	// circuitBreaker block in mode "adaptive") rejected the attempt. Its
	// error is a RejectedError with Reason ErrCircuitOpen.
	StopAdaptiveThrottle
	// StopRateLimited: the method's rateLimit block had no token or slot
	// for the attempt in time (its error is a RejectedError with Reason
	// ErrRateLimited), or, for a retry after a server's pushback, no slot
	// of the method's pace within the pushback and maxWait (the call ends
	// with the server's refusal).
	StopRateLimited
)

var stopReasonNames = [...]string{
	StopNone:         "none",
	StopExhausted:    "attempts exhausted",
	StopNonRetryable: "non-retryable code",
	StopDeadline:     "deadline",
	StopPushback:     "server pushback",
	StopCancelled:    "cancelled",
	StopCommitted:    "committed",
	StopThrottled:    "throttled",
	StopBudget:       "retry budget spent",
	StopCircuitOpen:  "circuit open",
	StopBulkheadFull: "bulkhead full",
	StopNoRetry:      "retry off",

	StopAdaptiveThrottle: "adaptive throttle",
	StopRateLimited:      "rate limited",
}

// stopReasonTokens name the reasons in metrics.
var stopReasonTokens = [...]string{
	StopNone:         "none",
	StopExhausted:    "exhausted",
	StopNonRetryable: "non_retryable",
	StopDeadline:     "deadline",
	StopPushback:     "pushback",
	StopCancelled:    "cancelled",
	StopCommitted:    "committed",
	StopThrottled:    "throttled",
	StopBudget:       "budget",
	StopCircuitOpen:  "circuit_open",
	StopBulkheadFull: "bulkhead_full",
	StopNoRetry:      "no_retry",

	StopAdaptiveThrottle: "adaptive_throttle",
	StopRateLimited:      "rate_limited",
}

// token returns the reason's name in metrics, such as "exhausted".
func (r StopReason) token() string {
	if int(r) < len(stopReasonTokens) {
		return stopReasonTokens[r]
	}
	return "unknown"
}

// String returns a short description, such as "attempts exhausted".
func (r StopReason) String() string {
	if int(r) < len(stopReasonNames) {
		return stopReasonNames[r]
	}
	return "unknown"
}

// RetryError is the error of a call that ran under a retry policy and did not
// succeed. It carries the error of the last attempt unchanged: Error,
// GRPCStatus and Unwrap all return that error's text, status and identity, so
// status.Code, status.Convert and errors.Is see exactly what the last attempt
// returned. errors.As reaches the RetryError for the attempt count and the
// reason retrying stopped.
//
// When the caller cancels a call during a backoff, Err is the context's
// status (CANCELLED) and LastAttemptErr the error of the attempt before.
type RetryError struct {
	// Attempts is the number of attempts that ran, the first included.
	Attempts int
	// Reason says why retrying stopped.
	Reason StopReason
	// Err is the error the call returns: the last attempt's, unchanged.
	Err error
	// LastAttemptErr is the error of the last attempt that ran; it equals
	// Err except when the call was cancelled during a backoff.
	LastAttemptErr error
}

// Error returns Err's text unchanged.
func (e *RetryError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *RetryError) Unwrap() error { return e.Err }

// GRPCStatus returns the status of Err, so the call's code and message are
// the last attempt's.
func (e *RetryError) GRPCStatus() *status.Status { return status.Convert(e.Err) }
