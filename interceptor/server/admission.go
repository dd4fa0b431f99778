package server

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/internal/limit"
)

// The one admission path. Every unary call whose handler runs passes
// through runHandler, right before its handler, whichever way it came
// (issue 33, finding 3: four paths each re-implemented admission, and each
// defect was one path missing one guard):
//
//	srvUnary ─► headroom ─► shutting down? ─► idempotency ─┬─ no key ──────────────────────────┐
//	    │                                                  ├─ key, KeyIgnored or fail open ────┤ (marker stripped)
//	    │                                                  ├─ keyed owner, lease mode ─────────┤ (captured, stripped)
//	    │                                                  └─ keyed owner, joined mode ────────┤ (captured, stripped)
//	    └─ no idempotency ─────────────────────────────────────────────────────────────────────┤
//	                                                                                           ▼
//	runHandler(caller, hctx): the gates, on the caller's context ─► handler(hctx) ─► release the pass
//
// A keyed call is admitted after its claim and only when it runs the
// handler: a duplicate that waits for the running execution or replays its
// outcome is no load on the handler, holds no slot and gives no latency
// sample (issue 19, defect 4). The gates wait (in a limit's queue) on the
// caller's context, so a caller that has gone leaves the queue at once,
// and a call whose caller has gone by the time it is admitted does not
// run; the handler runs on its own context hctx (for a keyed call, detached
// from the caller by default). A call the gates refuse gets a *srvShed,
// which no settle step stores (complete, settleJoined), whatever
// Idempotency.UnstoredCodes says, so that a retry runs it once there is
// room.
//
// The gates, in order: shutting down (Server.Shutdown); the method's rate
// limits (ratelimit.go: every one must admit it; a refused call never
// holds, nor waits for, a concurrency slot, and a call shed by the next
// gate gets its tokens back); then the method's concurrency limit (the
// door for its deadline, its share of the limit, the limit's queue), or,
// for a method without one, the CPU shedder. The rate gate holds nothing
// once it has decided, so it has no field in srvPass and nothing in
// release.

// srvShed is the error of a call the server answered without running its
// handler on the one admission path: shed by a gate (the limit, its door,
// its queue, the CPU shedder), refused while shutting down, refused because
// its caller had gone, or claimed too late to run under its lease. It is no
// outcome of the handler, and is never stored for an idempotency key. grpc
// sends its status as is; errors.Is and errors.As see the error it wraps.
type srvShed struct{ err error }

func (e *srvShed) Error() string              { return e.err.Error() }
func (e *srvShed) Unwrap() error              { return e.err }
func (e *srvShed) GRPCStatus() *status.Status { return status.Convert(e.err) }

// isShed reports whether err, an error of runHandler, is the server's own
// refusal rather than the handler's outcome.
func isShed(err error) bool {
	_, ok := err.(*srvShed)
	return ok
}

// errSrvShuttingDown is the answer of every call that comes once
// Server.Shutdown has begun.
var errSrvShuttingDown = &srvShed{status.Error(codes.Unavailable, "resilience: the server is shutting down; retry elsewhere")}

// srvPass is what a call admitted by the gates holds, released once by
// release when its handler has returned or panicked. The zero srvPass
// holds nothing.
type srvPass struct {
	l     *srvLimiter // the limit whose slot it holds; nil: none
	slot  limit.Slot
	cpu   *srvCPU   // the CPU shedder that admitted it; nil: none
	start time.Time // when its service time began (after any wait in a queue)
}

// runHandler is the one admission path (see above): it admits the call
// through the gates, waiting on caller, runs handler on hctx, and releases
// what the call held, whichever way the handler ends (a panic goes on up).
// For a call without idempotency or a key, caller and hctx are one
// context.
func (s *Server) runHandler(caller, hctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	p, err := s.admit(caller, hctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	if p == (srvPass{}) {
		return handler(hctx, req)
	}
	panicked := true
	defer func() { s.release(&p, hctx, err, panicked) }()
	resp, err = handler(hctx, req)
	panicked = false
	return resp, err
}

// admit passes a call of fullMethod through the gates: it returns what the
// call holds (the zero srvPass when no gate applies), or the *srvShed of
// the gate that refused it, holding nothing.
func (s *Server) admit(caller, hctx context.Context, fullMethod string) (srvPass, error) {
	if s.closing.Load() {
		return srvPass{}, s.onRefusal.shutdown(caller, fullMethod)
	}
	rs := s.rates
	if rs == nil {
		return s.admitConcurrency(caller, hctx, fullMethod)
	}
	set := rs.lookup(fullMethod)
	if set == nil {
		return s.admitConcurrency(caller, hctx, fullMethod)
	}
	keys, err := rs.admit(caller, set, fullMethod)
	if err != nil {
		return srvPass{}, err
	}
	// Shed past the rate limits, or a panic there (a user's
	// CriticalityFunc or TenantFunc): the call does not run, and its
	// tokens go back, once.
	refund := true
	defer func() {
		if refund {
			rs.refund(set, keys)
		}
	}()
	p, err := s.admitConcurrency(caller, hctx, fullMethod)
	refund = err != nil
	return p, err
}

// admitConcurrency is admit's second gate: the method's concurrency limit,
// or the CPU shedder.
func (s *Server) admitConcurrency(caller, hctx context.Context, fullMethod string) (srvPass, error) {
	ls := s.limits
	if ls == nil || ls.exempt(fullMethod) {
		return srvPass{}, nil
	}
	if l := ls.lookup(fullMethod); l != nil {
		now := ls.clk.Now()
		left := limit.NoDeadline
		if dl, ok := hctx.Deadline(); ok {
			left = dl.Sub(now)
		}
		return s.admitLimit(caller, hctx, l, fullMethod, l.class(fullMethod), now, left)
	}
	if ls.cpu != nil {
		return s.admitCPU(caller, fullMethod)
	}
	return srvPass{}, nil
}

// release ends what p holds, for a call whose handler ran on hctx and
// returned err (or panicked).
func (s *Server) release(p *srvPass, hctx context.Context, err error, panicked bool) {
	ls := s.limits
	end := ls.clk.Now()
	o := callOutcome(hctx, err, panicked)
	if p.l != nil {
		p.l.Release(end, p.slot, end.Sub(p.start), o)
	}
	if c := p.cpu; c != nil {
		if o != limit.Completed {
			c.bbr.Abandon()
		} else {
			c.bbr.Release(end, end.Sub(p.start))
		}
	}
}

// admitLimit takes a slot of l for a call of fullMethod, of cost class
// class, that arrived at now with left of its handler's deadline
// (limit.NoDeadline: none, and then it is never shed for its deadline): at
// once, or from the queue, waiting on the caller's context and the
// handler's. Admitted, it returns the slot
// and when the call's service time starts (after its time in the queue,
// which is not the service's latency); shed, it returns a *srvShed with
// the status, and holds nothing.
func (s *Server) admitLimit(caller, hctx context.Context, l *srvLimiter, fullMethod string, class int, now time.Time, left time.Duration) (srvPass, error) {
	ls := s.limits
	crit := ls.criticality(caller)
	r := limit.Request{Crit: limit.Criticality(crit), Left: left, Tenant: ls.tenantOf(caller), Class: class}
	slot, v, pushback := l.Acquire(now, r)
	switch v {
	case limit.ShedDeadline:
		ls.m.shedCall(caller, fullMethod, crit, shedDeadline)
		err := &srvShed{status.Errorf(codes.DeadlineExceeded,
			"resilience: %v left of the caller's deadline, less than the service time %v: not started",
			left.Round(time.Microsecond), l.DoorRTT(now, r.Class))}
		s.limitRefusal(caller, l, fullMethod, crit, r.Tenant, RefusalDeadline, err)
		return srvPass{}, err
	case limit.ShedLimit:
		var admitted, queued bool
		slot, admitted, queued = s.wait(caller, hctx, l, now, r)
		if queued {
			arrived := now
			now = ls.clk.Now()
			ls.m.waited(caller, fullMethod, now.Sub(arrived))
		}
		if !admitted {
			if queued && s.closing.Load() { // taken out of the queue by Shutdown
				return srvPass{}, s.onRefusal.shutdown(caller, fullMethod)
			}
			reason, refusal := shedOverLimit, RefusalLimit
			if queued {
				reason, refusal = shedQueueTimeout, RefusalQueueTimeout
			}
			ls.m.shedCall(caller, fullMethod, crit, reason)
			err := ls.shedError(caller, crit, pushback)
			s.limitRefusal(caller, l, fullMethod, crit, r.Tenant, refusal, err)
			return srvPass{}, err
		}
		if err := caller.Err(); err != nil { // admitted as its caller went: the slot is of no use to it
			l.Abandon(now, slot)
			ls.m.shedCall(caller, fullMethod, crit, shedQueueTimeout)
			shed := &srvShed{status.FromContextError(err).Err()}
			s.limitRefusal(caller, l, fullMethod, crit, r.Tenant, RefusalQueueTimeout, shed)
			return srvPass{}, shed
		}
		if s.closing.Load() { // admitted as the server began to shut down
			l.Abandon(now, slot)
			return srvPass{}, s.onRefusal.shutdown(caller, fullMethod)
		}
	}
	ls.m.admit(caller, fullMethod, crit)
	return srvPass{l: l, slot: slot, start: now}, nil
}

// wait queues r, a call that arrived at now and that the limit shed, when
// the queue takes it: until a slot is handed to it (admitted), MaxQueueWait
// passes, its deadline comes within the door's service time, a more
// critical call takes its place, the caller's context ends (a caller that
// has gone leaves the queue at once), the handler's ends, or the Server
// shuts down. It returns the slot of an admitted call, and whether the call
// entered the queue (false: the queue is full of calls it does not
// displace, or there is none).
func (s *Server) wait(caller, hctx context.Context, l *srvLimiter, now time.Time, r limit.Request) (slot limit.Slot, admitted, queued bool) {
	d := l.maxWait
	if d == 0 {
		return slot, false, false
	}
	if r.Left != limit.NoDeadline {
		d = min(d, r.Left-l.DoorRTT(now, r.Class))
	}
	if d <= 0 {
		return slot, false, false
	}
	w, ok := l.Enqueue(now, r)
	if !ok {
		return slot, false, false
	}
	t := s.limits.clk.NewTimer(d)
	select {
	case <-w.Ready():
	case <-t.C():
	case <-caller.Done():
	case <-hctx.Done():
	case <-s.closed:
	}
	t.Stop()
	slot, admitted = l.Leave(w)
	return slot, admitted, true
}

// admitCPU admits a call of fullMethod under the CPU-aware shedder, or
// sheds it with a *srvShed.
func (s *Server) admitCPU(caller context.Context, fullMethod string) (srvPass, error) {
	ls := s.limits
	crit := ls.criticality(caller)
	c := ls.cpu
	start := ls.clk.Now()
	v, pushback := c.bbr.Acquire(start, c.cpu(), limit.Criticality(crit))
	if v != limit.Admitted {
		ls.m.shedCall(caller, fullMethod, crit, shedCPU)
		err := ls.shedError(caller, crit, pushback)
		s.onRefusal.report(caller, Refusal{FullMethod: fullMethod, Reason: RefusalCPU, Limit: CPUSheddingName, Criticality: crit, Err: err})
		return srvPass{}, err
	}
	ls.m.admit(caller, fullMethod, crit)
	return srvPass{cpu: c, start: start}, nil
}

// callOutcome says what a call that ended with err on ctx teaches a limit:
// a latency sample only when the handler answered OK; when its deadline
// ended first, a possible drop (limit.DeadlineEnded: a drop only when the
// deadline left room for the service time); nothing when the caller went
// away, the handler failed (a failure's latency says nothing reliable of
// the load: a validation error returns in microseconds) or panicked.
func callOutcome(ctx context.Context, err error, panicked bool) limit.Outcome {
	switch {
	case panicked:
		return limit.Ignored
	case ctx.Err() == context.DeadlineExceeded:
		return limit.DeadlineEnded
	case ctx.Err() != nil, err != nil:
		return limit.Ignored
	}
	return limit.Completed
}

// hasKey reports whether the call carries idempotency-key metadata. It
// allocates only when it does (grpc copies the values).
func hasKey(ctx context.Context) bool {
	return len(metadata.ValueFromIncomingContext(ctx, wire.IdempotencyKeyHeader)) > 0
}

// srvStripStream is the stream of a keyed call whose handler runs without
// a capture (a KeyIgnored method, or the store failed and the server fails
// open): it passes the handler's metadata on without
// wire.IdempotencyReplayedHeader, which only the interceptor sets, on
// answers for which the handler did not run. A fresh answer never reads as
// a replay, on any path.
type srvStripStream struct{ grpc.ServerTransportStream }

func (s srvStripStream) SetHeader(md metadata.MD) error {
	return s.ServerTransportStream.SetHeader(srvWithoutReplayed(md))
}

func (s srvStripStream) SendHeader(md metadata.MD) error {
	return s.ServerTransportStream.SendHeader(srvWithoutReplayed(md))
}

func (s srvStripStream) SetTrailer(md metadata.MD) error {
	return s.ServerTransportStream.SetTrailer(srvWithoutReplayed(md))
}

// stripped returns ctx with its stream wrapped in a srvStripStream; ctx
// as is when it has no stream (the interceptor called outside a grpc
// server).
func stripped(ctx context.Context) context.Context {
	if st := grpc.ServerTransportStreamFromContext(ctx); st != nil {
		return grpc.NewContextWithServerTransportStream(ctx, srvStripStream{st})
	}
	return ctx
}
