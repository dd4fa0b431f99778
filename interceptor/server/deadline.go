package server

import (
	"context"
	"math"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/deadline"
	"github.com/grpc-resilience/resilience/interceptor/internal/rpcname"
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

// StreamServerInterceptor returns the stream interceptor of s: the
// concurrency limit for the streams WithStreamConcurrencyLimit names, the
// deadline headroom and floor (WithHeadroom) and the caller-retries
// mark. Idempotency is for unary calls only: a stream runs whatever
// idempotency-key it carries, and every call of a streaming method that a
// key policy other than KeyIgnored names fails with
// FAILED_PRECONDITION (see WithIdempotencyKeyPolicy).
func (s *Server) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if s.idem != nil {
			if err := s.idem.streamPolicyErr(info.FullMethod); err != nil {
				return err
			}
		}
		if s.limits != nil {
			if l := s.limits.streamLimiter(info.FullMethod); l != nil {
				return s.limitedStream(l, srv, ss, info, handler)
			}
		}
		return s.srvStreamInner(srv, ss, info, handler)
	}
}

// srvStreamInner is the stream interceptor inside the concurrency limit.
func (s *Server) srvStreamInner(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, cancel, err := s.srvDeadline(ss.Context())
	if err != nil {
		return err
	}
	if cancel != nil {
		defer cancel()
	}
	if ctx != ss.Context() {
		ss = &srvStream{ServerStream: ss, ctx: ctx}
	}
	return handler(srv, ss)
}

// srvStream is a grpc.ServerStream with a context of the interceptor's.
type srvStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *srvStream) Context() context.Context { return s.ctx }

// SetRetryPushback sets the gRFC A6 pushback trailer on a handler's call: a
// client that honours it waits d before its next attempt, or does not retry
// at all when d is negative. An overloaded server answers with
// SetRetryPushback(ctx, -1) to stop its callers' retries.
func SetRetryPushback(ctx context.Context, d time.Duration) error {
	ms := "-1"
	if d >= 0 {
		ms = strconv.FormatInt(d.Milliseconds(), 10)
	}
	return grpc.SetTrailer(ctx, metadata.Pairs(rpcname.PushbackKey, ms))
}
