package codes

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Classify returns the gRPC code that err stands for: OK for nil, CANCELLED
// and DEADLINE_EXCEEDED for the context package's errors (wrapped or not), the
// code of a gRPC status error, and UNKNOWN for anything else.
func Classify(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	if _, ok := err.(interface{ GRPCStatus() *status.Status }); ok {
		return status.Code(err)
	}
	switch {
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	}
	return status.Code(err)
}
