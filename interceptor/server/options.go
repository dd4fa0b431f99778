package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/internal/rpcname"
	quota "github.com/grpc-resilience/resilience/interceptor/ratelimit"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Option configures [New]. An Option is a value: it holds what it was
// given (copied when given), and New does the work, so one Option may
// build any number of Servers, which share nothing through it. Each option
// may be given to New once: New refuses a second of the same kind, naming
// it, rather than let one setting silently replace another (give every
// setting of WithIdempotency in one Idempotency, of WithLimits in one
// Limits).
type Option interface{ apply(*options) }

// options collects the options of New before validation.
type options struct {
	logger          *slog.Logger         // nil: slog.Default()
	meterProvider   metric.MeterProvider // nil: no metrics
	headroom, floor time.Duration
	idemCfg         *Idempotency                   // WithIdempotency's, copied; nil: idempotency off
	limitsCfg       *Limits                        // WithLimits's, copied; nil: no overload protection
	onRefusal       func(context.Context, Refusal) // nil: none (WithOnRefusal)
	given           [numOptionKinds]bool
	errs            []error // option errors found while applying, reported by New

	// Set by New from idemCfg and limitsCfg:
	idem         srvIdemOptions                  // store nil: idempotency off
	limit        *serviceconfig.ConcurrencyLimit // nil: the server has none
	cpu          *CPUShedding                    // nil: no CPU-aware shedding
	methodLimits []methodLimit
	streamLimits []string        // full methods and services whose streams are limited
	criticality  CriticalityFunc // nil: as sent, at most Critical
	limitSrc     rand.Source     // seeds the limits' probe jitter; nil: the runtime's (Limits.Rand)
	fairness     *srvFairness    // nil: one tenant (Limits.Config.TenantFairness)
	rates        []rateCfg       // the rate limits of Limits.Config, in document order
	rateTenant   TenantFunc      // names the tenants of the limits keyed by tenant; nil: none is
	quota        quota.Store     // Limits.Quota: the store of the distributed rate limits
}

// rateCfg is one rate limit of Limits.Config with where it applies.
type rateCfg struct {
	path  string // its place in Limits.Config, for errors: "rateLimits[0]", "methodConfig[1].rateLimits[0]"
	scope string // "" (the server), a service or a full method
	names []serviceconfig.Name
	limit serviceconfig.RateLimit
}

// optionKind names each kind of Option, for the refusal of a repeat.
type optionKind uint8

const (
	optLogger optionKind = iota
	optMeterProvider
	optHeadroom
	optIdempotency
	optLimits
	optOnRefusal
	numOptionKinds
)

var optionNames = [numOptionKinds]string{"WithLogger", "WithMeterProvider", "WithHeadroom", "WithIdempotency", "WithLimits", "WithOnRefusal"}

// option is an Option of one kind.
type option struct {
	kind optionKind
	f    func(*options)
}

func (op option) apply(o *options) {
	if o.given[op.kind] {
		o.errs = append(o.errs, errorf("%s given twice: give each option once", optionNames[op.kind]))
		return
	}
	o.given[op.kind] = true
	op.f(o)
}

// WithLogger sets the logger of the Server's warnings, such as a reply too
// large to store. By default they go to slog.Default(), as it is when each
// is logged; not to grpclog, whose default logger discards warnings.
func WithLogger(l *slog.Logger) Option {
	return option{optLogger, func(o *options) { o.logger = l }}
}

// WithMeterProvider records the Server's metrics with mp: under
// "resilience.server.idempotency.", handler executions, replays, waits of
// duplicates, conflicts, store errors (marked fail_open or fail_closed) and
// the store's latency; under "resilience.server.limit.", the overload
// protection's limits, calls in flight and queued, calls admitted and
// shed (by reason and criticality) and the time in queues. The package
// documentation has the full table. Attribute sets are built once per
// method. Without this option nothing is recorded, at no cost; a Server
// with neither idempotency nor limits has nothing to record.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return option{optMeterProvider, func(o *options) {
		if mp == nil {
			o.errs = append(o.errs, errorf("WithMeterProvider: nil provider"))
			return
		}
		o.meterProvider = mp
	}}
}

// WithHeadroom reserves headroom of every incoming deadline for the
// server's own work: a handler's context ends headroom before the caller's
// deadline, so the calls it makes downstream inherit a deadline that leaves
// the server time to answer. floor is the least time a handler gets: a call
// that arrives with less than headroom + floor left (or with no more than
// headroom, when floor is 0) is rejected at once with DEADLINE_EXCEEDED
// instead of being started. With WithHeadroom(20*time.Millisecond,
// 5*time.Millisecond), a call needs 25ms left to start, and its handler
// gets all but the last 20ms. Calls without a deadline are left alone.
// Negative durations are refused.
func WithHeadroom(headroom, floor time.Duration) Option {
	return option{optHeadroom, func(o *options) {
		if headroom < 0 || floor < 0 {
			o.errs = append(o.errs, errorf("WithHeadroom(%v, %v): must not be negative", headroom, floor))
			return
		}
		o.headroom, o.floor = headroom, floor
	}}
}

// Idempotency configures server-side idempotency ([WithIdempotency]): a
// unary call that carries idempotency-key metadata runs its handler once
// per record key (caller scope, full method, key); duplicates receive the
// stored outcome, byte for byte, without running the handler. See the
// package documentation, "Idempotency", for what is stored and replayed.
// Zero fields take the defaults their comments give; Store and Scope are
// required.
type Idempotency struct {
	// Store keeps the records: idempotency.NewMemoryStore (one process),
	// redisstore.Open (many replicas) or pgstore (a handler that joins the
	// record's transaction: pgstore.Store.Joined). Required: a nil store,
	// or a nil pointer of a store type (the *redisstore.Store of an Open
	// whose error was dropped), is refused.
	Store idempotency.Store

	// Scope names the caller, the first part of every record key:
	// typically the authenticated principal or tenant, [PeerScope] for
	// callers with verified client certificates (mTLS, SPIFFE), or
	// [SharedScope] to let every caller share one. Required. An error it
	// returns is returned to the caller as is (a status error keeps its
	// code; grpc makes any other error UNKNOWN), and the handler does not
	// run. All callers of one scope share records: a caller who learns or
	// guesses another's key, for the same method and request, receives
	// that caller's reply and the metadata replayed with it.
	Scope func(ctx context.Context) (string, error)

	// KeyPolicies sets the key policy of the methods a name selects: a full
	// method "/pkg.Service/Method", a service "pkg.Service" (all its unary
	// methods), or "" (every unary method). The most specific wins; nil:
	// every method is KeyOptional.
	//
	// Idempotency keys apply to unary methods only, so a policy other than
	// KeyIgnored must not name a streaming method: a stream has no single
	// request to fingerprint before the handler runs and no single outcome
	// to store and replay, and running it anyway would let a keyless stream
	// through a Required method. Such a policy is refused: by New, when the
	// protobuf registry (protoregistry.GlobalFiles) describes the method as
	// streaming; otherwise by the stream interceptor, which fails every
	// call of the method with FAILED_PRECONDITION naming the policy.
	// A KeyRequired policy of a service or of "" leaves the service's
	// streams to run plainly, with a key or without one: New logs the
	// streams it leaves out (those the registry describes and no other
	// policy names). Health checks and reflection run plainly, key or not,
	// unless a policy names their method or service.
	//
	// New checks each name against the services the program's generated
	// code registers (protoregistry.GlobalFiles): a method its service does
	// not have ("/pkg.Orders/Pya"), a method's name given as a service
	// ("Pay"), or a name that is not a service is refused, naming the
	// policy; a service nothing registers (one served with a hand-written
	// grpc.ServiceDesc, or misspelt) is logged once (WithLogger).
	KeyPolicies map[string]KeyPolicy

	// TTL is how long a completed outcome is kept and replayed; 0 means
	// 24h, and it must otherwise be at least 1ms. A store with bounded
	// memory may evict records sooner: the memory store never before its
	// minimum retention (idempotency.WithMinRetention), and it refuses new
	// claims with RESOURCE_EXHAUSTED rather than evict a younger record.
	TTL time.Duration

	// Lease is how long a running first call holds its key without a
	// renewal; 0 means 30s, and it must otherwise be at least 1ms. The key
	// is claimed for the lease, whatever the caller's deadline, and renewed
	// every Lease/3 while the handler runs. If its server crashes, the key
	// is free one lease after the last renewal: a duplicate on another
	// replica is blocked at most one lease after the owner died. A shorter
	// lease frees a crashed owner's keys sooner, at the cost of more
	// renewals; it must outlast the store's unavailability (a detached
	// handler's context is cancelled, and logged, once nine tenths of its
	// lease have passed without a renewal, before a duplicate can run it).
	Lease time.Duration

	// NoWait makes a duplicate that arrives while the first call runs fail
	// at once with ABORTED and a grpc-retry-pushback-ms trailer, instead of
	// waiting for the first call's outcome (the default, bounded by the
	// duplicate's own deadline).
	NoWait bool

	// Pushback is the retry hint of the calls the server asks to retry: the
	// grpc-retry-pushback-ms trailer of ABORTED under NoWait, and both that
	// trailer and a google.rpc.RetryInfo detail of UNAVAILABLE when the
	// store fails and the server fails closed. 0 means 100ms, and it must
	// otherwise be at least 1ms (the trailer counts whole milliseconds).
	Pushback time.Duration

	// PollInitial and PollMax are the backoff of a duplicate polling the
	// store while the first call runs in another process: PollInitial,
	// then doubling up to PollMax, and never past the remaining lease.
	// In-process duplicates do not poll. 0 means 10ms and 500ms; neither
	// may be negative, and PollMax (given or default) must not be less than
	// PollInitial.
	PollInitial, PollMax time.Duration

	// UnstoredCodes are the status codes whose outcomes are not stored: the
	// claim is released and a retry runs the handler again. Every other
	// outcome, success or error, is stored and replayed; a panic never is.
	// Zero means DefaultUnstoredCodes; to store every outcome, give a set
	// that holds only codes.OK (OK itself is always stored).
	UnstoredCodes rescodes.Set

	// OmitMetadata names response header and trailer keys that are never
	// stored, so never replayed: metadata meant for one response only, such
	// as cookies, per-attempt debug or timing headers. Keys are
	// case-insensitive; each must be a valid metadata key (lower-case
	// letters, digits, '-', '_', '.').
	OmitMetadata []string

	// FailOpen runs the handler plainly when the store fails (without
	// deduplication), instead of failing the call with UNAVAILABLE
	// (ErrIdempotencyStoreUnavailable), the default.
	FailOpen bool

	// DetachedMax bounds a keyed call's handler, which by default runs
	// detached from its caller: once it starts, the call belongs to the
	// server. The call that owns the key runs its handler on a context
	// that the caller's cancellation and deadline do not reach, bounded
	// instead by DetachedMax from the handler's start and by the key's
	// lease; values of the context (metadata, peer, auth) are kept. So a
	// handler that commits its side effect (a card charged) and only then
	// would have seen its caller's deadline finishes, its outcome is
	// stored, and the caller's retry replays it: one charge. The cost: the
	// server keeps working, up to DetachedMax, for a caller that has gone,
	// and the caller's deadline no longer bounds the handler's downstream
	// calls. A handler that needs longer gets DEADLINE_EXCEEDED, which is
	// not stored. 0 means 30s, and it must otherwise be at least 1ms
	// (AttachedHandler, not 0, puts the handler on the caller's context).
	DetachedMax time.Duration

	// AttachedHandler runs keyed handlers on the caller's context instead:
	// a caller that gives up cancels the handler, and a handler that then
	// returns CANCELLED or DEADLINE_EXCEEDED has its claim released, not
	// stored, so the caller's retry runs it again. That is right only for
	// handlers whose work is undone with their context (a transaction
	// rolled back); one that committed first runs twice.
	AttachedHandler bool
}

// Validate reports the first field of c that is wrong, naming it.
func (c *Idempotency) Validate() error {
	_, err := c.normalize()
	return err
}

// normalize returns c with its defaults applied, or the first error.
func (c *Idempotency) normalize() (srvIdemOptions, error) {
	o := srvIdemOptions{store: c.Store, scope: c.Scope, ttl: c.TTL, lease: c.Lease, pushback: c.Pushback,
		pollInitial: c.PollInitial, pollMax: c.PollMax, noWait: c.NoWait, failOpen: c.FailOpen,
		retryable: c.UnstoredCodes &^ rescodes.Of(codes.OK), detachMax: c.DetachedMax}
	if c.Store == nil || srvNilPointer(c.Store) {
		arg := "nil"
		if c.Store != nil {
			arg = fmt.Sprintf("a nil %T", c.Store)
		}
		return o, fmt.Errorf("server: Idempotency.Store is %s: the store must not be nil; "+
			"a nil store would turn idempotency off or fail every keyed call (was an error of redisstore.Open dropped?)", arg)
	}
	if c.Scope == nil {
		return o, errors.New("server: Idempotency.Scope is nil: it names the callers, so that one caller " +
			"never receives another's reply: a function of the authenticated principal or tenant, " +
			"server.PeerScope for callers with verified client certificates, " +
			"or server.SharedScope to let every caller share records (keys must then be unguessable)")
	}
	defaults := []struct {
		field string
		v     *time.Duration
		def   time.Duration
		min   time.Duration
	}{
		{"TTL", &o.ttl, defaultTTL, time.Millisecond},
		{"Lease", &o.lease, defaultLease, time.Millisecond},
		{"Pushback", &o.pushback, defaultPushback, time.Millisecond},
		{"PollInitial", &o.pollInitial, defaultPollInitial, time.Nanosecond},
		{"PollMax", &o.pollMax, defaultPollMax, time.Nanosecond},
		{"DetachedMax", &o.detachMax, defaultDetachedMax, time.Millisecond},
	}
	for _, d := range defaults {
		switch {
		case *d.v == 0:
			*d.v = d.def
		case *d.v < d.min:
			return o, fmt.Errorf("server: Idempotency.%s is %v: must be 0 (the default, %v) or at least %v", d.field, *d.v, d.def, d.min)
		}
	}
	if o.pollMax < o.pollInitial {
		return o, fmt.Errorf("server: Idempotency.PollMax is %v, less than PollInitial %v", o.pollMax, o.pollInitial)
	}
	if c.AttachedHandler {
		o.detachMax = 0
	}
	if c.UnstoredCodes == 0 {
		o.retryable = DefaultUnstoredCodes
	}
	for _, k := range c.OmitMetadata {
		lk := strings.ToLower(k)
		if !srvValidMDKey(lk) {
			return o, fmt.Errorf("server: Idempotency.OmitMetadata: %q is not a valid metadata key", k)
		}
		if o.omit == nil {
			o.omit = make(map[string]struct{})
		}
		o.omit[lk] = struct{}{}
	}
	for _, name := range slices.Sorted(maps.Keys(c.KeyPolicies)) { // in order: the same first error every time
		p := c.KeyPolicies[name]
		if err := srvCheckPolicyName(name); err != nil {
			return o, fmt.Errorf("server: Idempotency.KeyPolicies[%q]: %w", name, err)
		}
		if p > KeyIgnored {
			return o, fmt.Errorf("server: Idempotency.KeyPolicies[%q]: unknown policy %d", name, p)
		}
		if o.policies == nil {
			o.policies = make(map[string]KeyPolicy, len(c.KeyPolicies))
		}
		o.policies[name] = p
	}
	var err error
	o.streamWarns = srvStreamsUncovered(o.policies)
	if o.warnings, err = srvCheckPolicies(o.policies); err != nil {
		return o, err
	}
	return o, nil
}

// WithIdempotency turns on server-side idempotency as c says (see
// [Idempotency]). New returns c's Validate error, if any. c is taken as it
// is now (KeyPolicies and OmitMetadata are copied).
func WithIdempotency(c Idempotency) Option {
	c.KeyPolicies, c.OmitMetadata = maps.Clone(c.KeyPolicies), slices.Clone(c.OmitMetadata)
	return option{optIdempotency, func(o *options) { o.idemCfg = &c }}
}

// Limits configures the Server's overload protection ([WithLimits]): the
// adaptive concurrency limits of a server document, or CPU-aware shedding,
// by criticality and, optionally, fairly among tenants. See the package
// documentation, "Overload protection". Zero fields are off or take the
// defaults their comments give.
type Limits struct {
	// Config is the server document (serviceconfig.ParseServer reads its
	// JSON form; Go code fills the same struct): its top-level
	// concurrencyLimit puts every unary call under one adaptive limit; each
	// name of each methodConfig entry gets a limit of its own (a full
	// method's entry wins over its service's); its tenantFairness shares
	// each limit fairly among tenants (see Tenant). Its rateLimits, at the
	// top level and in entries, add up: a call must pass each that applies
	// to it, before the concurrency limit (see the package documentation,
	// "Rate limits"); a distributed one needs Quota, one keyed by tenant
	// needs Tenant or tenantFairness, one keyed by idempotencyScope needs
	// WithIdempotency.
	//
	// A call that arrives while the calls in flight fill its criticality's
	// share of its limit waits in the limit's queue when it has one
	// (MaxQueue, at most MaxQueueWait) and is otherwise rejected at once
	// with RESOURCE_EXHAUSTED, carrying a google.rpc.RetryInfo detail and
	// the grpc-retry-pushback-ms trailer that say when to come back; a call
	// whose remaining deadline is shorter than the door's service time (the
	// least latency of its method's last 32 to 64 calls, while one of them
	// is recent; one such call per service time is let through, to see
	// whether the service has become fast again) is rejected with
	// DEADLINE_EXCEEDED before its handler runs. Only a call the handler
	// answered OK is a latency sample, of its method's cost: each method
	// under a limit has its own base RTT, so a cheap method does not make
	// a costly one look queued. Health
	// checks and reflection are never limited unless a methodConfig entry
	// names them: a probe shed under overload would have the orchestrator
	// restart a server that is only busy.
	Config serviceconfig.ServerConfig

	// Streams names full methods ("/pkg.Service/Method") and services
	// ("pkg.Service") whose streams are under the limit that applies to the
	// method: a stream takes a slot when it opens, at its criticality's
	// share, waits in the limit's queue or is shed as a unary call would
	// be, and holds the slot for its whole life. A stream gives the limit
	// no latency sample and is never rejected at the door for its deadline.
	// Streams are not limited by default: a long stream holds its slot for
	// as long as it lives, so a few of them under a limit learned from
	// unary latencies can starve that limit's unary calls. Prefer a limit
	// of the streaming methods' own. Each name here must be covered by a
	// limit of Config: the server's, its own entry, its service's (for a
	// method) or one of its methods' (for a service); one that is not is
	// refused.
	Streams []string

	// CPU, when set, sheds the unary calls of methods without a limit of
	// their own when the CPU is hot (see CPUShedding). It is an
	// alternative to Config's top-level limit: both at once are refused.
	CPU *CPUShedding

	// Criticality decides the criticality a call is shed by; nil: as the
	// call sent it, but at most CRITICAL (CapCriticality(wire.Critical)).
	//
	// The threat: the criticality (metadata wire.CriticalityKey) is set by
	// the caller, so a caller
	// trusted with CRITICAL_PLUS can send it with every call and be shed
	// last, taking the share of the limit kept for the truly critical calls.
	// So by default anyone may lower their own criticality, no one may
	// raise it. To let callers you trust claim CRITICAL_PLUS, decide by who
	// they are; CapCriticality(wire.CriticalPlus) trusts every caller.
	Criticality CriticalityFunc

	// Tenant names the tenant of a call, for Config.TenantFairness and the
	// rate limits keyed by tenant; nil:
	// TenantFromMetadata(Config.TenantFairness.MetadataKey). Without
	// either, a Tenant is refused: it would never be called; a rate limit
	// keyed by tenant with neither a Tenant nor a TenantFairness block is
	// refused too (every call would be one tenant).
	Tenant TenantFunc

	// Quota shares the distributed rate limits of Config (those with
	// distributed: true) among the server's replicas:
	// redisquota.New(client) for Redis or Redis Cluster. New asks it for
	// one Limiter per distributed limit. Required when Config has a
	// distributed limit, refused when it has none (it would do nothing).
	// The Server does not close it: close it after the grpc.Server stops.
	// A redisquota.Store serves each limit name once: a Server built to
	// replace another takes a new Store.
	Quota quota.Store

	// Rand, when set, seeds the jitter of the limits' probes, so that a
	// seeded source gives a repeatable run; nil: the runtime's. New draws
	// from it once, to seed a generator of the Server's own, so Servers
	// built from one Limits share no state through it.
	Rand rand.Source
}

// Validate reports the first field of l that is wrong, naming it.
func (l *Limits) Validate() error {
	var o options
	l.apply(&o)
	if len(o.errs) > 0 {
		return o.errs[0]
	}
	return nil
}

// apply sets the limit fields of o, a fresh options (WithLimits,
// Validate), from l, or appends an error.
func (l *Limits) apply(o *options) {
	if l.Rand != nil && srvNilPointer(l.Rand) { // New would panic drawing from it
		o.errs = append(o.errs, errorf("Limits.Rand is a nil %T: give a source, or nil for the runtime's", l.Rand))
		return
	}
	cfg, checked := &l.Config, l.Config
	tenantRates := rateKeysBy(cfg, serviceconfig.KeyTenant)
	if l.Tenant != nil && cfg.TenantFairness == nil && !tenantRates {
		o.errs = append(o.errs, errorf("Limits.Tenant is set but Limits.Config.TenantFairness is nil: without it every call is one "+
			"tenant and Tenant is never called; add a TenantFairness block (its metadataKey may be empty when Tenant names the tenants), "+
			"or a rate limit keyed by tenant"))
		return
	}
	if f := cfg.TenantFairness; f != nil && f.MetadataKey == "" {
		if l.Tenant == nil {
			o.errs = append(o.errs, errorf("Limits: Config.TenantFairness has no metadataKey and Limits.Tenant is nil"))
			return
		}
		// Limits.Tenant names the tenants, so the block needs no metadataKey
		// here (the document's JSON, which has no Tenant, does).
		k := *f
		k.MetadataKey = "tenant"
		checked.TenantFairness = &k
	}
	if err := checked.Validate(); err != nil {
		o.errs = append(o.errs, fmt.Errorf("server: Limits.Config: %v", err))
		return
	}
	if err := l.applyRates(o); err != nil {
		o.errs = append(o.errs, err)
		return
	}
	if cl := cfg.ConcurrencyLimit; cl != nil {
		c := *cl
		o.limit = &c
	}
	for _, mc := range cfg.MethodConfig {
		if mc.ConcurrencyLimit == nil { // an entry of rate limits only
			continue
		}
		for _, n := range mc.Name {
			o.methodLimits = append(o.methodLimits, methodLimit{nameKey(n), n, *mc.ConcurrencyLimit})
		}
	}
	if f := cfg.TenantFairness; f != nil {
		tenant := l.Tenant
		if tenant == nil {
			tenant = TenantFromMetadata(f.MetadataKey)
		}
		o.fairness = &srvFairness{cfg: *f, tenant: tenant}
	}
	for i, name := range l.Streams {
		n, err := rpcname.Parse(name)
		if err != nil {
			o.errs = append(o.errs, errorf("Limits.Streams[%d]: %v", i, err))
			return
		}
		o.streamLimits = append(o.streamLimits, nameKey(n))
	}
	if l.CPU != nil {
		c := *l.CPU
		if err := c.Validate(); err != nil {
			o.errs = append(o.errs, errorf("Limits.CPU: %v", err))
			return
		}
		o.cpu = &c
	}
	limited := o.limit != nil || len(o.methodLimits) > 0
	if o.limit == nil {
		for i, n := range o.streamLimits {
			if !o.coversStreams(n) {
				o.errs = append(o.errs, errorf("Limits.Streams[%d] %q: no concurrency limit covers it: Limits.Config has no "+
					"server-wide concurrencyLimit and no methodConfig entry for it or its service, so its streams would not be limited", i, n))
				return
			}
		}
	}
	switch {
	case o.fairness != nil && !limited && !tenantRates:
		o.errs = append(o.errs, errorf("Limits.Config.TenantFairness: no concurrency limit in Limits.Config to share, and no rate limit keyed by tenant"))
		return
	case o.limit != nil && o.cpu != nil:
		o.errs = append(o.errs, errorf("Limits: Config.ConcurrencyLimit and CPU: choose one for the server"))
		return
	}
	o.criticality, o.limitSrc = l.Criticality, l.Rand
}

// coversStreams reports whether a methodConfig entry of o covers the
// streams of name, a full method or a service of Limits.Streams: the
// method's own entry or its service's; for a service, its own entry or one
// of its methods'.
func (o *options) coversStreams(name string) bool {
	for _, m := range o.methodLimits {
		switch {
		case m.raw == name:
			return true
		case strings.HasPrefix(name, "/"): // a full method: its service's entry covers it
			if svc, ok := serviceOf(name); ok && m.raw == svc {
				return true
			}
		default: // a service: an entry of one of its methods covers some of its streams
			if svc, ok := serviceOf(m.raw); ok && strings.HasPrefix(m.raw, "/") && svc == name {
				return true
			}
		}
	}
	return false
}

// WithLimits puts the Server's calls under the overload protection l
// describes (see [Limits]). New returns l's Validate error, if any. l is
// taken as it is now: what its pointers and slices point to may change
// afterwards without reaching the Server.
func WithLimits(l Limits) Option {
	l = l.clone()
	return option{optLimits, func(o *options) { o.limitsCfg = &l }}
}

// clone returns l with its own copies of what its pointers and slices
// point to (the functions and the Rand source are shared, as given).
func (l Limits) clone() Limits {
	c := &l.Config
	if c.ConcurrencyLimit != nil {
		cl := *c.ConcurrencyLimit
		c.ConcurrencyLimit = &cl
	}
	if c.TenantFairness != nil {
		f := *c.TenantFairness
		c.TenantFairness = &f
	}
	c.RateLimits = slices.Clone(c.RateLimits)
	mcs := make([]serviceconfig.ServerMethodConfig, len(c.MethodConfig))
	for i, mc := range c.MethodConfig {
		mc.Name, mc.RateLimits = slices.Clone(mc.Name), slices.Clone(mc.RateLimits)
		if mc.ConcurrencyLimit != nil {
			cl := *mc.ConcurrencyLimit
			mc.ConcurrencyLimit = &cl
		}
		mcs[i] = mc
	}
	c.MethodConfig = mcs
	l.Streams = slices.Clone(l.Streams)
	if l.CPU != nil {
		cpu := *l.CPU
		l.CPU = &cpu
	}
	return l
}

// srvRandMu serializes the draws from the Limits.Rand sources that seed
// each Server's own generator (newSrvRand): a source may be shared by
// Servers built at once.
var srvRandMu sync.Mutex

// newSrvRand returns the probe jitter of one Server's limits: its own
// generator, seeded from src (so that a seeded source gives a repeatable
// run, and two Servers built from one Limits share no state), serialized
// among the Server's limiters; nil when src is nil (the runtime's).
func newSrvRand(src rand.Source) func() float64 {
	if src == nil {
		return nil
	}
	srvRandMu.Lock()
	seed := rand.New(src)
	r := rand.New(rand.NewPCG(seed.Uint64(), seed.Uint64()))
	srvRandMu.Unlock()
	var mu sync.Mutex
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
	}
}
