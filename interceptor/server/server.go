package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
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
// in-process coalescing state are shared by all calls. Shut it down
// (Shutdown) beside the grpc.Server's GracefulStop, or Close it when it is
// replaced.
type Server struct {
	idem     *srvIdem   // nil when idempotency is off; immutable
	limits   *srvLimits // nil when no concurrency limit is set; immutable
	rates    *srvRates  // nil when no rate limit is set; immutable
	headroom time.Duration
	floor    time.Duration
	// onRefusal is WithOnRefusal's hook; nil: none. Immutable.
	onRefusal refusalHook

	// closing is set, and closed closed, when Shutdown begins: no call is
	// admitted after.
	closing atomic.Bool
	closed  chan struct{}

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
	if c := o.idemCfg; c != nil && len(o.errs) == 0 {
		idem, err := c.normalize()
		if err != nil {
			return nil, err
		}
		o.idem = idem
	}
	if l := o.limitsCfg; l != nil && len(o.errs) == 0 {
		l.apply(&o)
	}
	if len(o.errs) > 0 {
		return nil, o.errs[0]
	}
	s := &Server{headroom: o.headroom, floor: o.floor, onRefusal: o.onRefusal, closed: make(chan struct{})}
	idem, err := newSrvIdem(&o.idem, srvLogger{l: o.logger})
	if err != nil {
		return nil, err
	}
	if idem != nil {
		if idem.m, err = newSrvMetrics(o.meterProvider, o.idem.failOpen); err != nil {
			return nil, fmt.Errorf("server: metrics: %w", err)
		}
	}
	s.idem = idem
	if idem != nil {
		idem.runHandler, idem.refused = s.runHandler, o.onRefusal
	}
	if s.limits, err = newSrvLimits(&o); err != nil {
		return nil, err
	}
	if s.rates, err = newSrvRates(&o, o.idem.scope, o.meterProvider); err != nil {
		return nil, err
	}
	return s, nil
}

// Shutdown stops s, as grpc.Server.GracefulStop stops a server: calls
// that come after it began are refused with UNAVAILABLE before they run
// anything (a keyed call claims nothing), and calls waiting in a limit's
// queue leave it, refused alike; the handlers of the keyed calls that own
// their key (lease or joined mode), which run detached from their callers
// by default (Idempotency.DetachedMax), so that neither their callers' end
// nor grpc.Server.Stop reaches them (attached ones are treated alike), are
// waited for until ctx ends, their outcomes stored; those still running
// then are cancelled (their contexts end with context.Canceled, their
// outcomes, by default, not stored) and Shutdown returns ctx.Err() without
// waiting for them to return. Then it does what Close does. Other calls'
// handlers are grpc's: GracefulStop waits for them, Stop cancels them.
//
// Call it beside GracefulStop, which stops the listeners and waits for
// every handler, detached ones included, to return: Shutdown bounds that
// wait. Shutdown is safe to call more than once and concurrently; each
// call waits as its ctx says.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.closing.CompareAndSwap(false, true) {
		close(s.closed) // wakes the calls in the limits' queues
	}
	var err error
	if s.idem != nil {
		err = s.idem.handlers.shutdown(ctx)
	}
	return errors.Join(err, s.Close())
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

// srvUnary is the unary interceptor: the headroom and the caller-retries
// mark, then idempotency, which runs the handler, if it does, through the
// one admission path (runHandler; see admission.go), as a call without
// idempotency does at once.
func (s *Server) srvUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.closing.Load() { // no claim either: the handler would not run
		return nil, s.onRefusal.shutdown(ctx, info.FullMethod)
	}
	ctx, cancel, err := s.srvDeadline(ctx)
	if err != nil {
		s.onRefusal.report(ctx, Refusal{FullMethod: info.FullMethod, Reason: RefusalHeadroom, Err: err})
		return nil, err
	}
	if cancel != nil {
		defer cancel()
	}
	if s.idem == nil {
		return s.runHandler(ctx, ctx, req, info, handler)
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
		if s.closing.Load() {
			return s.onRefusal.shutdown(ss.Context(), info.FullMethod)
		}
		if s.rates != nil {
			if set := s.rates.lookup(info.FullMethod); set != nil {
				return s.rateLimitedStream(set, srv, ss, info, handler)
			}
		}
		return s.srvStreamLimited(srv, ss, info, handler)
	}
}

// rateLimitedStream runs a stream of a method under the rate limits of
// set: refused, it does not run; admitted, it goes on to the concurrency
// limit, and gets its tokens back if that sheds it.
func (s *Server) rateLimitedStream(set *srvRateSet, srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	keys, err := s.rates.admit(ss.Context(), set, info.FullMethod)
	if err != nil {
		return err
	}
	// Refunded unless the handler ran: shed by the concurrency limit or
	// the headroom, or a panic before the handler (a user's
	// CriticalityFunc or TenantFunc). A panic of the handler's own spent
	// the tokens.
	ran := false
	defer func() {
		if !ran {
			s.rates.refund(set, keys)
		}
	}()
	return s.srvStreamLimited(srv, ss, info, func(srv any, ss grpc.ServerStream) error {
		ran = true
		return handler(srv, ss)
	})
}

// srvStreamLimited is the stream interceptor past the rate limits: the
// concurrency limit, for the streams Limits.Streams names, then the rest.
func (s *Server) srvStreamLimited(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if s.limits != nil {
		if l := s.limits.streamLimiter(info.FullMethod); l != nil {
			return s.limitedStream(l, srv, ss, info, handler)
		}
	}
	return s.srvStreamInner(srv, ss, info, handler)
}

// srvStreamInner is the stream interceptor inside the concurrency limit.
func (s *Server) srvStreamInner(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, cancel, err := s.srvDeadline(ss.Context())
	if err != nil {
		s.onRefusal.report(ctx, Refusal{FullMethod: info.FullMethod, Reason: RefusalHeadroom, Err: err})
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

// srvLogger writes the Server's warnings to its slog.Logger (WithLogger),
// or to slog.Default(), read at each warning so that a program's
// slog.SetDefault applies whenever it runs. Not to grpclog: its default
// logger discards warnings (it writes errors only, unless
// GRPC_GO_LOG_SEVERITY_LEVEL asks for more), and it formats slog's
// key-value pairs as one run of text.
type srvLogger struct{ l *slog.Logger }

func (l srvLogger) warn(msg string, args ...any) {
	if l.l != nil {
		l.l.Warn(msg, args...)
		return
	}
	slog.Warn(msg, args...)
}

// errorf returns an error of this package's options.
func errorf(format string, args ...any) error {
	return fmt.Errorf("server: "+format, args...)
}
