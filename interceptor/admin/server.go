package admin

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
)

// ServerSource is one Server in a View (View.Server). Its hook
// (server.WithOnRefusal) feeds the view's events with the calls the
// Server's parts refused, one event per episode of refusals: the limit
// that shed a call with its criticality and tenant, the CPU shedder, the
// headroom, the idempotency store down or full, or failing open, a rate
// limit with the key it refused. It runs
// only on the refusal path: an admitted call never reaches it. Its
// snapshot is read from the attached Server when the view is asked.
type ServerSource struct {
	v    *View
	name string
	s    atomic.Pointer[server.Server]

	mu        sync.Mutex // guards what follows
	storeDesc string
	storeSet  bool      // the Server has a store (DescribeStore, or a store event)
	storeErrs uint64    // store failures heard of
	storeErr  error     // the latest's error
	storeAt   time.Time // when
}

// Name returns the name the source was registered under.
func (s *ServerSource) Name() string { return s.name }

// Options returns the Server options that install the source's hook:
// server.WithOnRefusal. A later WithOnRefusal replaces it; to keep one of
// your own, call the source's OnRefusal from it.
func (s *ServerSource) Options() []server.Option {
	return []server.Option{server.WithOnRefusal(s.OnRefusal)}
}

// Attach makes srv the Server whose limits the view shows under the
// source's name.
func (s *ServerSource) Attach(srv *server.Server) { s.s.Store(srv) }

// DescribeStore says what the Server's idempotency store is (its kind,
// its address, the checks its Open made), for the view's store section;
// it also tells the view that the Server has a store, so that its health
// shows before any failure.
func (s *ServerSource) DescribeStore(desc string) {
	s.mu.Lock()
	s.storeDesc, s.storeSet = cut(desc), true
	s.mu.Unlock()
}

// Close removes the source from its View, as ClientSource.Close does.
func (s *ServerSource) Close() {
	s.v.mu.Lock()
	if s.v.servers[s.name] == s {
		delete(s.v.servers, s.name)
	}
	s.v.mu.Unlock()
	s.s.Store(nil)
}

// OnRefusal is the hook of server.WithOnRefusal: the refusal is recorded
// as an event, one per episode (the same part, reason, method,
// criticality and tenant within a second of the last). Call it from your
// own hook to keep both.
func (s *ServerSource) OnRefusal(_ context.Context, r server.Refusal) {
	now := s.v.opts.now()
	if r.Reason == server.RefusalStoreUnavailable || r.Reason == server.RefusalStoreFailedOpen || r.Reason == server.RefusalStoreFull {
		s.storeFailed(r, now)
	}
	key, kind, ep := s.refusalKey(r)
	if s.v.events.bump(key, kind, ep, now) {
		return // the episode under way counts it: nothing built
	}
	ev := &event{key: key, kind: kind, reason: ep.reason, method: r.FullMethod, code: rescodes.Name(status.Code(r.Err))}
	switch r.Reason {
	case server.RefusalLimit, server.RefusalQueueTimeout, server.RefusalDeadline:
		ev.crit, ev.tenant, ev.tenants, ev.over = ep.crit, r.Tenant, int64(r.Tenants), r.OverShare
		ev.cause = limitCause(r)
	case server.RefusalCPU:
		ev.crit = ep.crit
		ev.cause = "the CPU is hot: shed " + r.Criticality.String() + " call of " + r.FullMethod
	case server.RefusalHeadroom:
		ev.cause = "too little of the caller's deadline left to start: " + describeErr(r.Err)
	case server.RefusalStoreUnavailable, server.RefusalStoreFull, server.RefusalStoreFailedOpen:
		ev.cause = storeCause(r)
		if r.Reason == server.RefusalStoreFailedOpen {
			ev.code = ""
		}
	case server.RefusalShuttingDown:
		ev.cause = "the server is shutting down (Server.Shutdown): refused a call of " + r.FullMethod
	case server.RefusalRateLimit:
		ev.crit, ev.tenant, ev.rkey = ep.crit, r.Tenant, r.Key
		ev.cause = rateLimitCause(r)
	default:
		ev.cause = r.Reason.String() + ": refused: " + describeErr(r.Err)
	}
	s.v.events.refuse(ev, now)
}

// refusalKey returns the part, the kind of event and the episode of a
// refusal, without allocating.
func (s *ServerSource) refusalKey(r server.Refusal) (partKey, adminv1.EventKind, episode) {
	kind := adminv1.EventKind_EVENT_KIND_REFUSED
	ep := episode{reason: r.Reason.String(), method: r.FullMethod}
	var k partKey
	switch r.Reason {
	case server.RefusalLimit, server.RefusalQueueTimeout, server.RefusalDeadline:
		k = s.key(adminv1.Part_PART_LIMIT, limitName(r.Limit))
		ep.crit, ep.over = r.Criticality.String(), r.OverShare
		if r.OverShare {
			ep.tenant = r.Tenant
		}
	case server.RefusalCPU:
		k = s.key(adminv1.Part_PART_CPU, server.CPUSheddingName)
		ep.crit = r.Criticality.String()
	case server.RefusalHeadroom:
		k = s.key(adminv1.Part_PART_HEADROOM, r.FullMethod)
	case server.RefusalStoreUnavailable, server.RefusalStoreFull, server.RefusalStoreFailedOpen:
		k = s.key(adminv1.Part_PART_IDEMPOTENCY_STORE, "idempotency store")
		if r.Reason == server.RefusalStoreFailedOpen {
			kind = adminv1.EventKind_EVENT_KIND_STORE_FAILED
		}
	case server.RefusalShuttingDown:
		k = s.key(adminv1.Part_PART_SHUTDOWN, r.FullMethod)
	case server.RefusalRateLimit:
		k = s.key(adminv1.Part_PART_RATE_LIMIT, r.Limit)
		ep.crit, ep.rkey = r.Criticality.String(), r.Key
	default:
		// A reason this view does not know yet.
		k = s.key(adminv1.Part_PART_UNSPECIFIED, r.FullMethod)
	}
	return k, kind, ep
}

func (s *ServerSource) key(part adminv1.Part, subject string) partKey {
	return partKey{side: sideServer, source: s.name, part: part, subject: subject}
}

// maxTenantsShown is how many of a limit's busiest tenants the view
// shows.
const maxTenantsShown = 8

// limitName is how the view names a limit: LimitStatus.Name, "(server)"
// for the server's own.
func limitName(name string) string {
	if name == "" {
		return "(server)"
	}
	return name
}

// limitCause says why a limit shed a call.
func limitCause(r server.Refusal) string {
	var what string
	switch r.Reason {
	case server.RefusalLimit:
		what = "over the concurrency limit, no room in its queue"
	case server.RefusalQueueTimeout:
		what = "waited in the limit's queue and got no slot"
	case server.RefusalDeadline:
		what = "its deadline had less left than the service time"
	}
	cause := fmt.Sprintf("shed %s call of %s: %s", r.Criticality, r.FullMethod, what)
	switch {
	case r.Tenant != "" && r.OverShare:
		cause += fmt.Sprintf("; tenant %q was over its fair share (%d tenants share the limit)", r.Tenant, r.Tenants)
	case r.Tenant != "":
		cause += fmt.Sprintf("; tenant %q, within its fair share (%d tenants share the limit)", r.Tenant, r.Tenants)
	}
	return cause
}

// rateLimitCause says which rate limits refused a call, for which key,
// and how long the caller was told to wait.
func rateLimitCause(r server.Refusal) string {
	var b strings.Builder
	b.WriteString("over the rate limit ")
	for i, n := range r.RateLimits {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(n))
	}
	switch {
	case r.Tenant != "" && r.Tenant == r.Key:
		fmt.Fprintf(&b, " for tenant %q", cut(r.Tenant))
	case r.Key != "":
		fmt.Fprintf(&b, " for key %q", cut(r.Key))
	}
	fmt.Fprintf(&b, ": refused %s call of %s; told to retry after %v", r.Criticality, r.FullMethod, r.Wait)
	return b.String()
}

// storeCause says what the store did.
func storeCause(r server.Refusal) string {
	switch r.Reason {
	case server.RefusalStoreUnavailable:
		return "idempotency store down, failing closed: refused a keyed call of " + r.FullMethod + ": " + strconv.Quote(cut(errText(r.Err)))
	case server.RefusalStoreFull:
		return "idempotency store full for the caller's scope: refused a keyed call of " + r.FullMethod
	}
	return "idempotency store down, failing open: ran a keyed call of " + r.FullMethod + " without idempotency: " + strconv.Quote(cut(errText(r.Err)))
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	return err.Error()
}

// storeFailed notes a store failure at now for the store's health.
// A full store is not a failure of it: it only says the Server has one.
func (s *ServerSource) storeFailed(r server.Refusal, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.storeSet = true
	if r.Reason != server.RefusalStoreFull {
		s.storeErrs++
		s.storeErr, s.storeAt = r.Err, now // its text is read when shown
	}
}

// recentWindow is how long a refusal, or a store failure, counts as
// "now" for the view's list of parts refusing and the store's health.
const recentWindow = time.Minute

func (s *ServerSource) snapshot(now time.Time) *adminv1.Server {
	out := &adminv1.Server{Name: s.name}
	if srv := s.s.Load(); srv != nil {
		for _, l := range srv.LimitStatuses() {
			pl := &adminv1.Limit{Name: limitName(l.Name), Limit: int64(l.Limit), InFlight: int64(l.InFlight), Queued: int64(l.Queued),
				BaseRtt: durationpb.New(l.BaseRTT), SmoothedRtt: durationpb.New(l.SmoothedRTT), Tenants: int64(l.Tenants)}
			if l.Tenants > 0 && l.Name != server.CPUSheddingName {
				for _, ts := range srv.TenantStatuses(l.Name, maxTenantsShown) {
					pl.BusiestTenants = append(pl.BusiestTenants, &adminv1.TenantLoad{Tenant: cut(ts.Tenant),
						InFlight: int64(ts.InFlight), Queued: int64(ts.Queued), Held: ts.Held})
				}
			}
			for c := range l.Admitted {
				crit := wire.Criticality(c)
				pl.ByCriticality = append(pl.ByCriticality, &adminv1.CriticalityCounts{Criticality: crit.String(),
					Admitted: l.Admitted[c], ShedLimit: l.ShedLimit[c], ShedDeadline: l.ShedDeadline[c]})
			}
			out.Limits = append(out.Limits, pl)
		}
		for _, rl := range srv.RateLimitStatuses() {
			out.RateLimits = append(out.RateLimits, &adminv1.RateLimit{Name: rl.Name, Path: rl.Path, Key: string(rl.Key), Rate: rl.Rate,
				Per: durationpb.New(rl.Per), Burst: int64(rl.Burst), Distributed: rl.Distributed, Keys: int64(rl.Keys), Overflowed: rl.Overflowed})
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.storeSet {
		out.Store = &adminv1.Store{Healthy: s.storeAt.IsZero() || now.Sub(s.storeAt) >= recentWindow, Failures: s.storeErrs,
			LastFailure: cut(errText(s.storeErr)), Description: s.storeDesc}
		if !s.storeAt.IsZero() {
			out.Store.LastFailureTime = ts(s.storeAt)
		}
	}
	return out
}

var errNoClient = errors.New("no Client of that name is registered")
