package interceptor

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// Defaults of the server-side idempotency options.
const (
	// DefaultIdempotencyTTL is how long a completed record is kept.
	DefaultIdempotencyTTL = 24 * time.Hour
	// DefaultIdempotencyLease bounds how long a crashed owner holds a key.
	DefaultIdempotencyLease = 30 * time.Second
	// DefaultIdempotencyPushback is the grpc-retry-pushback-ms sent with
	// ABORTED when waiting is off.
	DefaultIdempotencyPushback = 100 * time.Millisecond
	// DefaultIdempotencyPollInitial and DefaultIdempotencyPollMax bound the
	// backoff of a duplicate polling the store for an owner in another
	// process: 10 ms, doubling, at most 500 ms, and never past the owner's
	// lease.
	DefaultIdempotencyPollInitial = 10 * time.Millisecond
	DefaultIdempotencyPollMax     = 500 * time.Millisecond
	// DefaultIdempotencyDetachedMax bounds a keyed call's handler, which
	// runs detached from its caller's deadline and cancellation (see
	// WithIdempotencyDetachedHandler).
	DefaultIdempotencyDetachedMax = 30 * time.Second
)

// IdempotencyKeyPolicy says what a method does with the idempotency-key
// metadata. The zero value is IdempotencyKeyOptional.
type IdempotencyKeyPolicy uint8

const (
	// IdempotencyKeyOptional uses the key when the call carries one and runs
	// the handler plainly when it does not. The default.
	IdempotencyKeyOptional IdempotencyKeyPolicy = iota
	// IdempotencyKeyRequired rejects calls without a key with
	// INVALID_ARGUMENT.
	IdempotencyKeyRequired
	// IdempotencyKeyIgnored runs every call plainly, key or not: for methods
	// without side effects, where storing replies only costs.
	IdempotencyKeyIgnored
)

// Errors of server-side idempotency. The interceptor returns errors that
// wrap them (errors.Is) and carry the gRPC status given here (status.Code).
var (
	// ErrIdempotencyKeyInvalid: the idempotency-key is malformed, or missing
	// for a method that requires one. INVALID_ARGUMENT.
	ErrIdempotencyKeyInvalid = errors.New("idempotency: invalid idempotency-key")
	// ErrIdempotencyKeyReused: the key was used for a different request of
	// the same method and scope. FAILED_PRECONDITION.
	ErrIdempotencyKeyReused = errors.New("idempotency: idempotency-key reused with a different request")
	// ErrIdempotencyInProgress: the first call with this key is still running
	// and waiting is off. ABORTED, with grpc-retry-pushback-ms.
	ErrIdempotencyInProgress = errors.New("idempotency: a call with this idempotency-key is in progress")
	// ErrIdempotencyStoreUnavailable: the store failed and the server fails
	// closed. UNAVAILABLE.
	ErrIdempotencyStoreUnavailable = errors.New("idempotency: store unavailable")
)

// srvRejection is an error of the idempotency interceptor: a gRPC status
// that wraps a sentinel.
type srvRejection struct {
	code     codes.Code
	msg      string
	sentinel error
	st       *status.Status // when set, the status, with details; else code and msg
}

func (e *srvRejection) Error() string { return e.msg }
func (e *srvRejection) Unwrap() error { return e.sentinel }
func (e *srvRejection) GRPCStatus() *status.Status {
	if e.st != nil {
		return e.st
	}
	return status.New(e.code, e.msg)
}

// srvStoreFull is the answer to a claim the store refused for room:
// RESOURCE_EXHAUSTED with a google.rpc.RetryInfo of the store's hint. It
// wraps the store's error, so errors.Is matches idempotency.ErrStoreFull
// and, for a scope's quota, idempotency.ErrScopeFull.
func srvStoreFull(full *idempotency.FullError) error {
	msg := "idempotency: no room to record this call; retry later"
	if full.Scope {
		msg = "idempotency: the caller's quota of recorded calls is full; retry later"
	}
	st := status.New(codes.ResourceExhausted, msg)
	if full.RetryAfter > 0 {
		if withHint, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(full.RetryAfter)}); err == nil {
			st = withHint
		}
	}
	return &srvRejection{code: codes.ResourceExhausted, msg: msg, sentinel: full, st: st}
}

// srvIdemOptions are the idempotency options before validation.
type srvIdemOptions struct {
	store       idempotency.Store
	scope       func(context.Context) (string, error)
	ttl, lease  time.Duration
	pushback    time.Duration
	pollInitial time.Duration
	pollMax     time.Duration
	noWait      bool
	failOpen    bool
	retryable   rescodes.Set
	policies    map[string]IdempotencyKeyPolicy // by "", service or full method
	omit        map[string]struct{}             // metadata keys never stored, lower case
	detachMax   time.Duration                   // > 0: owned handlers run detached, at most this long; 0: on the caller's context
	errs        []error
}

func srvIdemDefaults() srvIdemOptions {
	return srvIdemOptions{
		ttl:         DefaultIdempotencyTTL,
		lease:       DefaultIdempotencyLease,
		pushback:    DefaultIdempotencyPushback,
		pollInitial: DefaultIdempotencyPollInitial,
		pollMax:     DefaultIdempotencyPollMax,
		retryable:   DefaultIdempotencyUnstored,
		detachMax:   DefaultIdempotencyDetachedMax,
	}
}

// DefaultIdempotencyUnstored are the status codes whose outcomes are not
// stored, so that a retry runs the handler again: UNAVAILABLE,
// RESOURCE_EXHAUSTED, ABORTED, CANCELLED and DEADLINE_EXCEEDED (a handler
// cancelled or timed out returns the last two).
var DefaultIdempotencyUnstored = rescodes.Of(codes.Unavailable, codes.ResourceExhausted,
	codes.Aborted, codes.Canceled, codes.DeadlineExceeded)

func srvIdemOption(f func(*srvIdemOptions)) ServerOption {
	return srvOptionFunc(func(o *serverOptions) { f(&o.idem) })
}

// WithIdempotencyStore turns on server-side idempotency with store. A unary
// call that carries idempotency-key metadata runs its handler once per record
// key (caller scope, full method, key); duplicates receive the stored
// outcome, byte for byte, without running the handler. It needs a scope:
// [WithIdempotencyScope] or [WithIdempotencySharedScope]. See the package
// documentation of interceptor/idempotency for the semantics, and
// idempotency.NewMemoryStore and redisstore.New for stores.
//
// Once a keyed call's handler starts, the call belongs to the server: the
// handler runs detached from its caller's deadline and cancellation, at
// most DefaultIdempotencyDetachedMax, and its outcome is stored even when
// the caller has gone (see WithIdempotencyDetachedHandler for the cost and
// the opt-out).
//
// What a duplicate receives: the stored status (code, message, details) or
// reply, marked with the header IdempotencyReplayedHeader, and the response
// header and trailer metadata that the handler set
// through its context (grpc.SetHeader, grpc.SendHeader, grpc.SetTrailer),
// less the keys of [WithIdempotencyOmitMetadata]. Nothing else is stored:
// not the request, not metadata set by interceptors outside this one (they
// run again for the duplicate), not grpc's own (grpc-status and the like,
// which the status carries).
//
// Health checks and reflection (the services of DefaultExemptServices) run
// plainly, key or not: a keyed health check is never claimed or replayed,
// so it always reports the server's current state, unless
// WithIdempotencyKeyPolicy names the method or its service.
//
// A store that is an idempotency.TxStore (pgstore's joined mode:
// pgstore.Store.Joined) holds each claim in a database transaction which the
// handler joins (pgstore.Tx): the handler's writes commit with the call's
// record, in one transaction, before the reply is sent, and roll back with
// it after an unstored code or a panic; a concurrent duplicate waits for
// that transaction, up to the store's bound, and then replays its outcome
// or gets ABORTED with a pushback. See package pgstore.
//
// A nil store is refused (NewServer returns an error), as is a nil pointer
// of a store type (such as the *redisstore.Store of an Open whose error was
// dropped): it would turn idempotency off, or fail every keyed call.
func WithIdempotencyStore(store idempotency.Store) ServerOption {
	return srvIdemOption(func(o *srvIdemOptions) {
		if store == nil || srvNilPointer(store) {
			arg := "nil"
			if store != nil {
				arg = fmt.Sprintf("(%T)(nil)", store)
			}
			o.errs = append(o.errs, fmt.Errorf("interceptor: WithIdempotencyStore(%s): the store must not be nil; "+
				"pass the store of idempotency.NewMemoryStore, redisstore.Open or pgstore.Open, after checking their error", arg))
			return
		}
		o.store = store
	})
}

// srvNilPointer reports whether v holds a nil pointer.
func srvNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// WithIdempotencyScope sets the function that names the caller's scope, the
// first part of every record key: typically the authenticated principal or
// tenant, or [IdempotencyPeerScope] for callers with verified client
// certificates (mTLS, SPIFFE). An error it returns is returned to the caller
// as is (a status error keeps its code; grpc makes any other error UNKNOWN),
// and the handler does not run.
//
// A Server with a store needs a scope: this option, or
// [WithIdempotencySharedScope] to let every caller share one. NewServer
// returns an error otherwise. All callers of one scope share records: a
// caller who learns or guesses another's key, for the same method and
// request, receives that caller's reply and the metadata replayed with it
// (see [WithIdempotencyOmitMetadata]).
func WithIdempotencyScope(scope func(ctx context.Context) (string, error)) ServerOption {
	return srvIdemOption(func(o *srvIdemOptions) {
		if scope == nil {
			o.errs = append(o.errs, errors.New("interceptor: WithIdempotencyScope(nil): scope must not be nil"))
			return
		}
		o.scope = scope
	})
}

// WithIdempotencySharedScope makes every caller share one scope, the empty
// one: an explicit choice for a server whose callers are not authenticated,
// or are all one principal. Any caller who learns or guesses another's key,
// for the same method and request, then receives that caller's reply and its
// replayed metadata; it can also take a key first (the owner then gets
// FAILED_PRECONDITION for the record's TTL) and learn whether a key was
// used. Keys must be unguessable (random, 128 bits or more) and never shown
// to other callers. A later WithIdempotencyScope replaces it, and it
// replaces an earlier one.
//
// All callers then share one scope's quota of the store: by default a
// quarter of a memory store (idempotency.WithScopeQuota) or of a Redis
// store (redisstore.WithScopeQuota). Give the store the quota that one
// scope may use, or turn it off.
func WithIdempotencySharedScope() ServerOption {
	return srvIdemOption(func(o *srvIdemOptions) { o.scope = srvSharedScope })
}

func srvSharedScope(context.Context) (string, error) { return "", nil }

// WithIdempotencyDetachedHandler sets the bound of a keyed call's handler
// (default DefaultIdempotencyDetachedMax, 30 s), or, with 0, puts it back
// on the caller's context.
//
// By default a keyed call belongs to the server once its handler starts:
// the call that owns the key runs its handler on a context that the
// caller's cancellation and deadline do not reach, bounded instead by max
// from the handler's start, whatever deadline the caller sent, and by the
// key's lease (renewed while the handler runs; if it is lost all the same,
// the handler's context is cancelled, since a duplicate may then run the
// call). Values of the context (metadata, peer, auth) are kept. So a
// handler that commits its side effect (a card charged) and only then
// would have seen its caller's deadline finishes, its outcome is stored,
// and the caller's retry replays it: one charge.
//
// The cost: the server keeps working, up to max, for a caller that has
// gone and may not come back (its concurrency slot and downstream calls
// included), and the caller's deadline no longer bounds the handler's
// downstream calls (they get the handler's deadline, max from its start).
// A handler that needs longer than max gets DEADLINE_EXCEEDED, which is not
// stored: raise max for it.
//
// With 0 the handler runs on the caller's context: a caller that gives up
// cancels it, and a handler that then returns CANCELLED or
// DEADLINE_EXCEEDED has its claim released, not stored
// (DefaultIdempotencyUnstored), so the caller's retry runs it again. That
// is right only for handlers whose work is undone with their context (a
// transaction rolled back); one that committed first runs twice. Duplicates
// wait for a detached call as for any other, each bounded by its own
// deadline. Calls without a key, and methods whose key policy is
// IdempotencyKeyIgnored, always run on the caller's context.
func WithIdempotencyDetachedHandler(max time.Duration) ServerOption {
	return srvIdemOption(func(o *srvIdemOptions) {
		if max < 0 {
			o.errs = append(o.errs, fmt.Errorf("interceptor: WithIdempotencyDetachedHandler(%v): must not be negative", max))
			return
		}
		o.detachMax = max
	})
}

// WithIdempotencyOmitMetadata names response header and trailer keys that
// are never stored, so never replayed: a replay carries the rest of the
// metadata the handler set (see [WithIdempotencyStore]). Use it for
// metadata meant for one response only, such as cookies, per-attempt debug
// or timing headers. Keys are case-insensitive; each must be a valid
// metadata key (lower-case letters, digits, '-', '_', '.'). Repeated use
// adds keys.
func WithIdempotencyOmitMetadata(keys ...string) ServerOption {
	return srvIdemOption(func(o *srvIdemOptions) {
		for _, k := range keys {
			lk := strings.ToLower(k)
			if !srvValidMDKey(lk) {
				o.errs = append(o.errs, fmt.Errorf("interceptor: WithIdempotencyOmitMetadata(%q): not a valid metadata key", k))
				return
			}
			if o.omit == nil {
				o.omit = make(map[string]struct{})
			}
			o.omit[lk] = struct{}{}
		}
	})
}

// srvValidMDKey reports whether k, in lower case, is a valid metadata key.
func srvValidMDKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// WithIdempotencyTTL sets how long a completed outcome is kept and replayed
// (default DefaultIdempotencyTTL). A store with bounded memory may evict
// records sooner: the memory store never before its minimum retention
// (idempotency.WithMinRetention), and it refuses new claims with
// RESOURCE_EXHAUSTED rather than evict a younger record.
func WithIdempotencyTTL(d time.Duration) ServerOption {
	return srvIdemOption(func(o *srvIdemOptions) { o.ttl = d })
}

// WithIdempotencyLease sets the lease of a running first call (default
// DefaultIdempotencyLease). The key is claimed for the lease, whatever the
// caller's deadline, and renewed every lease/3 while the handler runs, so a
// handler keeps its key however long it runs. If its server crashes, the
// renewals stop and the key is free one lease after the last one: a
// duplicate on another replica is blocked at most one lease after the owner
// died (its polls never sleep past the lease's end), whatever deadline the
// first caller had. A shorter lease frees a crashed owner's keys sooner, at
// the cost of more renewals (one store call per lease/3 of handler time);
// it must outlast the store's unavailability (renewals that fail for two
// thirds of a lease let it end under a running handler, and a duplicate on
// another replica may then run it: a detached handler's context is
// cancelled, and logged, once nine tenths of its lease have passed without
// a renewal, before the store's lease can end).
func WithIdempotencyLease(d time.Duration) ServerOption {
	return srvIdemOption(func(o *srvIdemOptions) { o.lease = d })
}

// WithIdempotencyWait sets whether a duplicate that arrives while the first
// call runs waits for its outcome (true, the default), bounded by the
// duplicate's own deadline, or fails at once with ABORTED and a
// grpc-retry-pushback-ms trailer (false).
func WithIdempotencyWait(wait bool) ServerOption {
	return srvIdemOption(func(o *srvIdemOptions) { o.noWait = !wait })
}

// WithIdempotencyPushback sets the retry hint of the calls the server asks
// to retry (default DefaultIdempotencyPushback): the grpc-retry-pushback-ms
// trailer of ABORTED when waiting is off, and both that trailer and a
// google.rpc.RetryInfo detail of UNAVAILABLE when the store fails and the
// server fails closed.
func WithIdempotencyPushback(d time.Duration) ServerOption {
	return srvIdemOption(func(o *srvIdemOptions) { o.pushback = d })
}

// WithIdempotencyPoll sets the backoff of a duplicate polling the store while
// the first call runs in another process (or another Server): initial, then
// doubling up to max, and never past the remaining lease. In-process
// duplicates do not poll: they wait for the first call directly.
func WithIdempotencyPoll(initial, max time.Duration) ServerOption {
	return srvIdemOption(func(o *srvIdemOptions) { o.pollInitial, o.pollMax = initial, max })
}

// WithIdempotencyFailOpen sets what a keyed call does when the store fails
// (an outage, a timeout). false, the default, fails closed: the call gets
// UNAVAILABLE with a retry hint (the grpc-retry-pushback-ms trailer and a
// google.rpc.RetryInfo detail of WithIdempotencyPushback), which clients
// retry, and the handler does not run. true fails
// open: the handler runs without idempotency, so a duplicate may run it
// again; each such call is logged. A store that refuses a claim for room
// (idempotency.FullError: full, or the caller's scope at its quota) is not
// failing: the call gets RESOURCE_EXHAUSTED with a RetryInfo hint either
// way, and the handler does not run.
func WithIdempotencyFailOpen(open bool) ServerOption {
	return srvIdemOption(func(o *srvIdemOptions) { o.failOpen = open })
}

// WithIdempotencyKeyPolicy sets the key policy of the methods name selects:
// a full method "/pkg.Service/Method", a service "pkg.Service" (all its
// unary methods), or "" (every unary method). The most specific wins; the
// default for every method is IdempotencyKeyOptional.
//
// Idempotency keys apply to unary methods only, so a policy other than
// IdempotencyKeyIgnored must not name a streaming method. Enforcing one on
// a stream would not mean what it does for a unary call: a stream has no
// single request to fingerprint before the handler runs (its messages
// arrive while it runs) and no single outcome to store and replay (a replay
// would resend messages the caller has already read, and could not replay
// the interleaving of a bidirectional stream). Accepting the policy and
// running the stream anyway would let a keyless stream through a Required
// method and run the same key twice. So the policy is refused: by NewServer,
// with an error, when the protobuf registry (protoregistry.GlobalFiles,
// where generated code registers every service) describes the method as
// streaming; otherwise by StreamServerInterceptor, which fails every call
// of the method with FAILED_PRECONDITION naming this option. Install
// StreamServerInterceptor too for that check to run. A service or ""
// policy covers no stream, keyed or not.
func WithIdempotencyKeyPolicy(name string, p IdempotencyKeyPolicy) ServerOption {
	return srvIdemOption(func(o *srvIdemOptions) {
		if err := srvCheckPolicyName(name); err != nil {
			o.errs = append(o.errs, fmt.Errorf("interceptor: WithIdempotencyKeyPolicy(%q): %w", name, err))
			return
		}
		if p > IdempotencyKeyIgnored {
			o.errs = append(o.errs, fmt.Errorf("interceptor: WithIdempotencyKeyPolicy(%q): unknown policy %d", name, p))
			return
		}
		if o.policies == nil {
			o.policies = make(map[string]IdempotencyKeyPolicy)
		}
		o.policies[name] = p
	})
}

// WithIdempotencyUnstoredCodes sets the status codes whose outcomes are not
// stored: the claim is released and a retry runs the handler again (default
// DefaultIdempotencyUnstored). Every other outcome, success or error, is
// stored and replayed. A panic is never stored.
func WithIdempotencyUnstoredCodes(s rescodes.Set) ServerOption {
	return srvIdemOption(func(o *srvIdemOptions) { o.retryable = s })
}

func srvCheckPolicyName(name string) error {
	switch {
	case name == "":
		return nil
	case name[0] == '/':
		svc, m, ok := strings.Cut(name[1:], "/")
		if !ok || svc == "" || m == "" || strings.Contains(m, "/") {
			return errors.New(`a full method must be "/pkg.Service/Method"`)
		}
	case strings.Contains(name, "/"):
		return errors.New(`a service must be "pkg.Service", without "/"`)
	}
	return nil
}

// srvIdem is server-side idempotency: validated options and the in-process
// flights. Everything but flights is immutable.
type srvIdem struct {
	store       idempotency.Store
	tx          idempotency.TxStore // store, when it is one (pgstore's joined mode: see claimJoined); else nil
	scope       func(context.Context) (string, error)
	ttl, lease  time.Duration
	pollInitial time.Duration
	pollMax     time.Duration
	noWait      bool
	failOpen    bool
	retryable   rescodes.Set
	policies    map[string]IdempotencyKeyPolicy
	exemptSvc   []string              // run plainly unless a key policy names them: DefaultExemptServices, copied by NewServer
	omit        map[string]struct{}   // metadata keys never stored, lower case; nil when none
	detachMax   time.Duration         // > 0: owned handlers run detached from the caller, at most this long
	pushbackMD  metadata.MD           // the trailer of ABORTED when waiting is off, and of a failed-closed call
	retryHint   *errdetails.RetryInfo // the pushback, the detail of a failed-closed call
	// renewals holds stopped lease renewals with their timer, for the next
	// first execution (see srvRenewal). Per server, not global: a timer made
	// in a testing/synctest bubble must not be reset outside it, and a
	// server's calls run where the server serves.
	renewals   sync.Pool
	inProgress srvOutcome // ABORTED with pushback, when waiting is off
	log        srvLogger
	// detach: store calls after the handler get a context that the
	// caller's cancellation does not reach. The memory store ignores
	// contexts, so it is spared the allocation.
	detach       bool
	flights      srvFlights
	replyTypes   sync.Map    // full name -> protoreflect.MessageType, of the replies replayed
	streamWarned atomic.Bool // a stream call refused by streamPolicyErr was logged
	m            *srvMetrics // set by NewServer before the Server is used; never nil then
}

func newSrvIdem(o *srvIdemOptions, log srvLogger) (*srvIdem, error) {
	if len(o.errs) > 0 {
		return nil, o.errs[0]
	}
	if o.store == nil {
		if o.policies != nil {
			return nil, errors.New("interceptor: WithIdempotencyKeyPolicy needs WithIdempotencyStore")
		}
		return nil, nil
	}
	switch {
	case o.ttl < time.Millisecond:
		return nil, fmt.Errorf("interceptor: WithIdempotencyTTL(%v): must be at least 1ms", o.ttl)
	case o.lease < time.Millisecond:
		return nil, fmt.Errorf("interceptor: WithIdempotencyLease(%v): must be at least 1ms", o.lease)
	case o.pushback < 0:
		return nil, fmt.Errorf("interceptor: WithIdempotencyPushback(%v): must not be negative", o.pushback)
	case o.pollInitial <= 0 || o.pollMax < o.pollInitial:
		return nil, fmt.Errorf("interceptor: WithIdempotencyPoll(%v, %v): need 0 < initial <= max", o.pollInitial, o.pollMax)
	}
	if o.scope == nil {
		return nil, errors.New("interceptor: WithIdempotencyStore needs the callers' scope, so that one caller " +
			"never receives another's reply: WithIdempotencyScope(f) with the authenticated principal or tenant, " +
			"WithIdempotencyScope(interceptor.IdempotencyPeerScope) for callers with verified client certificates, " +
			"or WithIdempotencySharedScope() to let every caller share records (keys must then be unguessable)")
	}
	if err := srvCheckStreamPolicies(o.policies); err != nil {
		return nil, err
	}
	_, inMemory := o.store.(*idempotency.MemoryStore)
	txStore, _ := o.store.(idempotency.TxStore)
	s := &srvIdem{
		tx:          txStore,
		detach:      !inMemory,
		store:       o.store,
		scope:       o.scope,
		ttl:         o.ttl,
		lease:       o.lease,
		pollInitial: o.pollInitial,
		pollMax:     o.pollMax,
		noWait:      o.noWait,
		failOpen:    o.failOpen,
		retryable:   o.retryable,
		policies:    o.policies,
		omit:        o.omit,
		exemptSvc:   slices.Clone(DefaultExemptServices),
		detachMax:   o.detachMax,
		pushbackMD:  metadata.Pairs(pushbackKey, strconv.FormatInt(o.pushback.Milliseconds(), 10)),
		retryHint:   &errdetails.RetryInfo{RetryDelay: durationpb.New(o.pushback)},
		log:         log,
		m:           &srvMetrics{},
		flights:     newSrvFlights(),
		inProgress: srvOutcome{ok: true, pushback: true, err: &srvRejection{code: codes.Aborted,
			msg:      "idempotency: a call with this idempotency-key is in progress; retry later",
			sentinel: ErrIdempotencyInProgress}},
	}
	return s, nil
}

// srvCheckStreamPolicies returns an error naming the first policy, by name,
// that names a method the protobuf registry describes as streaming, unless
// the policy is IdempotencyKeyIgnored (see WithIdempotencyKeyPolicy).
func srvCheckStreamPolicies(policies map[string]IdempotencyKeyPolicy) error {
	for _, name := range slices.Sorted(maps.Keys(policies)) {
		if policies[name] == IdempotencyKeyIgnored || !strings.HasPrefix(name, "/") {
			continue
		}
		if kind := srvStreamKind(name); kind != "" {
			return fmt.Errorf("interceptor: WithIdempotencyKeyPolicy(%q): a %s method; "+
				"idempotency keys apply to unary methods only (IdempotencyKeyIgnored may name a stream)", name, kind)
		}
	}
	return nil
}

// srvStreamKind returns what kind of streaming method fullMethod
// ("/pkg.Service/Method") is, as the protobuf registry describes it: "" for
// a unary method or one the registry does not know.
func srvStreamKind(fullMethod string) string {
	svc, m, _ := strings.Cut(fullMethod[1:], "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return ""
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return ""
	}
	md := sd.Methods().ByName(protoreflect.Name(m))
	switch {
	case md == nil:
		return ""
	case md.IsStreamingClient() && md.IsStreamingServer():
		return "bidirectional-streaming"
	case md.IsStreamingClient():
		return "client-streaming"
	case md.IsStreamingServer():
		return "server-streaming"
	}
	return ""
}

// streamPolicyErr returns the error of every call of the streaming method
// fullMethod when a key policy other than IdempotencyKeyIgnored names it,
// which NewServer could not see (see WithIdempotencyKeyPolicy), and logs it
// once per Server; nil otherwise. Without policies it costs a length check,
// with them one map lookup.
func (s *srvIdem) streamPolicyErr(fullMethod string) error {
	if len(s.policies) == 0 {
		return nil
	}
	if p, ok := s.policies[fullMethod]; !ok || p == IdempotencyKeyIgnored {
		return nil
	}
	msg := "interceptor: server misconfigured: WithIdempotencyKeyPolicy(" + strconv.Quote(fullMethod) +
		") names a streaming method; idempotency keys apply to unary methods only"
	if !s.streamWarned.Swap(true) {
		s.log.warn("idempotency: refusing every call of a streaming method that a key policy names", "method", fullMethod, "error", msg)
	}
	return status.Error(codes.FailedPrecondition, msg)
}

// policy returns the key policy of fullMethod: exact method, else service,
// else IdempotencyKeyIgnored for a method of the exempt services (health,
// reflection), else the "" entry, else optional.
func (s *srvIdem) policy(fullMethod string) IdempotencyKeyPolicy {
	if len(s.policies) == 0 {
		if s.exempt(fullMethod) {
			return IdempotencyKeyIgnored
		}
		return IdempotencyKeyOptional
	}
	if p, ok := s.policies[fullMethod]; ok {
		return p
	}
	if svc, ok := serviceOf(fullMethod); ok {
		if p, ok := s.policies[svc]; ok {
			return p
		}
	}
	if s.exempt(fullMethod) {
		return IdempotencyKeyIgnored
	}
	return s.policies[""]
}

// exempt reports whether fullMethod is of one of the services in
// s.exemptSvc, which run plainly, key or not, unless a key policy
// names them. Every default one starts with "grpc.", so other methods cost
// a byte comparison or two.
func (s *srvIdem) exempt(fullMethod string) bool {
	if !strings.HasPrefix(fullMethod, "/grpc.") {
		return false
	}
	svc, ok := serviceOf(fullMethod)
	return ok && slices.Contains(s.exemptSvc, svc)
}

// srvIdemKey returns the call's idempotency key from the values of its
// idempotency-key metadata: ok false when there is none,
// an error wrapping ErrIdempotencyKeyInvalid when it is malformed: sent more
// than once, empty, longer than 255 bytes, or holding a byte outside
// printable ASCII (0x20–0x7E).
func srvIdemKey(vs []string) (key string, ok bool, err error) {
	switch {
	case len(vs) == 0:
		return "", false, nil
	case len(vs) > 1:
		return "", false, srvInvalidKey("idempotency-key sent " + strconv.Itoa(len(vs)) + " times; send one value")
	}
	if err := ValidIdempotencyKey(vs[0]); err != nil {
		return "", false, srvInvalidKey(err.Error())
	}
	return vs[0], true, nil
}

func srvInvalidKey(msg string) error {
	return &srvRejection{code: codes.InvalidArgument, msg: "idempotency: " + msg, sentinel: ErrIdempotencyKeyInvalid}
}

// IdempotencyPeerScope is a scope function for callers with verified TLS
// client certificates (mTLS, including SPIFFE X.509-SVIDs as Istio and SPIRE
// issue them): "x509:" and the hex SHA-256 of the leaf certificate's
// identity, which is its issuer, its Subject and its subject alternative
// names (URIs such as spiffe://example.org/ns/a/sa/x, DNS names, e-mail
// addresses and IP addresses, each list sorted). The scope is stable across
// renewals by the same CA that keep the identity, and differs between two
// workloads of one CA whose certificates differ only in a SAN.
//
// A keyed call from a caller without a verified certificate, or with one
// that names nobody (an empty Subject and no SAN), is refused with
// UNAUTHENTICATED: it has no scope of its own, and sharing one would let
// such callers read each other's replies. Install it with
// WithIdempotencyScope(IdempotencyPeerScope).
func IdempotencyPeerScope(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return "", errSrvNoPeerCert
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return "", errSrvNoPeerCert
	}
	leaf := ti.State.VerifiedChains[0][0]
	if !srvCertNamesSomeone(leaf) {
		return "", errSrvAnonymousCert
	}
	return srvCertScope(leaf), nil
}

var (
	errSrvNoPeerCert = status.Error(codes.Unauthenticated,
		"idempotency: a keyed call needs a verified client certificate to scope its key (IdempotencyPeerScope)")
	errSrvAnonymousCert = status.Error(codes.Unauthenticated,
		"idempotency: the client certificate has no identity (empty Subject, no SAN) to scope the key")
)

// srvCertNamesSomeone reports whether the certificate carries an identity:
// a Subject or a subject alternative name.
func srvCertNamesSomeone(c *x509.Certificate) bool {
	emptySubject := len(c.RawSubject) == 0 || string(c.RawSubject) == "\x30\x00" // an empty DER SEQUENCE
	return !emptySubject || len(c.URIs) > 0 || len(c.DNSNames) > 0 ||
		len(c.EmailAddresses) > 0 || len(c.IPAddresses) > 0
}

// srvCertScope hashes the certificate's identity: every part is
// length-prefixed, and each SAN list is counted and sorted, so no two
// identities hash alike by moving bytes between parts.
func srvCertScope(leaf *x509.Certificate) string {
	h := sha256.New()
	var n [8]byte
	put := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	list := func(vs []string) {
		vs = slices.Sorted(slices.Values(vs))
		binary.BigEndian.PutUint64(n[:], uint64(len(vs)))
		h.Write(n[:])
		for _, v := range vs {
			put([]byte(v))
		}
	}
	put(leaf.RawIssuer)
	put(leaf.RawSubject)
	uris := make([]string, len(leaf.URIs))
	for i, u := range leaf.URIs {
		uris[i] = u.String()
	}
	ips := make([]string, len(leaf.IPAddresses))
	for i, ip := range leaf.IPAddresses {
		ips[i] = ip.String()
	}
	list(uris)
	list(leaf.DNSNames)
	list(leaf.EmailAddresses)
	list(ips)
	return "x509:" + hex.EncodeToString(h.Sum(nil))
}

// srvFingerprint hashes the deterministic encoding of req.
func srvFingerprint(req any) ([sha256.Size]byte, error) {
	sum, _, err := srvFingerprintAppend(nil, req)
	return sum, err
}

// srvFingerprintAppend is srvFingerprint marshalling into buf[:0], which it
// returns for reuse.
func srvFingerprintAppend(buf []byte, req any) ([sha256.Size]byte, []byte, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return [sha256.Size]byte{}, buf, status.Errorf(codes.Internal, "idempotency: request type %T is not a proto message", req)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(buf[:0], m)
	if err != nil {
		return [sha256.Size]byte{}, buf, status.Errorf(codes.Internal, "idempotency: marshalling the request: %v", err)
	}
	return sha256.Sum256(b), b, nil
}

// srvRecord completes o.rec, whose metadata is captured, with the
// handler's outcome.
func srvRecord(o *srvOwned, resp any, herr error) error {
	rec := &o.rec
	rec.Fingerprint = o.fp[:]
	if herr != nil {
		st := status.Convert(herr).Proto()
		rec.Code, rec.Message, rec.Details = codes.Code(st.Code), st.Message, st.Details
		return nil
	}
	m, ok := resp.(proto.Message)
	if !ok {
		return fmt.Errorf("reply type %T is not a proto message", resp)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("marshalling the reply: %w", err)
	}
	rec.ReplyType, rec.Reply = string(m.ProtoReflect().Descriptor().FullName()), b
	return nil
}

// omitted returns md without the keys of WithIdempotencyOmitMetadata. md is
// the capture's own copy (metadata.Join copies), so it is edited in place.
func (s *srvIdem) omitted(md metadata.MD) metadata.MD {
	if len(s.omit) == 0 || len(md) == 0 {
		return md
	}
	for k := range md {
		if _, ok := s.omit[strings.ToLower(k)]; ok {
			delete(md, k)
		}
	}
	if len(md) == 0 {
		return nil
	}
	return md
}

// replayShared returns a flight's outcome to one of its calls.
func (s *srvIdem) replayShared(ctx context.Context, out *srvOutcome) (any, error) {
	if out.rec != nil {
		return s.replay(ctx, out.rec)
	}
	if out.pushback {
		_ = grpc.SetTrailer(ctx, s.pushbackMD)
	}
	return nil, out.err
}

// replyType returns the message type of a stored reply. Types found are
// cached: the global registry takes a lock shared by all its readers, whose
// cache line the cores of parallel replays would pass around.
func (s *srvIdem) replyType(name string) (protoreflect.MessageType, error) {
	if mt, ok := s.replyTypes.Load(name); ok {
		return mt.(protoreflect.MessageType), nil
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
	if err != nil {
		return nil, err
	}
	s.replyTypes.Store(name, mt)
	return mt, nil
}

// replay returns a stored outcome: its metadata, marked with
// IdempotencyReplayedHeader, and its reply or status.
func (s *srvIdem) replay(ctx context.Context, rec *idempotency.Record) (any, error) {
	// Straight to the stream: grpc.SetHeader without one (the interceptor
	// called outside a grpc server) formats its context into an error.
	if stream := grpc.ServerTransportStreamFromContext(ctx); stream != nil {
		hdr := idemReplayedMD
		if len(rec.Header) > 0 {
			// The record's header never holds the mark (srvOwned strips
			// it); one stored by an earlier version may.
			hdr = metadata.Join(srvWithoutReplayed(rec.Header), idemReplayedMD)
		}
		_ = stream.SetHeader(hdr)
	}
	if len(rec.Trailer) > 0 {
		_ = grpc.SetTrailer(ctx, rec.Trailer)
	}
	if rec.Code != codes.OK {
		return nil, status.ErrorProto(&spb.Status{Code: int32(rec.Code), Message: rec.Message, Details: rec.Details})
	}
	mt, err := s.replyType(rec.ReplyType)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idempotency: stored reply type %q: %v", rec.ReplyType, err)
	}
	m := mt.New().Interface()
	// Merge into the new, empty message: no Reset needed.
	if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(rec.Reply, m); err != nil {
		return nil, status.Errorf(codes.Internal, "idempotency: decoding the stored reply: %v", err)
	}
	return m, nil
}

// srvOwned is what the owner of a claim allocates, once: the stream its
// handler sees, which records the metadata the handler sets (in rec.Header
// and rec.Trailer) and passes it on to the real stream when there is one
// and its caller is still there; then, with the handler's outcome, the
// record to store, whose Fingerprint is fp. Once its caller has gone (a
// detached handler goes on), the metadata is recorded for the replay
// only, without error: the caller's stream would refuse it. Once closed,
// when the handler has returned, it refuses more metadata and lets go of
// the real stream and the call's context: the store may keep the record,
// and so o, for a long time.
type srvOwned struct {
	rec    idempotency.Record // Header and Trailer guarded by mu until closed; then immutable
	fp     [sha256.Size]byte  // immutable
	method string             // immutable

	mu     sync.Mutex
	closed bool                       // guarded by mu
	stream grpc.ServerTransportStream // nil when the interceptor is called without a grpc stream, or closed; guarded by mu
	caller context.Context            // the call's, which ends when its caller has gone; nil once closed; guarded by mu
}

// errSrvCaptureClosed is returned to a handler that sets metadata through a
// context it kept after it returned.
var errSrvCaptureClosed = status.Error(codes.Internal, "idempotency: metadata set after the handler returned")

func (o *srvOwned) Method() string { return o.method }

func (o *srvOwned) SetHeader(md metadata.MD) error {
	return o.capture(&o.rec.Header, md, grpc.ServerTransportStream.SetHeader)
}

func (o *srvOwned) SendHeader(md metadata.MD) error {
	return o.capture(&o.rec.Header, md, grpc.ServerTransportStream.SendHeader)
}

func (o *srvOwned) SetTrailer(md metadata.MD) error {
	return o.capture(&o.rec.Trailer, md, grpc.ServerTransportStream.SetTrailer)
}

func (o *srvOwned) capture(dst *metadata.MD, md metadata.MD, pass func(grpc.ServerTransportStream, metadata.MD) error) error {
	md = srvWithoutReplayed(md)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return errSrvCaptureClosed
	}
	// A stream refuses metadata after its caller has gone (the status is
	// written): that is no error of the handler's, whose outcome the
	// caller's retry will replay.
	if o.stream != nil && o.caller.Err() == nil {
		if err := pass(o.stream, md); err != nil && o.caller.Err() == nil {
			return err
		}
	}
	*dst = metadata.Join(*dst, md)
	return nil
}

// srvWithoutReplayed returns md without IdempotencyReplayedHeader, which
// only the interceptor sets, on answers for which the handler did not run:
// a handler that sets it (a gateway passing on a downstream server's
// header) would mark its fresh answer as a replay, and the stored copy
// would make the replay's header two values, which IdempotencyReplayed
// does not take for a replay. md is returned as is when it has no such key
// (no allocation), else a copy without it.
func srvWithoutReplayed(md metadata.MD) metadata.MD {
	for k := range md {
		if len(k) == len(IdempotencyReplayedHeader) && strings.EqualFold(k, IdempotencyReplayedHeader) {
			out := make(metadata.MD, len(md)-1)
			for k, v := range md {
				if !strings.EqualFold(k, IdempotencyReplayedHeader) {
					out[k] = v
				}
			}
			return out
		}
	}
	return md
}

// close ends the capture.
func (o *srvOwned) close() {
	o.mu.Lock()
	o.closed, o.stream, o.caller = true, nil, nil
	o.mu.Unlock()
}
