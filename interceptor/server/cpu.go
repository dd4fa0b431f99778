package server

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/internal/cpuusage"
	"github.com/grpc-resilience/resilience/internal/limit"
)

// CPUShedding configures CPU-aware load shedding (Limits.CPU; see the
// package documentation, "CPU-aware shedding"). Zero fields take their
// defaults.
type CPUShedding struct {
	// CPUThreshold is the CPU use, in (0, 1], from which the server limits
	// the calls in flight; 0 means 0.8.
	CPUThreshold float64
	// Window is the window of the pass rate and the minimum latency; 0
	// means 5s.
	Window time.Duration
	// CoolOff keeps the limit on for this long after a call was shed,
	// whatever the CPU; 0 means 1s.
	CoolOff time.Duration
	// CPU returns the CPU use in [0, 1]. nil means the process's own,
	// cgroup-aware on Linux (cgroup v2, then v1, then /proc/stat; sampled at
	// most every 250ms, on the calls, without a goroutine), and 0 where it
	// cannot be read, which never sheds. It is called on every call and
	// must be cheap and safe for concurrent use.
	CPU func() float64
}

// Validate reports what is wrong with c, if anything.
func (c CPUShedding) Validate() error {
	return (limit.BBRConfig{CPUThreshold: c.CPUThreshold, Window: c.Window, CoolOff: c.CoolOff}).Validate()
}

// srvCPU is the server's CPU-aware shedder.
type srvCPU struct {
	bbr *limit.BBR
	cpu func() float64
}

func newSrvCPU(cfg *CPUShedding) (*srvCPU, error) {
	if cfg == nil {
		return nil, nil
	}
	b, err := limit.NewBBR(limit.BBRConfig{CPUThreshold: cfg.CPUThreshold, Window: cfg.Window, CoolOff: cfg.CoolOff})
	if err != nil {
		return nil, errorf("Limits.CPU: %v", err)
	}
	cpu := cfg.CPU
	if cpu == nil {
		r := cpuusage.New(0)
		cpu = func() float64 { return r.Usage(time.Now()) }
	}
	return &srvCPU{bbr: b, cpu: cpu}, nil
}

// shedByCPU runs a unary call under the CPU-aware shedder; a keyed call on
// a Server with idempotency, around its handler only, as limited does.
func (s *Server) shedByCPU(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.idem != nil && len(metadata.ValueFromIncomingContext(ctx, wire.IdempotencyKeyHeader)) > 0 {
		return s.srvUnaryInner(ctx, req, info, func(hctx context.Context, req any) (any, error) {
			return s.runShedByCPU(hctx, req, info, handler, false)
		})
	}
	return s.runShedByCPU(ctx, req, info, handler, true)
}

// runShedByCPU admits a call under the CPU-aware shedder and runs it: with
// inner, the rest of the unary interceptor and then handler; without,
// handler alone. Only a call the handler answered OK is a latency sample
// (callOutcome).
func (s *Server) runShedByCPU(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler, inner bool) (resp any, err error) {
	crit := s.limits.criticality(ctx)
	c := s.limits.cpu
	start := s.limits.clk.Now()
	v, pushback := c.bbr.Acquire(start, c.cpu(), limit.Criticality(crit))
	if v != limit.Admitted {
		s.limits.m.shedCall(ctx, info.FullMethod, crit, shedCPU)
		err = s.limits.shedError(ctx, crit, pushback)
		s.refused(ctx, Refusal{FullMethod: info.FullMethod, Reason: RefusalCPU, Limit: CPUSheddingName, Criticality: crit, Err: err})
		return nil, err
	}
	s.limits.m.admit(ctx, info.FullMethod, crit)
	panicked := true
	defer func() {
		if callOutcome(ctx, err, panicked) != limit.Completed {
			c.bbr.Abandon()
			return
		}
		end := s.limits.clk.Now()
		c.bbr.Release(end, end.Sub(start))
	}()
	if inner {
		resp, err = s.srvUnaryInner(ctx, req, info, handler)
	} else {
		resp, err = handler(ctx, req)
	}
	panicked = false
	return resp, err
}
