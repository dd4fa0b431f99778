package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/grpclog"
)

// Server is the server side of grpc-resilience: it gives the interceptors
// that a grpc.Server installs. It carries server-side idempotency
// ([WithIdempotency]; the stores are in package interceptor/idempotency),
// deadline headroom for downstream hops ([WithHeadroom]), and overload
// protection ([WithLimits]: adaptive concurrency limits or CPU-aware
// shedding, by criticality and, optionally, fairly among tenants). It marks
// the context of a call whose caller retries it ([wire.CallerRetries]), so
// that a client of package interceptor in the handler retries less (its
// WithOneLayerRetry). A Server with no option only marks contexts.
//
// A Server is safe for concurrent use; its per-method policy and its
// in-process coalescing state are shared by all calls. Close it when it is
// replaced or the grpc.Server stops.
type Server struct {
	idem     *srvIdem   // nil when idempotency is off; immutable
	limits   *srvLimits // nil when no concurrency limit is set; immutable
	headroom time.Duration
	floor    time.Duration
	// onRefusal is WithOnRefusal's hook; nil: none. Immutable.
	onRefusal func(context.Context, Refusal)

	closeOnce sync.Once
	closeErr  error // of the first Close; written once, inside closeOnce
}

// New returns a Server configured by opts. It validates the options
// and returns an error naming the first bad one; it never panics on bad
// configuration.
func New(opts ...Option) (*Server, error) {
	var o options
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("server: New: nil Option")
		}
		opt.apply(&o)
	}
	if len(o.errs) > 0 {
		return nil, o.errs[0]
	}
	s := &Server{headroom: o.headroom, floor: o.floor, onRefusal: o.onRefusal}
	idem, err := newSrvIdem(&o.idem, srvLogger{l: o.logger})
	if err != nil {
		return nil, err
	}
	if idem != nil {
		idem.refused = o.onRefusal
	}
	if idem != nil {
		if idem.m, err = newSrvMetrics(o.meterProvider, o.idem.failOpen); err != nil {
			return nil, fmt.Errorf("server: metrics: %w", err)
		}
	}
	s.idem = idem
	if s.limits, err = newSrvLimits(&o); err != nil {
		return nil, err
	}
	return s, nil
}

// Close releases what s holds beyond its calls: it unregisters the
// callbacks of its gauges (WithMeterProvider), so that the meter
// provider no longer reads s, and a Server built to replace s (after a
// configuration reload, say) is the only one reporting under their
// labels. s starts no goroutine and owns no store (close a store's client
// yourself), so there is nothing else to stop. Close it once the
// grpc.Server that uses it has stopped (GracefulStop or Stop): calls that
// still come are served as before, with no gauges. Close is safe to call
// more than once and concurrently; every call returns the first one's
// error.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if s.limits != nil && s.limits.m.gauges != nil {
			if err := s.limits.m.gauges.Unregister(); err != nil {
				s.closeErr = errorf("Close: unregistering the gauges: %v", err)
			}
		}
	})
	return s.closeErr
}

// UnaryServerInterceptor returns the unary interceptor of s. With an
// idempotency store it runs each keyed call once per record key and replays
// the stored outcome to duplicates (see [WithIdempotency]).
//
// Order: install it after authentication (the scope function reads what
// authentication put in the context) and after a panic-recovery interceptor,
// that is, recovery outside, this inside:
//
//	grpc.ChainUnaryInterceptor(recovery, auth, s.UnaryServerInterceptor())
//
// A panic in the handler releases the idempotency claim and propagates, as
// grpc's own interceptors do, so the outer recovery turns it into INTERNAL
// and a retry runs the handler again. A recovery interceptor placed inside
// this one would turn the panic into an INTERNAL status that is stored.
func (s *Server) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return s.srvUnary
}

func (s *Server) srvUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.limits != nil && !s.limits.exempt(info.FullMethod) {
		if l := s.limits.lookup(info.FullMethod); l != nil {
			return s.limited(ctx, l, req, info, handler)
		}
		if s.limits.cpu != nil {
			return s.shedByCPU(ctx, req, info, handler)
		}
	}
	return s.srvUnaryInner(ctx, req, info, handler)
}

// srvUnaryInner is the unary interceptor inside the concurrency limit.
func (s *Server) srvUnaryInner(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, cancel, err := s.srvDeadline(ctx)
	if err != nil {
		s.refused(ctx, Refusal{FullMethod: info.FullMethod, Reason: RefusalHeadroom, Err: err})
		return nil, err
	}
	if cancel != nil {
		defer cancel()
	}
	if s.idem == nil {
		return handler(ctx, req)
	}
	return s.idem.intercept(ctx, req, info, handler)
}

// StreamServerInterceptor returns the stream interceptor of s: the
// concurrency limit for the streams Limits.Streams names, the
// deadline headroom and floor (WithHeadroom) and the caller-retries
// mark. Idempotency is for unary calls only: a stream runs whatever
// idempotency-key it carries, and every call of a streaming method that a
// key policy other than KeyIgnored names fails with
// FAILED_PRECONDITION (see Idempotency.KeyPolicies).
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
		s.refused(ctx, Refusal{FullMethod: info.FullMethod, Reason: RefusalHeadroom, Err: err})
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

// srvLogger writes the Server's warnings to an slog.Logger or to grpclog.
type srvLogger struct{ l *slog.Logger }

var srvGRPCLog = grpclog.Component("resilience")

func (l srvLogger) warn(msg string, args ...any) {
	if l.l != nil {
		l.l.Warn(msg, args...)
		return
	}
	srvGRPCLog.Warning(append([]any{msg + ": "}, args...)...)
}

// errorf returns an error of this package's options.
func errorf(format string, args ...any) error {
	return fmt.Errorf("server: "+format, args...)
}
