package server

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/grpc-resilience/resilience/interceptor/internal/pushback"
	"github.com/grpc-resilience/resilience/interceptor/internal/rpcname"
	"github.com/grpc-resilience/resilience/interceptor/internal/telemetry"
	quota "github.com/grpc-resilience/resilience/interceptor/ratelimit"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/internal/clock"
	rlengine "github.com/grpc-resilience/resilience/internal/ratelimit"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The rate limits (Limits.Config's rateLimits) are the first gate of the
// one admission path (admission.go): a call passes every rate limit of its
// method before it asks the concurrency limit for a slot, so a call the
// rate refuses never holds, nor waits for, a slot; a call the concurrency
// limit then sheds gets its tokens back (Refund), so a tenant's quota counts
// the calls the server ran. The gate holds nothing once it has decided: a
// token spent is spent. A keyed call is decided when it runs its handler,
// so a duplicate that waits for the first execution or replays its stored
// outcome spends no token: it is no work for the handler. A stream spends
// one token of each limit when it opens, whether or not Limits.Streams puts
// it under a concurrency limit.

// maxRatesPerMethod bounds the rate limits that apply to one method: a
// call's decision keeps which of them admitted it in a bitmask.
const maxRatesPerMethod = 64

// srvRates is the server's rate limits, built once by New; read-only after.
type srvRates struct {
	// methods and services give the limits of a full method or a service
	// that an entry with rate limits names: every limit that applies, the
	// most specific first (its own, its service's, the server's); top is
	// the server's, for every other method. Exempt services (health,
	// reflection) that no such entry names get none.
	methods, services map[string]*srvRateSet
	top               *srvRateSet // nil: no top-level limit
	exemptSvc         []string
	crit              CriticalityFunc                           // Limits.Criticality; nil: as sent, at most Critical
	tenant            TenantFunc                                // nil: no limit keys by tenant
	scope             func(ctx context.Context) (string, error) // Idempotency.Scope; nil: no limit keys by it
	clk               clock.Clock
	all               []*srvRate                     // every limit, in document order, for RateLimitStatuses
	m                 *srvRateMetrics                // never nil
	onRefusal         func(context.Context, Refusal) // WithOnRefusal's hook; nil: none
}

// srvRateSet is the limits that apply to some methods.
type srvRateSet struct {
	list []*srvRate
	keys uint8 // the RateLimitKey kinds list counts by (rateKeyBit), so a call computes only those
}

// srvRate is one rate limit: local (an engine of this process's) or
// distributed (a Limiter of Limits.Quota).
type srvRate struct {
	name      string
	key       uint8                              // rateKeyBit of its key kind
	local     *rlengine.Limiter                  // nil for a distributed limit
	shared    quota.Limiter                      // nil for a local limit
	violation *errdetails.QuotaFailure_Violation // its QuotaFailure entry, built once; read-only
	sets      srvRateSets
	cfg       serviceconfig.RateLimit // as configured, for RateLimitStatuses
	path      string                  // where in Limits.Config, for RateLimitStatuses
}

// The key kinds as bits of srvRateSet.keys.
const (
	keyBitShared uint8 = 1 << iota
	keyBitTenant
	keyBitPeer
	keyBitScope
)

func rateKeyBit(k serviceconfig.RateLimitKey) uint8 {
	switch k {
	case serviceconfig.KeyTenant:
		return keyBitTenant
	case serviceconfig.KeyPeer:
		return keyBitPeer
	case serviceconfig.KeyIdempotencyScope:
		return keyBitScope
	}
	return keyBitShared
}

// rateKeysBy reports whether a rate limit of c counts by key k.
func rateKeysBy(c *serviceconfig.ServerConfig, k serviceconfig.RateLimitKey) bool {
	for i := range c.RateLimits {
		if c.RateLimits[i].Key == k {
			return true
		}
	}
	for _, mc := range c.MethodConfig {
		for i := range mc.RateLimits {
			if mc.RateLimits[i].Key == k {
				return true
			}
		}
	}
	return false
}

// applyRates collects the rate limits of l.Config into o (validated
// already) and checks what they need: a Quota for a distributed limit, a
// tenant for a limit keyed by tenant.
func (l *Limits) applyRates(o *options) error {
	cfg := &l.Config
	distributed := ""
	for i, r := range cfg.RateLimits {
		o.rates = append(o.rates, rateCfg{path: "rateLimits[" + strconv.Itoa(i) + "]", limit: r})
	}
	for i, mc := range cfg.MethodConfig {
		for j, r := range mc.RateLimits {
			o.rates = append(o.rates, rateCfg{
				path:  "methodConfig[" + strconv.Itoa(i) + "].rateLimits[" + strconv.Itoa(j) + "]",
				names: mc.Name, limit: r,
			})
		}
	}
	for _, rc := range o.rates {
		if rc.limit.Distributed && distributed == "" {
			distributed = rc.path
		}
		if rc.limit.Key == serviceconfig.KeyTenant && l.Tenant == nil && cfg.TenantFairness == nil {
			return errorf("Limits.Config.%s %q keys by tenant, but nothing names the tenants: set Limits.Tenant, "+
				"or a tenantFairness block with the metadataKey that carries the tenant (otherwise every call would be one tenant)",
				rc.path, rc.limit.Name)
		}
	}
	switch {
	case distributed != "" && (l.Quota == nil || srvNilPointer(l.Quota)):
		return errorf("Limits.Config.%s is distributed, but Limits.Quota is nil: give the store that shares it among the replicas "+
			"(redisquota.New), or make the limit local (distributed: false)", distributed)
	case distributed == "" && l.Quota != nil:
		return errorf("Limits.Quota is set, but no rate limit of Limits.Config is distributed: it would do nothing")
	}
	o.quota = l.Quota
	if rateKeysBy(cfg, serviceconfig.KeyTenant) {
		o.rateTenant = l.Tenant
		if o.rateTenant == nil {
			o.rateTenant = TenantFromMetadata(cfg.TenantFairness.MetadataKey)
		}
	}
	return nil
}

// newSrvRates builds the rate limits of o; nil when there are none.
// scope is Idempotency.Scope (nil without idempotency).
func newSrvRates(o *options, scope func(context.Context) (string, error), mp metric.MeterProvider) (*srvRates, error) {
	if len(o.rates) == 0 {
		return nil, nil
	}
	rs := &srvRates{methods: map[string]*srvRateSet{}, services: map[string]*srvRateSet{}, crit: o.criticality,
		tenant: o.rateTenant, scope: scope, clk: clock.Real, exemptSvc: slices.Clone(rpcname.ExemptServices), onRefusal: o.onRefusal}
	var err error
	if rs.m, err = newSrvRateMetrics(mp); err != nil {
		return nil, errorf("server rate limit metrics: %v", err)
	}
	now := rs.clk.Now()
	own := map[string][]*srvRate{} // the limits of each entry's names, by nameKey
	var top []*srvRate
	for _, rc := range o.rates {
		r := &rc.limit
		if r.Key == serviceconfig.KeyIdempotencyScope && scope == nil {
			return nil, errorf("Limits.Config.%s %q keys by idempotencyScope, but the Server has no idempotency (WithIdempotency), "+
				"whose Scope names the callers", rc.path, r.Name)
		}
		sr := &srvRate{name: r.Name, key: rateKeyBit(r.Key), sets: rs.m.limitSets(r.Name), cfg: *r, path: rc.path}
		rs.all = append(rs.all, sr)
		if r.Distributed {
			if sr.shared, err = o.quota.RateLimiter(*r); err != nil {
				return nil, errorf("Limits.Quota: limit %s %q: %v", rc.path, r.Name, err)
			}
			if sr.shared == nil || srvNilPointer(sr.shared) {
				return nil, errorf("Limits.Quota: limit %s %q: the store returned no Limiter", rc.path, r.Name)
			}
		} else if sr.local, err = rlengine.New(rlengine.Config{Rate: r.Rate, Per: r.Per, Burst: r.Burst, MaxKeys: r.MaxKeys}, now); err != nil {
			return nil, errorf("Limits.Config.%s %q: %v", rc.path, r.Name, err)
		}
		per := r.Per
		if per == 0 {
			per = time.Second
		}
		sr.violation = &errdetails.QuotaFailure_Violation{
			Subject: "ratelimit:" + r.Name,
			Description: "at most " + strconv.FormatFloat(r.Rate, 'g', -1, 64) + " calls per " + per.String() +
				" per " + string(r.Key) + ", bursts of " + strconv.Itoa(r.Burst),
		}
		if rc.names == nil {
			top = append(top, sr)
			continue
		}
		for _, n := range rc.names {
			own[nameKey(n)] = append(own[nameKey(n)], sr)
		}
	}
	mk := func(name string, list ...[]*srvRate) (*srvRateSet, error) {
		set := &srvRateSet{}
		for _, l := range list {
			set.list = append(set.list, l...)
		}
		if len(set.list) > maxRatesPerMethod {
			return nil, errorf("Limits.Config: %d rate limits apply to %q: at most %d may apply to one method", len(set.list), name, maxRatesPerMethod)
		}
		for _, r := range set.list {
			set.keys |= r.key
		}
		return set, nil
	}
	if len(top) > 0 {
		if rs.top, err = mk("every method", top); err != nil {
			return nil, err
		}
	}
	for name, l := range own {
		if strings.HasPrefix(name, "/") {
			svc, _ := serviceOf(name)
			rs.methods[name], err = mk(name, l, own[svc], top)
		} else {
			rs.services[name], err = mk(name, l, top)
		}
		if err != nil {
			return nil, err
		}
	}
	return rs, nil
}

// RateLimitStatus is the state of one rate limit of the Server
// (Limits.Config's rateLimits), from Server.RateLimitStatuses.
type RateLimitStatus struct {
	// Name is the limit's name; Path where it is in Limits.Config, such
	// as "rateLimits[0]" or "methodConfig[1].rateLimits[0]".
	Name, Path string
	// Key is what the limit counts by: "shared", "tenant", "peer" or
	// "idempotencyScope".
	Key serviceconfig.RateLimitKey
	// Rate calls per Per, in bursts of Burst.
	Rate  float64
	Per   time.Duration
	Burst int
	// Distributed reports that Limits.Quota shares the limit among the
	// replicas; Keys and Overflowed are then 0 (the store counts them).
	Distributed bool
	// Keys is the number of keys the limit remembers now; Overflowed
	// counts the decisions made for keys past its maxKeys.
	Keys       int
	Overflowed uint64
}

// RateLimitStatuses returns the state of each of the Server's rate limits,
// in the order of Limits.Config; nil when it has none. It reads each
// limit's counts (a lock that only a new key takes), never the call path's
// state, and is meant for an admin view, not for every call.
func (s *Server) RateLimitStatuses() []RateLimitStatus {
	rs := s.rates
	if rs == nil {
		return nil
	}
	out := make([]RateLimitStatus, 0, len(rs.all))
	for _, r := range rs.all {
		st := RateLimitStatus{Name: r.name, Path: r.path, Key: r.cfg.Key, Rate: r.cfg.Rate, Per: r.cfg.Per, Burst: r.cfg.Burst,
			Distributed: r.shared != nil}
		if st.Key == "" {
			st.Key = serviceconfig.KeyShared
		}
		if st.Per == 0 {
			st.Per = time.Second
		}
		if r.local != nil {
			ls := r.local.Stats()
			st.Keys, st.Overflowed = ls.Keys, ls.Overflowed
		}
		out = append(out, st)
	}
	return out
}

// lookup returns the limits of fullMethod; nil when none applies. It
// allocates nothing.
func (rs *srvRates) lookup(fullMethod string) *srvRateSet {
	if set, ok := rs.methods[fullMethod]; ok {
		return set
	}
	svc, ok := serviceOf(fullMethod)
	if ok {
		if set, ok := rs.services[svc]; ok {
			return set
		}
	}
	if ok && strings.HasPrefix(fullMethod, "/grpc.") && slices.Contains(rs.exemptSvc, svc) {
		return nil // health checks and reflection: exempt unless an entry names them
	}
	return rs.top
}

// callKeys are the keys of one call, each computed once, when a limit
// first needs it.
type callKeys struct {
	tenant, peer, scope string
}

// of returns the key of ctx's call for limit r's key kind.
func (k *callKeys) of(r *srvRate) string {
	switch r.key {
	case keyBitTenant:
		return k.tenant
	case keyBitPeer:
		return k.peer
	case keyBitScope:
		return k.scope
	}
	return ""
}

// keysOf computes the keys set needs for a call on ctx. An error is the
// idempotency scope's, returned to the caller as is.
func (rs *srvRates) keysOf(ctx context.Context, set *srvRateSet) (callKeys, error) {
	var k callKeys
	if set.keys&keyBitTenant != 0 {
		k.tenant = rs.tenant(ctx)
	}
	if set.keys&keyBitPeer != 0 {
		k.peer = peerKey(ctx)
	}
	if set.keys&keyBitScope != 0 {
		var err error
		if k.scope, err = rs.scope(ctx); err != nil {
			return k, err
		}
	}
	return k, nil
}

// peerKey is the caller's IP address for a TCP peer: its bytes, in the
// 4-byte form for an IPv4 address (mapped into IPv6 or not), without the
// port or zone; the address's text for another kind; "" without a peer.
// A TCP peer's key aliases its Addr's IP, which grpc never changes once
// the connection is accepted (a Limiter copies the keys it keeps), so that
// a call allocates nothing for it.
func peerKey(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	if a, ok := p.Addr.(*net.TCPAddr); ok {
		ip := a.IP
		if v4 := ip.To4(); v4 != nil {
			ip = v4 // a slice of ip: no copy
		}
		if len(ip) == net.IPv4len || len(ip) == net.IPv6len {
			return unsafe.String(&ip[0], len(ip))
		}
		return "" // no IP: one key for every such peer, as for no peer
	}
	return p.Addr.String()
}

// admit passes a call of fullMethod on ctx through every limit of set
// (see the top of the file). It returns nil, the call having taken a token
// of each, or the *srvShed of the refusal (RESOURCE_EXHAUSTED with
// RetryInfo, QuotaFailure and the pushback trailer), having taken none, or
// the idempotency scope's error (a *srvShed too, its status kept). keys are
// the call's keys, for a refund.
func (rs *srvRates) admit(ctx context.Context, set *srvRateSet, fullMethod string) (callKeys, error) {
	keys, err := rs.keysOf(ctx, set)
	if err != nil { // the scope's error, as is, but never stored as a keyed call's outcome
		return keys, &srvShed{err}
	}
	crit := resolveCriticality(rs.crit, ctx)
	now := rs.clk.Now()
	var admitted, refused uint64
	var wait time.Duration
	for i, r := range set.list {
		key := keys.of(r)
		var ok bool
		var w time.Duration
		if r.local != nil {
			ok, w = r.local.Allow(now, key, rlengine.Criticality(crit))
		} else {
			d, err := r.shared.Allow(ctx, key, crit)
			if err != nil { // the caller went while the limit waited for its store
				rs.refundMask(set, keys, admitted, now)
				return keys, &srvShed{status.FromContextError(err).Err()}
			}
			ok, w = d.OK, d.Wait
		}
		if ok {
			admitted |= 1 << i
			continue
		}
		refused |= 1 << i
		wait = max(wait, w)
	}
	if refused == 0 {
		for _, r := range set.list {
			rs.m.admit(ctx, r, crit)
		}
		return keys, nil
	}
	rs.refundMask(set, keys, admitted, now)
	rs.m.refused(ctx, fullMethod, crit)
	err = rs.refusal(ctx, set, refused, crit, wait)
	if rs.onRefusal != nil {
		rs.onRefusal(ctx, rs.refusalOf(ctx, set, refused, fullMethod, crit, &keys, wait, err))
	}
	return keys, err
}

// refusalOf is the Refusal, for WithOnRefusal, of a call of fullMethod
// with keys that the limits of set whose bits are in refused refused, with
// err, telling it to wait. Built on the refusal path only.
func (rs *srvRates) refusalOf(ctx context.Context, set *srvRateSet, refused uint64, fullMethod string, crit wire.Criticality, keys *callKeys, wait time.Duration, err error) Refusal {
	r := Refusal{FullMethod: fullMethod, Reason: RefusalRateLimit, Criticality: crit, Wait: wait, Err: err}
	for i, l := range set.list {
		if refused&(1<<i) == 0 {
			continue
		}
		if r.RateLimits == nil {
			r.Limit, r.Key = l.name, keys.of(l)
			if l.key == keyBitPeer {
				r.Key = peerText(ctx)
			}
		}
		r.RateLimits = append(r.RateLimits, l.name)
		if l.key == keyBitTenant {
			r.Tenant = keys.tenant
		}
	}
	return r
}

// peerText is the caller's peer as Refusal.Key names it: the IP address
// of a TCP peer (IPv4 unmapped), the address's text for another kind.
// Built on the refusal path only.
func peerText(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	if a, ok := p.Addr.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap().String()
		}
		return ""
	}
	return p.Addr.String()
}

// refund gives back the tokens of a call admit admitted, with its keys,
// that did not run (the concurrency limit shed it).
func (rs *srvRates) refund(set *srvRateSet, keys callKeys) {
	rs.refundMask(set, keys, 1<<len(set.list)-1, rs.clk.Now())
}

func (rs *srvRates) refundMask(set *srvRateSet, keys callKeys, mask uint64, now time.Time) {
	for i, r := range set.list {
		if mask&(1<<i) == 0 {
			continue
		}
		if r.local != nil {
			r.local.Cancel(now, keys.of(r))
		} else {
			r.shared.Refund(keys.of(r))
		}
	}
}

// refusal is the answer of a call the limits of set whose bits are in
// refused refused: RESOURCE_EXHAUSTED with a google.rpc.RetryInfo of wait
// (the exact time until the call would be admitted, if no other is
// meanwhile; the longest of the refusing limits'), a google.rpc.QuotaFailure
// naming each refusing limit, and the grpc-retry-pushback-ms trailer of
// wait rounded up to the millisecond (at least 1), so that a client that
// honours it never comes back early. It records the refusal. It is built
// per call: its wait is exact.
func (rs *srvRates) refusal(ctx context.Context, set *srvRateSet, refused uint64, crit wire.Criticality, wait time.Duration) error {
	qf := &errdetails.QuotaFailure{}
	var names strings.Builder
	for i, r := range set.list {
		if refused&(1<<i) == 0 {
			continue
		}
		rs.m.limit(ctx, r, crit)
		qf.Violations = append(qf.Violations, r.violation)
		if names.Len() > 0 {
			names.WriteString(", ")
		}
		names.WriteString(strconv.Quote(r.name))
	}
	ms := max((wait+time.Millisecond-1)/time.Millisecond, 1)
	_ = grpc.SetTrailer(ctx, metadata.Pairs(pushback.Key, strconv.FormatInt(int64(ms), 10)))
	st := status.New(codes.ResourceExhausted, "resilience: over the rate limit "+names.String()+
		" ("+crit.String()+"); retry after "+wait.String())
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}, qf); err == nil {
		st = d
	}
	return &srvShed{st.Err()}
}

// The metrics of the rate limits, through WithMeterProvider's meter, by
// resilience.ratelimit (the limit's name, from the document: bounded) and
// resilience.criticality. A distributed limit's leases and fallbacks are
// its store's to record (redisquota: resilience.server.ratelimit.leases,
// .fallbacks, ...).
const (
	// metricSrvRateAdmitted counts the calls a rate limit admitted.
	metricSrvRateAdmitted = "resilience.server.ratelimit.admitted"
	// metricSrvRateLimited counts the calls a rate limit refused (a call
	// several limits refused counts under each).
	metricSrvRateLimited = "resilience.server.ratelimit.limited"
)

var attrRateLimit = attribute.Key("resilience.ratelimit")

// srvRateMetrics are the rate limits' instruments; the zero value records
// nothing.
type srvRateMetrics struct {
	on                bool
	admitted, limited metric.Int64Counter
	// shed is the server's resilience.server.limit.shed, where a refused
	// call counts once, with resilience.reason "ratelimit", beside the
	// concurrency limit's sheds: one panel of the server's refusals.
	shed    metric.Int64Counter
	methods methodSets[[4][]metric.AddOption] // shed's attribute sets by full method, by criticality
}

// srvRateSets are one limit's attribute sets by criticality, built once.
type srvRateSets struct {
	admitted, limited [4][]metric.AddOption
}

func newSrvRateMetrics(mp metric.MeterProvider) (*srvRateMetrics, error) {
	if mp == nil {
		return &srvRateMetrics{}, nil
	}
	mk := instrumentMaker{meter: mp.Meter(telemetry.MeterName)}
	m := &srvRateMetrics{on: true,
		admitted: mk.counter(metricSrvRateAdmitted, "{call}", "Calls admitted by each rate limit of the server."),
		limited:  mk.counter(metricSrvRateLimited, "{call}", "Calls refused by each rate limit of the server, by criticality."),
		shed:     mk.counter(metricSrvLimitShed, "{call}", "Calls shed by the server's overload protection, by reason and criticality."),
	}
	m.methods.build = func(fullMethod string) *[4][]metric.AddOption {
		meth := telemetry.AttrMethod.String(strings.TrimPrefix(fullMethod, "/"))
		var sets [4][]metric.AddOption
		for c := range sets {
			sets[c] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(meth,
				attrCriticality.String(wire.Criticality(c).String()), telemetry.AttrReason.String(shedReasonRateLimit)))}
		}
		return &sets
	}
	return m, mk.err
}

func (m *srvRateMetrics) limitSets(name string) srvRateSets {
	var s srvRateSets
	if !m.on {
		return s
	}
	for c := range 4 {
		set := attribute.NewSet(attrRateLimit.String(name), attrCriticality.String(wire.Criticality(c).String()))
		s.admitted[c] = []metric.AddOption{metric.WithAttributeSet(set)}
		s.limited[c] = s.admitted[c]
	}
	return s
}

func (m *srvRateMetrics) admit(ctx context.Context, r *srvRate, c wire.Criticality) {
	if m.on {
		m.admitted.Add(ctx, 1, r.sets.admitted[c&3]...)
	}
}

// shedReasonRateLimit is the resilience.reason of a call the rate limits
// refused.
const shedReasonRateLimit = "ratelimit"

// refused records a call of fullMethod the rate limits refused.
func (m *srvRateMetrics) refused(ctx context.Context, fullMethod string, c wire.Criticality) {
	if m.on {
		m.shed.Add(ctx, 1, m.methods.get(fullMethod)[c&3]...)
	}
}

func (m *srvRateMetrics) limit(ctx context.Context, r *srvRate, c wire.Criticality) {
	if m.on {
		m.limited.Add(ctx, 1, r.sets.limited[c&3]...)
	}
}
