package server

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/rpcname"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/internal/clock"
	"github.com/grpc-resilience/resilience/internal/limit"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// methodLimit is the limit of one name of a Limits.Config.MethodConfig
// entry; a later one for the same name replaces an earlier one.
type methodLimit struct {
	raw  string
	name serviceconfig.Name
	cfg  serviceconfig.ConcurrencyLimit
}

// srvLimits holds the server's limiters, built once by New; the maps
// are read-only after.
type srvLimits struct {
	server   *srvLimiter            // nil: methods not named are not limited
	methods  map[string]*srvLimiter // by full method
	services map[string]*srvLimiter // by service
	// all lists every limiter with its name ("" for the server's).
	all []namedLimiter
	// cpu sheds the methods without a limiter; nil: off.
	cpu *srvCPU
	// shed caches the shed statuses by criticality and pushback step
	// (limit.PushbackStep; the last entry is do-not-retry), each built
	// once, when first needed.
	shed [4][]atomic.Pointer[shedEntry]
	// m records admissions, sheds and queue waits; never nil.
	m *srvLimitMetrics
	// crit resolves a call's criticality from what it sent; nil: as sent
	// (Limits.Criticality).
	crit CriticalityFunc
	// tenant names a call's tenant; nil: every call is the default tenant
	// (Limits.Config.TenantFairness).
	tenant TenantFunc
	// streams holds the full methods and services whose streams are
	// limited (Limits.Streams); empty: none.
	streams map[string]bool
	// clk tells the limiters' time and times their queue waits.
	clk clock.Clock
	// exemptSvc are the services whose unary calls no limit and no CPU
	// shedding reaches unless a Limits.Config entry names them:
	// rpcname.ExemptServices, copied by New.
	exemptSvc []string
}

type namedLimiter struct {
	name string
	l    *srvLimiter
}

// srvLimiter is one limit with its queue.
type srvLimiter struct {
	*limit.Limiter
	maxWait time.Duration // of the queue; immutable
	name    string        // its LimitStatus.Name; immutable once New returns
}

// newSrvLimits builds the limiters of o; nil when none is configured.
func newSrvLimits(o *options) (*srvLimits, error) {
	if o.limit == nil && len(o.methodLimits) == 0 && o.cpu == nil {
		return nil, nil
	}
	ls := &srvLimits{methods: map[string]*srvLimiter{}, services: map[string]*srvLimiter{}, crit: o.criticality,
		streams: map[string]bool{}, clk: clock.Real, exemptSvc: slices.Clone(rpcname.ExemptServices)}
	for c := range ls.shed {
		ls.shed[c] = make([]atomic.Pointer[shedEntry], limit.PushbackSteps+1)
	}
	for _, n := range o.streamLimits {
		ls.streams[n] = true
	}
	var fair serviceconfig.TenantFairness
	if o.fairness != nil {
		fair, ls.tenant = o.fairness.cfg, o.fairness.tenant
	}
	var err error
	if ls.cpu, err = newSrvCPU(o.cpu); err != nil {
		return nil, err
	}
	if o.limit != nil {
		l, err := newLimiter(*o.limit, fair, o.limitRand)
		if err != nil {
			return nil, errorf("Limits.Config.concurrencyLimit: %v", err)
		}
		ls.server = l
		ls.all = append(ls.all, namedLimiter{"", l})
	}
	seen := map[string]int{} // index in all by name
	for _, m := range o.methodLimits {
		l, err := newLimiter(m.cfg, fair, o.limitRand)
		if err != nil {
			return nil, errorf("Limits.Config methodConfig %q: %v", m.raw, err)
		}
		key := nameKey(m.name)
		l.name = key
		if m.name.Method == "" {
			ls.services[key] = l
		} else {
			ls.methods[key] = l
		}
		if i, ok := seen[key]; ok {
			ls.all[i].l = l
			continue
		}
		seen[key] = len(ls.all)
		ls.all = append(ls.all, namedLimiter{key, l})
	}
	if ls.m, err = newSrvLimitMetrics(o.meterProvider, ls); err != nil {
		return nil, errorf("server limit metrics: %v", err)
	}
	return ls, nil
}

// newLimiter normalizes cfg (validated) and the tenant fairness for the
// engine; rnd nil: the runtime's random generator.
func newLimiter(cfg serviceconfig.ConcurrencyLimit, fair serviceconfig.TenantFairness, rnd func() float64) (*srvLimiter, error) {
	alg := limit.Vegas
	if cfg.Algorithm == "aimd" {
		alg = limit.AIMD
	}
	l, err := limit.New(limit.Config{
		Algorithm: alg, InitialLimit: cfg.InitialLimit, MinLimit: cfg.MinLimit,
		MaxLimit: cfg.MaxLimit, BaseWindow: cfg.BaseWindow, Rand: rnd,
		MaxQueue: min(cfg.MaxQueue, 1<<30), MaxTenants: fair.MaxTenants, TenantIdle: fair.IdleTimeout,
	})
	if err != nil {
		return nil, err
	}
	return &srvLimiter{Limiter: l, maxWait: cfg.MaxQueueWait}, nil
}

// wait queues r, a call that arrived at now and that the limit shed, when
// the queue takes it: until a slot is handed to it (admitted), MaxQueueWait
// passes, its deadline comes within the door's service time, a more
// critical call takes its place, or its context ends. It returns the slot
// of an admitted call, and whether the call entered the queue (false: the
// queue is full of calls it does not displace, or there is none).
func (l *srvLimiter) wait(ctx context.Context, clk clock.Clock, now time.Time, r limit.Request) (s limit.Slot, admitted, queued bool) {
	d := l.maxWait
	if d == 0 {
		return s, false, false
	}
	if r.Left != limit.NoDeadline {
		d = min(d, r.Left-l.DoorRTT(now))
	}
	if d <= 0 {
		return s, false, false
	}
	w, ok := l.Enqueue(now, r)
	if !ok {
		return s, false, false
	}
	t := clk.NewTimer(d)
	select {
	case <-w.Ready():
	case <-t.C():
	case <-ctx.Done():
	}
	t.Stop()
	s, admitted = l.Leave(w)
	return s, admitted, true
}

// lookup returns the limiter of fullMethod: its own, its service's, or the
// server's; nil when none applies. It allocates nothing.
func (ls *srvLimits) lookup(fullMethod string) *srvLimiter {
	if l, ok := ls.methods[fullMethod]; ok {
		return l
	}
	if svc, ok := serviceOf(fullMethod); ok {
		if l, ok := ls.services[svc]; ok {
			return l
		}
	}
	return ls.server
}

// exempt reports whether a unary call of fullMethod is out of every limit
// and of the CPU shedding: a method of the exempt services (health checks
// and reflection, rpcname.ExemptServices) that no Limits.Config entry
// names, by method or by service. A health check shed under overload tells
// the orchestrator that the server is dead, and a restart of an overloaded
// replica moves its load onto the others: the outage grows. Every default
// service starts with "grpc.", so other methods cost a byte comparison or
// two. It allocates nothing.
func (ls *srvLimits) exempt(fullMethod string) bool {
	if !strings.HasPrefix(fullMethod, "/grpc.") {
		return false
	}
	svc, ok := serviceOf(fullMethod)
	if !ok || !slices.Contains(ls.exemptSvc, svc) {
		return false
	}
	_, named := ls.methods[fullMethod]
	if _, ok := ls.services[svc]; ok {
		named = true
	}
	return !named
}

// nameKey is how the server's per-method tables file a parsed name: its
// full method "/pkg.Service/Method", or its service "pkg.Service".
func nameKey(n serviceconfig.Name) string {
	if n.Method == "" {
		return n.Service
	}
	return "/" + n.Service + "/" + n.Method
}

// serviceOf returns the service of fullMethod ("/pkg.Service/Method"),
// what lies between its leading slash and its last one, for the
// per-service entries of the server's tables; ok false when there is none.
// It slices fullMethod and allocates nothing.
func serviceOf(fullMethod string) (service string, ok bool) {
	if i := strings.LastIndexByte(fullMethod, '/'); i > 1 {
		return fullMethod[1:i], true
	}
	return "", false
}

// limited runs a unary call under its limiter l: admitted, it runs the rest
// of the interceptor and the handler and is released when they return or
// panic; shed, they do not run.
//
// A call with an idempotency key, on a Server with idempotency, is limited
// around its handler only (limitedKeyed): a duplicate that waits for the
// running execution or gets its stored outcome never runs the handler, so
// it is no load on it, holds no slot and gives no latency sample (issue
// 19, defect 4).
func (s *Server) limited(ctx context.Context, l *srvLimiter, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.idem != nil && len(metadata.ValueFromIncomingContext(ctx, wire.IdempotencyKeyHeader)) > 0 {
		return s.limitedKeyed(ctx, l, req, info, handler)
	}
	return s.runLimited(ctx, l, req, info, handler, true)
}

// limitedKeyed runs a keyed call on a Server with idempotency: headroom and
// idempotency first, then, for the call that runs the handler, the limit
// around the handler, on the handler's context. It costs the keyed call one
// allocation, the closure.
func (s *Server) limitedKeyed(ctx context.Context, l *srvLimiter, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	return s.srvUnaryInner(ctx, req, info, func(hctx context.Context, req any) (any, error) {
		return s.runLimited(hctx, l, req, info, handler, false)
	})
}

// runLimited admits a call under l and runs it: with inner, the rest of the
// unary interceptor and then handler; without, handler alone. The slot is
// released when they return or panic (the panic goes on up), with what
// the call's end says of the server's load (callOutcome).
func (s *Server) runLimited(ctx context.Context, l *srvLimiter, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler, inner bool) (resp any, err error) {
	now := s.limits.clk.Now()
	left := limit.NoDeadline
	if dl, ok := ctx.Deadline(); ok {
		left = dl.Sub(now)
	}
	slot, start, err := s.admit(ctx, l, info.FullMethod, now, left)
	if err != nil {
		if !inner { // inside the idempotency layer: no outcome to store
			err = limitShed{err}
		}
		return nil, err
	}
	panicked := true
	defer func() {
		end := s.limits.clk.Now()
		l.Release(end, slot, end.Sub(start), callOutcome(ctx, err, panicked))
	}()
	if inner {
		resp, err = s.srvUnaryInner(ctx, req, info, handler)
	} else {
		resp, err = handler(ctx, req)
	}
	panicked = false
	return resp, err
}

// limitShed is the limit's shed of a keyed call, which the limit decides
// inside the idempotency layer (limitedKeyed): it is no outcome of the
// handler, and is never stored for the key, whatever
// Idempotency.UnstoredCodes says, so that a retry runs once there is
// room. grpc sends its status as is.
type limitShed struct{ error }

func (e limitShed) GRPCStatus() *status.Status { return status.Convert(e.error) }

func (e limitShed) Unwrap() error { return e.error }

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

// tenantOf names the tenant of a call; "" without tenant fairness.
func (ls *srvLimits) tenantOf(ctx context.Context) string {
	if ls.tenant == nil {
		return ""
	}
	return ls.tenant(ctx)
}

// admit takes a slot of l for a call of fullMethod that arrived at now with
// left of its deadline (limit.NoDeadline: none, and then it is never shed
// for its deadline): at once, or from the queue. Admitted, it returns the
// slot and when the call's service time starts (after its time in the
// queue, which is not the service's latency), and the caller must give the
// slot back once (Release or Abandon); shed, it returns the status, and
// holds nothing.
func (s *Server) admit(ctx context.Context, l *srvLimiter, fullMethod string, now time.Time, left time.Duration) (slot limit.Slot, start time.Time, err error) {
	ls := s.limits
	crit := ls.criticality(ctx)
	r := limit.Request{Crit: limit.Criticality(crit), Left: left, Tenant: ls.tenantOf(ctx)}
	slot, v, pushback := l.Acquire(now, r)
	switch v {
	case limit.ShedDeadline:
		ls.m.shedCall(ctx, fullMethod, crit, shedDeadline)
		err = status.Errorf(codes.DeadlineExceeded,
			"resilience: %v left of the caller's deadline, less than the service time %v: not started",
			left.Round(time.Microsecond), l.DoorRTT(now))
		s.limitRefusal(ctx, l, fullMethod, crit, r.Tenant, RefusalDeadline, err)
		return slot, now, err
	case limit.ShedLimit:
		var admitted, queued bool
		slot, admitted, queued = l.wait(ctx, ls.clk, now, r)
		if queued {
			arrived := now
			now = ls.clk.Now()
			ls.m.waited(ctx, fullMethod, now.Sub(arrived))
		}
		if !admitted {
			reason, refusal := shedOverLimit, RefusalLimit
			if queued {
				reason, refusal = shedQueueTimeout, RefusalQueueTimeout
			}
			ls.m.shedCall(ctx, fullMethod, crit, reason)
			err = ls.shedError(ctx, crit, pushback)
			s.limitRefusal(ctx, l, fullMethod, crit, r.Tenant, refusal, err)
			return slot, now, err
		}
	}
	ls.m.admit(ctx, fullMethod, crit)
	return slot, now, nil
}

// LimitStatus is the state of one concurrency limit, from
// Server.LimitStatuses.
type LimitStatus struct {
	// Name is the full method or service of a Limits.Config.MethodConfig entry,
	// "" for the server's limit.
	Name string
	// Limit is the current limit; InFlight the calls admitted and running;
	// Queued the calls waiting for a slot.
	Limit, InFlight, Queued int
	// BaseRTT is the service time without queueing, as learned;
	// SmoothedRTT the moving average of admitted calls' latencies.
	BaseRTT, SmoothedRTT time.Duration
	// Admitted counts the calls admitted, by criticality.
	Admitted [4]uint64
	// ShedLimit and ShedDeadline count the calls shed over the limit and
	// at the door for too short a deadline, by criticality. A call over the
	// limit that then waited in the queue counts in ShedLimit on arrival,
	// and in Admitted too when a slot freed for it.
	ShedLimit, ShedDeadline [4]uint64
	// Tenants is the number of tenants sharing the limit now
	// (Limits.Config.TenantFairness): those with calls in flight or queued, or seen
	// within the idle timeout; 1 or 0 without tenants.
	Tenants int
}

// CPUSheddingName is the LimitStatus.Name of the CPU-aware shedder
// (Limits.CPU), whose Limit is the current bandwidth-delay product
// (0 before it has measured one) and which has no BaseRTT.
const CPUSheddingName = "(cpu)"

// LimitStatuses returns the state of each of the server's concurrency
// limits: the CPU-aware shedder's or the server's first, then the
// methods' in no set order.
func (s *Server) LimitStatuses() []LimitStatus {
	if s.limits == nil {
		return nil
	}
	return s.limits.statuses(s.limits.clk.Now())
}

// statuses is LimitStatuses at now: the CPU shedder's first, when there is
// one, then the limiters in the order of ls.all.
func (ls *srvLimits) statuses(now time.Time) []LimitStatus {
	out := make([]LimitStatus, 0, len(ls.all)+1)
	if c := ls.cpu; c != nil {
		sn := c.bbr.Snapshot(now)
		out = append(out, LimitStatus{
			Name: CPUSheddingName, Limit: sn.Limit, InFlight: sn.InFlight, SmoothedRTT: sn.SmoothedRTT,
			Admitted: sn.Count[limit.Admitted], ShedLimit: sn.Count[limit.ShedLimit],
		})
	}
	for _, nl := range ls.all {
		sn := nl.l.Snapshot(now)
		out = append(out, LimitStatus{
			Name: nl.name, Limit: sn.Limit, InFlight: sn.InFlight, Queued: sn.Queued,
			BaseRTT: sn.BaseRTT, SmoothedRTT: sn.SmoothedRTT,
			Admitted: sn.Count[limit.Admitted], ShedLimit: sn.Count[limit.ShedLimit],
			ShedDeadline: sn.Count[limit.ShedDeadline], Tenants: sn.Tenants,
		})
	}
	return out
}
