package server

import (
	"context"
	"math"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/deadline"
	"github.com/grpc-resilience/resilience/interceptor/wire"
)

// srvDeadline applies the headroom and the caller-retries mark to an
// incoming call's context. cancel is nil when ctx is unchanged.
func (s *Server) srvDeadline(ctx context.Context) (_ context.Context, cancel context.CancelFunc, err error) {
	if vs := metadata.ValueFromIncomingContext(ctx, wire.CallerRetriesKey); len(vs) > 0 {
		ctx = wire.ContextWithCallerRetries(ctx)
	}
	if s.headroom == 0 && s.floor == 0 {
		return ctx, nil, nil
	}
	incoming, ok := ctx.Deadline()
	if !ok {
		return ctx, nil, nil
	}
	now := time.Now()
	// The floor is the handler's least time, so a call needs headroom +
	// floor left (saturating: both are at most math.MaxInt64).
	need := s.headroom + s.floor
	if need < s.headroom {
		need = math.MaxInt64
	}
	handler, reject := deadline.HandlerDeadline(incoming, now, s.headroom, need)
	if reject {
		left, _ := deadline.Remaining(incoming, now)
		return ctx, nil, status.Errorf(codes.DeadlineExceeded,
			"resilience: %v left of the caller's deadline, too little to start (the handler's floor %v after the headroom %v)",
			left.Round(time.Microsecond), s.floor, s.headroom)
	}
	if s.headroom == 0 {
		return ctx, nil, nil
	}
	ctx, cancel = context.WithDeadline(ctx, handler)
	return ctx, cancel, nil
}
