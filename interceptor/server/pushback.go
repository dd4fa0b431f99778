package server

// Pushback: what the server tells its callers about when to come back, as
// gRFC A6's grpc-retry-pushback-ms trailer and a google.rpc.RetryInfo
// detail: SetRetryPushback for handlers, and the shed statuses of the
// overload protection, built once per step.

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/grpc-resilience/resilience/interceptor/internal/pushback"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/internal/limit"
)

// SetRetryPushback sets the gRFC A6 pushback trailer on a handler's call: a
// client that honours it waits d before its next attempt, or does not retry
// at all when d is negative. An overloaded server answers with
// SetRetryPushback(ctx, -1) to stop its callers' retries.
func SetRetryPushback(ctx context.Context, d time.Duration) error {
	ms := "-1"
	if d >= 0 {
		ms = strconv.FormatInt(d.Milliseconds(), 10)
	}
	return grpc.SetTrailer(ctx, metadata.Pairs(pushback.Key, ms))
}

// shedError is the status of a call the limit shed (a *srvShed), with the pushback as
// a RetryInfo detail and as the A6 trailer; when the pushback is
// limit.NoRetry, the trailer says not to retry (-1) and there is no
// RetryInfo. The status and trailer are built once per criticality and step
// of the pushback's grid (limit.PushbackStep: at most 25% apart), so that
// shedding under overload allocates nothing but what grpc does however the
// pushback moves.
func (ls *srvLimits) shedError(ctx context.Context, crit wire.Criticality, pushback time.Duration) error {
	i := limit.PushbackSteps // do not retry
	if pushback != limit.NoRetry {
		i = limit.PushbackStep(pushback)
	}
	var e *shedEntry
	if i < 0 { // beyond the grid (over 10,000s): not cached
		e = newShedEntry(crit, pushback)
	} else {
		c := &ls.shed[crit&3][i]
		if e = c.Load(); e == nil {
			e = newShedEntry(crit, pushback)
			c.Store(e)
		}
	}
	_ = grpc.SetTrailer(ctx, e.trailer)
	return e.err
}

// shedEntry is a shed status and trailer, built once; read-only.
type shedEntry struct {
	err     *srvShed
	trailer metadata.MD
}

func newShedEntry(crit wire.Criticality, wait time.Duration) *shedEntry {
	e := &shedEntry{}
	if wait == limit.NoRetry {
		e.trailer = noRetryTrailer
		e.err = &srvShed{status.Error(codes.ResourceExhausted, "resilience: over the concurrency limit ("+crit.String()+"); overloaded, do not retry")}
		return e
	}
	e.trailer = metadata.Pairs(pushback.Key, strconv.FormatInt(wait.Milliseconds(), 10))
	st := status.New(codes.ResourceExhausted, "resilience: over the concurrency limit ("+crit.String()+"); retry after "+wait.String())
	if withHint, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}); err == nil {
		st = withHint
	}
	e.err = &srvShed{st.Err()}
	return e
}

// noRetryTrailer is gRFC A6's "do not retry"; grpc only reads it.
var noRetryTrailer = metadata.Pairs(pushback.Key, "-1")
