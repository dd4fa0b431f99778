package server

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/internal/rpcname"
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

// srvLimiter is one limit with its queue, and the cost classes of its
// methods.
type srvLimiter struct {
	*limit.Limiter
	maxWait time.Duration // of the queue; immutable
	name    string        // its LimitStatus.Name; immutable once New returns
	// classes gives each method under the limit a cost class of its own
	// (limit.Request.Class), by full method, so that a cheap method never
	// makes an expensive one look queued (issue 33, finding 1). The first
	// limit.MaxClasses−1 methods seen get one each; the methods beyond
	// share class 0, which no method has alone, so the map stays bounded
	// whatever names a proxy forwards (REVIEW class 4).
	classes sync.Map    // full method -> int in [1, limit.MaxClasses)
	full    atomic.Bool // every class is handed out: new methods share class 0
	classMu sync.Mutex  // hands classes out
	nclass  int         // classes handed out; guarded by classMu
}

// class returns the cost class of fullMethod under l. It allocates and
// locks only for a method's first call.
func (l *srvLimiter) class(fullMethod string) int {
	if c, ok := l.classes.Load(fullMethod); ok {
		return c.(int)
	}
	if l.full.Load() {
		return 0
	}
	l.classMu.Lock()
	defer l.classMu.Unlock()
	if c, ok := l.classes.Load(fullMethod); ok {
		return c.(int)
	}
	if l.nclass >= limit.MaxClasses-1 {
		l.full.Store(true)
		return 0
	}
	l.nclass++
	l.classes.Store(fullMethod, l.nclass)
	return l.nclass
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
	rnd := newSrvRand(o.limitSrc) // the Server's own, whatever other Servers use the source
	if o.limit != nil {
		l, err := newLimiter(*o.limit, fair, rnd)
		if err != nil {
			return nil, errorf("Limits.Config.concurrencyLimit: %v", err)
		}
		ls.server = l
		ls.all = append(ls.all, namedLimiter{"", l})
	}
	seen := map[string]int{} // index in all by name
	for _, m := range o.methodLimits {
		l, err := newLimiter(m.cfg, fair, rnd)
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

// tenantOf names the tenant of a call; "" without tenant fairness.
func (ls *srvLimits) tenantOf(ctx context.Context) string {
	if ls.tenant == nil {
		return ""
	}
	return ls.tenant(ctx)
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

// OverflowTenant is the TenantStatus.Tenant of the tenant that the names
// past Limits.Config.TenantFairness's maxTenants (or longer than 256
// bytes) share.
const OverflowTenant = limit.OverflowTenant

// TenantStatus is one tenant's calls in a concurrency limit
// ([Server.TenantStatuses]).
type TenantStatus struct {
	// Tenant is the tenant's name (TenantFunc or the metadata key's
	// value): "" the calls without one, OverflowTenant the names past the
	// bound.
	Tenant string
	// InFlight and Queued are its calls admitted and waiting; Held is the
	// moving average of InFlight that admission compares with the
	// tenant's fair share.
	InFlight, Queued int
	Held             float64
}

// TenantStatuses returns up to n of the tenants with calls in flight or
// queued in the concurrency limit named name (LimitStatus.Name: "" the
// server's), the most in flight first; nil when there is no such limit or
// n is not positive. Without tenant fairness, every call is the tenant "".
// It reads each tenant the limit remembers (at most maxTenants + 2) under
// the limit's lock: it is for an operator, not for every call.
func (s *Server) TenantStatuses(name string, n int) []TenantStatus {
	if s.limits == nil || n <= 0 {
		return nil
	}
	for _, nl := range s.limits.all {
		if nl.name != name {
			continue
		}
		loads := nl.l.BusyTenants(n)
		out := make([]TenantStatus, len(loads))
		for i, t := range loads {
			out[i] = TenantStatus{Tenant: t.Name, InFlight: t.InFlight, Queued: t.Queued, Held: t.Held}
		}
		return out
	}
	return nil
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
