package server

import (
	"google.golang.org/grpc"

	"github.com/grpc-resilience/resilience/internal/limit"
)

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

// limitedStream runs a stream under l: admitted (by the gate of the one
// admission path, admitLimit, which a stream passes as a call does, but
// never for its deadline), the handler runs and the slot is released when
// it returns or panics; shed, it does not run.
func (s *Server) limitedStream(l *srvLimiter, srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx := ss.Context()
	p, err := s.admitLimit(ctx, ctx, l, info.FullMethod, s.limits.clk.Now(), limit.NoDeadline)
	if err != nil {
		return err
	}
	defer func() { l.Abandon(s.limits.clk.Now(), p.slot) }() // no sample: a stream's life is not a service time
	return s.srvStreamInner(srv, ss, info, handler)
}
