package interceptor

import (
	"google.golang.org/grpc"

	"github.com/grpc-resilience/resilience/internal/limit"
)

// WithStreamConcurrencyLimit puts the streams of name, a full method
// ("/pkg.Service/Method") or a service ("pkg.Service"), under the
// concurrency limit that applies to the method (its own, its service's, or
// the server's; see WithConcurrencyLimit): a stream takes a slot when it
// opens, at its criticality's share, waits in the limit's queue or is
// shed as a unary call would be (RESOURCE_EXHAUSTED with pushback), and
// holds the slot for its whole life, until its handler returns. A stream
// gives the limit no latency sample (its life is not a service time), and
// is never rejected at the door for its deadline.
//
// Streams are not limited by default: a long stream holds its slot for as
// long as it lives, so a few of them under a limit learned from unary
// latencies can starve that limit's unary calls. Opt in per method, and
// prefer a limit of the streaming methods' own
// (WithMethodConcurrencyLimit) so that streams and unary calls do not share
// one. NewServer refuses this option without any concurrency limit; a
// method named here that no limit covers is not limited.
func WithStreamConcurrencyLimit(name string) ServerOption {
	return srvOptionFunc(func(o *serverOptions) {
		n, err := parseName(name)
		if err != nil {
			o.errs = append(o.errs, errorf("WithStreamConcurrencyLimit(%q): %v", name, err))
			return
		}
		o.streamLimits = append(o.streamLimits, nameKey(n))
	})
}

// streamLimiter returns the limiter the streams of fullMethod are under;
// nil when they are not limited. It allocates nothing.
func (ls *srvLimits) streamLimiter(fullMethod string) *srvLimiter {
	if len(ls.streams) == 0 {
		return nil
	}
	if !ls.streams[fullMethod] {
		if svc, ok := serviceOf(fullMethod); !ok || !ls.streams[svc] {
			return nil
		}
	}
	return ls.lookup(fullMethod)
}

// limitedStream runs a stream under l: admitted, the handler runs and the
// slot is released when it returns or panics; shed, it does not run.
func (s *Server) limitedStream(l *srvLimiter, srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	slot, _, err := s.admit(ss.Context(), l, info.FullMethod, s.limits.clk.Now(), limit.NoDeadline)
	if err != nil {
		return err
	}
	defer func() { l.Abandon(s.limits.clk.Now(), slot) }() // no sample: a stream's life is not a service time
	return s.srvStreamInner(srv, ss, info, handler)
}
