package server

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
	"github.com/grpc-resilience/resilience/interceptor/internal/pushback"
	"github.com/grpc-resilience/resilience/interceptor/internal/rpcname"
	"github.com/grpc-resilience/resilience/interceptor/wire"
)

// Defaults of the fields of Idempotency.
const (
	defaultTTL         = 24 * time.Hour
	defaultLease       = 30 * time.Second
	defaultPushback    = 100 * time.Millisecond
	defaultPollInitial = 10 * time.Millisecond
	defaultPollMax     = 500 * time.Millisecond
	defaultDetachedMax = 30 * time.Second
)

// KeyPolicy says what a method does with the idempotency-key
// metadata. The zero value is KeyOptional.
type KeyPolicy uint8

const (
	// KeyOptional uses the key when the call carries one and runs
	// the handler plainly when it does not. The default.
	KeyOptional KeyPolicy = iota
	// KeyRequired rejects calls without a key with
	// INVALID_ARGUMENT.
	KeyRequired
	// KeyIgnored runs every call plainly, key or not: for methods
	// without side effects, where storing replies only costs.
	KeyIgnored
)

// String returns the name of p's constant, "KeyOptional", "KeyRequired"
// or "KeyIgnored"; "KeyPolicy(n)" for a value that is none of them.
func (p KeyPolicy) String() string {
	switch p {
	case KeyOptional:
		return "KeyOptional"
	case KeyRequired:
		return "KeyRequired"
	case KeyIgnored:
		return "KeyIgnored"
	}
	return "KeyPolicy(" + strconv.Itoa(int(p)) + ")"
}

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
	policies    map[string]KeyPolicy // by "", service or full method
	omit        map[string]struct{}  // metadata keys never stored, lower case
	detachMax   time.Duration        // > 0: owned handlers run detached, at most this long; 0: on the caller's context
	warnings    []string             // about policies naming services nothing registers, logged by New
	streamWarns []string             // about KeyRequired policies whose service has streams (srvStreamsUncovered), logged by New
}

// DefaultUnstoredCodes are the status codes whose outcomes are not
// stored, so that a retry runs the handler again: UNAVAILABLE,
// RESOURCE_EXHAUSTED, ABORTED, CANCELLED and DEADLINE_EXCEEDED (a handler
// cancelled or timed out returns the last two).
var DefaultUnstoredCodes = rescodes.Of(codes.Unavailable, codes.ResourceExhausted,
	codes.Aborted, codes.Canceled, codes.DeadlineExceeded)

// srvNilPointer reports whether v holds a nil pointer.
func srvNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// SharedScope is a scope function (Idempotency.Scope) that puts every
// caller in one scope, the empty one: an explicit choice for a server whose
// callers are not authenticated, or are all one principal. Any caller who
// learns or guesses another's key, for the same method and request, then
// receives that caller's reply and its replayed metadata; it can also take
// a key first (the owner then gets FAILED_PRECONDITION for the record's
// TTL) and learn whether a key was used. Keys must be unguessable (random,
// 128 bits or more) and never shown to other callers.
//
// All callers then share one scope's quota of the store: by default a
// quarter of a memory store (idempotency.WithScopeQuota) or of a Redis
// store (redisstore.WithScopeQuota). Give the store the quota that one
// scope may use, or turn it off.
func SharedScope(context.Context) (string, error) { return "", nil }

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

// srvCheckPolicyName checks the name of a key policy: "", or a full method
// or a service as Limits.Streams and the server document name them (no
// spaces, no empty parts), so that a mistyped name is refused rather than
// left to match no call.
func srvCheckPolicyName(name string) error {
	if name == "" {
		return nil
	}
	_, err := rpcname.Parse(name)
	return err
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
	policies    map[string]KeyPolicy
	exemptSvc   []string              // run plainly unless a key policy names them: rpcname.ExemptServices, copied by New
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
	handlers     srvHandlers // the keyed handlers running, for Server.Shutdown
	replyTypes   sync.Map    // full name -> protoreflect.MessageType, of the replies replayed
	streamWarned atomic.Bool // a stream call refused by streamPolicyErr was logged
	m            *srvMetrics // set by New before the Server is used; never nil then
	// runHandler is the Server's one admission path (Server.runHandler),
	// through which every handler this layer runs is run; set by New.
	runHandler func(caller, hctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error)
	// refused is the Server's WithOnRefusal hook; nil: none. Set by New
	// before the Server is used.
	refused refusalHook
}

func newSrvIdem(o *srvIdemOptions, log srvLogger) (*srvIdem, error) {
	if o.store == nil { // no WithIdempotency (which refuses a nil Store)
		return nil, nil
	}
	for _, w := range o.warnings {
		log.warn("idempotency: a key policy names a service no code linked into the program registers", "warning", w)
	}
	for _, w := range o.streamWarns {
		log.warn("idempotency: a key policy does not cover the streams of the methods it names", "warning", w)
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
		exemptSvc:   slices.Clone(rpcname.ExemptServices),
		detachMax:   o.detachMax,
		pushbackMD:  metadata.Pairs(pushback.Key, strconv.FormatInt(o.pushback.Milliseconds(), 10)),
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

// srvCheckPolicies checks the names of policies against the services and
// methods linked into the program (rpcname.Registered), in name order, so
// that the first error is the same every time: a method its registered
// service lacks, or a name that is no service, is an error; so is a policy
// other than KeyIgnored naming a method the registry describes as
// streaming (see Idempotency.KeyPolicies). A service the program does not
// register may still be served by a hand-written grpc.ServiceDesc: it is
// returned as a warning, for New to log.
func srvCheckPolicies(policies map[string]KeyPolicy) (warnings []string, err error) {
	for _, name := range slices.Sorted(maps.Keys(policies)) {
		n, perr := rpcname.Parse(name)
		if name == "" || perr != nil {
			continue // "" is every method; a malformed name was refused before
		}
		msg, wrong := rpcname.Registered(n)
		switch {
		case wrong:
			return nil, fmt.Errorf("server: Idempotency.KeyPolicies[%q]: %s", name, msg)
		case msg != "":
			warnings = append(warnings, fmt.Sprintf("server: Idempotency.KeyPolicies[%q]: %s", name, msg))
		}
		if kind := rpcname.StreamKind(n); kind != "" && policies[name] != KeyIgnored {
			return nil, fmt.Errorf("server: Idempotency.KeyPolicies[%q]: a %s method; "+
				"idempotency keys apply to unary methods only (KeyIgnored may name a stream)", name, kind)
		}
	}
	return warnings, nil
}

// maxListed bounds the methods a warning names.
const maxListed = 8

// srvStreamsUncovered returns the warnings about the streaming methods
// that a KeyRequired policy of a service or of "" names without covering
// them: idempotency keys apply to unary methods only, so those streams run
// plainly, with a key or without one, and nothing requires it. It names
// the streams the registry describes that no more specific policy names
// (for "", outside the exempt services, which run plainly unless named).
// A policy naming a stream exactly is refused (srvCheckPolicies); the other
// policies cover streams as they cover no policy at all.
func srvStreamsUncovered(policies map[string]KeyPolicy) []string {
	var warnings []string
	for _, name := range slices.Sorted(maps.Keys(policies)) {
		if policies[name] != KeyRequired || strings.Contains(name, "/") {
			continue
		}
		var under []string
		if name != "" {
			for _, m := range rpcname.StreamMethods(name) {
				if _, exact := policies["/"+name+"/"+m]; !exact {
					under = append(under, m)
				}
			}
			if len(under) > 0 {
				warnings = append(warnings, fmt.Sprintf("server: Idempotency.KeyPolicies[%q]: KeyRequired covers the unary methods of the service only: "+
					"its streaming methods (%s) run plainly, with a key or without one (idempotency keys apply to unary methods only)",
					name, rpcname.List(under, maxListed)))
			}
			continue
		}
		for _, fm := range rpcname.AllStreamMethods() {
			svc, _ := serviceOf(fm)
			if _, exact := policies[fm]; exact {
				continue
			}
			if _, named := policies[svc]; named || slices.Contains(rpcname.ExemptServices, svc) {
				continue
			}
			under = append(under, fm)
		}
		if len(under) > 0 {
			warnings = append(warnings, fmt.Sprintf("server: Idempotency.KeyPolicies[\"\"]: KeyRequired covers unary methods only: "+
				"the streaming methods that no other policy names (%s) run plainly, with a key or without one (idempotency keys apply to unary methods only)",
				rpcname.List(under, maxListed)))
		}
	}
	return warnings
}

// streamPolicyErr returns the error of every call of the streaming method
// fullMethod when a key policy other than KeyIgnored names it,
// which New could not see (see Idempotency.KeyPolicies), and logs it
// once per Server; nil otherwise. Without policies it costs a length check,
// with them one map lookup.
func (s *srvIdem) streamPolicyErr(fullMethod string) error {
	if len(s.policies) == 0 {
		return nil
	}
	if p, ok := s.policies[fullMethod]; !ok || p == KeyIgnored {
		return nil
	}
	msg := "server: misconfigured: Idempotency.KeyPolicies[" + strconv.Quote(fullMethod) +
		"] names a streaming method; idempotency keys apply to unary methods only"
	if !s.streamWarned.Swap(true) {
		s.log.warn("idempotency: refusing every call of a streaming method that a key policy names", "method", fullMethod, "error", msg)
	}
	return status.Error(codes.FailedPrecondition, msg)
}

// policy returns the key policy of fullMethod: exact method, else service,
// else KeyIgnored for a method of the exempt services (health,
// reflection), else the "" entry, else optional.
func (s *srvIdem) policy(fullMethod string) KeyPolicy {
	if len(s.policies) == 0 {
		if s.exempt(fullMethod) {
			return KeyIgnored
		}
		return KeyOptional
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
		return KeyIgnored
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
	if err := wire.ValidIdempotencyKey(vs[0]); err != nil {
		return "", false, srvInvalidKey(err.Error())
	}
	return vs[0], true, nil
}

func srvInvalidKey(msg string) error {
	return &srvRejection{code: codes.InvalidArgument, msg: "idempotency: " + msg, sentinel: ErrIdempotencyKeyInvalid}
}

// PeerScope is a scope function for callers with verified TLS
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
// Idempotency{Scope: PeerScope}.
func PeerScope(ctx context.Context) (string, error) {
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
		"idempotency: a keyed call needs a verified client certificate to scope its key (PeerScope)")
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

// omitted returns md without the keys of Idempotency.OmitMetadata. md is
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
// wire.IdempotencyReplayedHeader, and its reply or status.
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

// srvWithoutReplayed returns md without wire.IdempotencyReplayedHeader, which
// only the interceptor sets, on answers for which the handler did not run:
// a handler that sets it (a gateway passing on a downstream server's
// header) would mark its fresh answer as a replay, and the stored copy
// would make the replay's header two values, which wire.IdempotencyReplayed
// does not take for a replay. md is returned as is when it has no such key
// (no allocation), else a copy without it.
func srvWithoutReplayed(md metadata.MD) metadata.MD {
	for k := range md {
		if len(k) == len(wire.IdempotencyReplayedHeader) && strings.EqualFold(k, wire.IdempotencyReplayedHeader) {
			out := make(metadata.MD, len(md)-1)
			for k, v := range md {
				if !strings.EqualFold(k, wire.IdempotencyReplayedHeader) {
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

// idemReplayedMD is the header of a replayed answer.
var idemReplayedMD = metadata.MD{wire.IdempotencyReplayedHeader: {"true"}}
