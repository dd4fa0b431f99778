package interceptor

import (
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Sentinels of local rejections. A rejected call never reached the server;
// it is not retried and never counts as a failure of the method.
var (
	// ErrCircuitOpen: the method's circuit breaker is open (or half-open
	// with every probe taken). Its status is UNAVAILABLE.
	ErrCircuitOpen = errors.New("circuit breaker open")
	// ErrBulkheadFull: the method's bulkhead had no slot within its queue
	// bounds. Its status is RESOURCE_EXHAUSTED.
	ErrBulkheadFull = errors.New("bulkhead full")
)

// RejectedError is a call or attempt that the client refused locally. It
// works with status.Code (UNAVAILABLE for ErrCircuitOpen, RESOURCE_EXHAUSTED
// for ErrBulkheadFull), errors.Is (the sentinel) and errors.As. When
// RetryAfter is known, the status carries it as a google.rpc.RetryInfo
// detail, so that a caller further up that honours RetryInfo waits for the
// next probe instead of hammering.
type RejectedError struct {
	// FullMethod is the method rejected.
	FullMethod string
	// Reason is ErrCircuitOpen or ErrBulkheadFull.
	Reason error
	// RetryAfter is the time until the breaker lets a probe through; 0 when
	// unknown.
	RetryAfter time.Duration
}

// Error returns a message naming the method and the reason.
func (e *RejectedError) Error() string {
	msg := e.FullMethod + ": " + e.Reason.Error()
	if e.RetryAfter > 0 {
		msg += "; retry after " + e.RetryAfter.String()
	}
	return msg
}

// Unwrap returns Reason.
func (e *RejectedError) Unwrap() error { return e.Reason }

// GRPCStatus returns UNAVAILABLE or RESOURCE_EXHAUSTED with the message of
// Error and, when RetryAfter is known, a RetryInfo detail.
func (e *RejectedError) GRPCStatus() *status.Status {
	code := codes.Unavailable
	if errors.Is(e.Reason, ErrBulkheadFull) {
		code = codes.ResourceExhausted
	}
	st := status.New(code, "resilience: "+e.Error())
	if e.RetryAfter > 0 {
		if withHint, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(e.RetryAfter)}); err == nil {
			return withHint
		}
	}
	return st
}
