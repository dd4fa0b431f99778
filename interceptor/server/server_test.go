package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestIdempotencyValidateNamesTheField pins Idempotency.Validate, and New
// with WithIdempotency, field by field: each wrong field is refused with an
// error that names it ("server: Idempotency.X ..."), and New returns the
// same error as Validate.
func TestIdempotencyValidateNamesTheField(t *testing.T) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	withStore := func(c Idempotency) Idempotency {
		c.Store, c.Scope = store, SharedScope
		return c
	}
	tests := []struct {
		name string
		c    Idempotency
		want string
	}{
		{"nil store", Idempotency{Scope: SharedScope}, "server: Idempotency.Store is nil"},
		{"nil-pointer store", Idempotency{Store: (*idempotency.MemoryStore)(nil), Scope: SharedScope},
			"server: Idempotency.Store is a nil *idempotency.MemoryStore"},
		{"policy without store", Idempotency{Scope: SharedScope, KeyPolicies: map[string]KeyPolicy{"": KeyRequired}},
			"server: Idempotency.Store is nil"},
		{"nil scope", Idempotency{Store: store}, "server: Idempotency.Scope is nil"},
		{"negative TTL", withStore(Idempotency{TTL: -time.Second}), "server: Idempotency.TTL is -1s: must be 0 (the default, 24h0m0s) or at least 1ms"},
		{"sub-millisecond TTL", withStore(Idempotency{TTL: time.Microsecond}), "server: Idempotency.TTL is 1µs"},
		{"sub-millisecond lease", withStore(Idempotency{Lease: time.Microsecond}), "server: Idempotency.Lease is 1µs: must be 0 (the default, 30s) or at least 1ms"},
		{"negative pushback", withStore(Idempotency{Pushback: -time.Second}), "server: Idempotency.Pushback is -1s"},
		{"sub-millisecond pushback", withStore(Idempotency{Pushback: time.Microsecond}), "server: Idempotency.Pushback is 1µs"},
		{"negative poll initial", withStore(Idempotency{PollInitial: -1}), "server: Idempotency.PollInitial is -1ns"},
		{"negative poll max", withStore(Idempotency{PollMax: -1}), "server: Idempotency.PollMax is -1ns"},
		{"poll max below initial", withStore(Idempotency{PollInitial: time.Second, PollMax: time.Millisecond}),
			"server: Idempotency.PollMax is 1ms, less than PollInitial 1s"},
		{"poll max below the default initial", withStore(Idempotency{PollMax: time.Millisecond}),
			"server: Idempotency.PollMax is 1ms, less than PollInitial 10ms"},
		{"poll initial above the default max", withStore(Idempotency{PollInitial: time.Second}),
			"server: Idempotency.PollMax is 500ms, less than PollInitial 1s"},
		{"sub-millisecond detached max", withStore(Idempotency{DetachedMax: time.Microsecond}), "server: Idempotency.DetachedMax is 1µs"},
		{"negative detached max", withStore(Idempotency{DetachedMax: -time.Second}), "server: Idempotency.DetachedMax is -1s"},
		{"bad omitted key", withStore(Idempotency{OmitMetadata: []string{"x-ok", "bad key"}}),
			`server: Idempotency.OmitMetadata: "bad key" is not a valid metadata key`},
		{"empty omitted key", withStore(Idempotency{OmitMetadata: []string{""}}), `server: Idempotency.OmitMetadata: "" is not`},
		{"bad full method", withStore(Idempotency{KeyPolicies: map[string]KeyPolicy{"/svc": KeyRequired}}),
			`server: Idempotency.KeyPolicies["/svc"]`},
		{"service with slash", withStore(Idempotency{KeyPolicies: map[string]KeyPolicy{"a/b": KeyRequired}}),
			`server: Idempotency.KeyPolicies["a/b"]`},
		{"full method with a space", withStore(Idempotency{KeyPolicies: map[string]KeyPolicy{idemEchoMethod + " ": KeyRequired}}),
			`server: Idempotency.KeyPolicies["/resilience.echo.v1.EchoService/Echo "]: `},
		{"service with an empty part", withStore(Idempotency{KeyPolicies: map[string]KeyPolicy{"resilience..echo.v1.EchoService": KeyRequired}}),
			`server: Idempotency.KeyPolicies["resilience..echo.v1.EchoService"]: `},
		{"unknown policy", withStore(Idempotency{KeyPolicies: map[string]KeyPolicy{"": 7}}),
			`server: Idempotency.KeyPolicies[""]: unknown policy 7`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			verr := tt.c.Validate()
			if verr == nil || !strings.Contains(verr.Error(), tt.want) {
				t.Errorf("Validate() = %v, want an error containing %q", verr, tt.want)
			}
			_, err := New(WithIdempotency(tt.c))
			if err == nil || verr == nil || err.Error() != verr.Error() {
				t.Errorf("New(WithIdempotency(...)) error = %v, want Validate's %v", err, verr)
			}
		})
	}
	if _, err := New(nil); err == nil || !strings.Contains(err.Error(), "nil Option") {
		t.Errorf("New(nil) error = %v, want one naming the nil Option", err)
	}
}

// TestIdempotencyValidateKeyPoliciesInNameOrder: with several wrong
// KeyPolicies entries, Validate and New report the same one every time,
// the first in name order. KeyPolicies is a map: ranging over it reported a
// different entry from one run to the next.
func TestIdempotencyValidateKeyPoliciesInNameOrder(t *testing.T) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	c := Idempotency{Store: store, Scope: SharedScope, KeyPolicies: map[string]KeyPolicy{
		"/a.S": KeyRequired, "/b.S": KeyRequired, "/c.S": KeyRequired, "d/e": KeyRequired,
		"/f.S/M": 9, "/g.S/M": 9, "/h.S/M": 9, "i.S": 9,
	}}
	const want = `server: Idempotency.KeyPolicies["/a.S"]: "/a.S" is not a full method: want "/package.Service/Method"`
	for range 50 {
		if err := c.Validate(); err == nil || err.Error() != want {
			t.Fatalf("Validate() = %v, want %s", err, want)
		}
		if _, err := New(WithIdempotency(c)); err == nil || err.Error() != want {
			t.Fatalf("New(WithIdempotency(...)) = %v, want %s", err, want)
		}
	}
}

// TestIdempotencyZeroFieldsTakeTheDefaults pins the other half of
// Validate: a zero field is the default its comment gives, not an error,
// and the smallest values allowed are accepted as they are.
func TestIdempotencyZeroFieldsTakeTheDefaults(t *testing.T) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	zero := Idempotency{Store: store, Scope: SharedScope}
	if err := zero.Validate(); err != nil {
		t.Fatalf("Validate() of the zero settings = %v, want nil", err)
	}
	o, _ := zero.normalize()
	if o.ttl != 24*time.Hour || o.lease != 30*time.Second || o.pushback != 100*time.Millisecond ||
		o.pollInitial != 10*time.Millisecond || o.pollMax != 500*time.Millisecond || o.detachMax != 30*time.Second ||
		o.retryable != DefaultUnstoredCodes || o.noWait || o.failOpen || o.omit != nil || o.policies != nil {
		t.Errorf("zero settings normalize to %+v, want the documented defaults", o)
	}
	least := Idempotency{Store: store, Scope: SharedScope, TTL: time.Millisecond, Lease: time.Millisecond,
		Pushback: time.Millisecond, PollInitial: 1, PollMax: 1, DetachedMax: time.Millisecond,
		OmitMetadata: []string{"Set-Cookie"}, KeyPolicies: map[string]KeyPolicy{"": KeyIgnored}}
	o, err = least.normalize()
	if err != nil {
		t.Fatalf("the least values allowed: %v, want them accepted", err)
	}
	if o.ttl != time.Millisecond || o.lease != time.Millisecond || o.pushback != time.Millisecond ||
		o.pollInitial != 1 || o.pollMax != 1 || o.detachMax != time.Millisecond {
		t.Errorf("the least values normalize to %+v, want them as given", o)
	}
	if _, ok := o.omit["set-cookie"]; !ok || len(o.omit) != 1 {
		t.Errorf("OmitMetadata {Set-Cookie} normalizes to %v, want {set-cookie} (keys are case-insensitive)", o.omit)
	}
	attached := Idempotency{Store: store, Scope: SharedScope, AttachedHandler: true, DetachedMax: time.Minute}
	if o, err := attached.normalize(); err != nil || o.detachMax != 0 {
		t.Errorf("AttachedHandler: detached bound %v (%v), want 0: the handler runs on the caller's context", o.detachMax, err)
	}
	onlyOK := Idempotency{Store: store, Scope: SharedScope, UnstoredCodes: rescodes.Of(codes.OK)}
	if o, err := onlyOK.normalize(); err != nil || o.retryable != 0 {
		t.Errorf("UnstoredCodes of only OK: unstored %v (%v), want none: every outcome is stored", o.retryable, err)
	}
	some := Idempotency{Store: store, Scope: SharedScope, UnstoredCodes: rescodes.Of(codes.OK, codes.Aborted)}
	if o, err := some.normalize(); err != nil || o.retryable != rescodes.Of(codes.Aborted) {
		t.Errorf("UnstoredCodes {OK, ABORTED}: unstored %v (%v), want {ABORTED}: OK is always stored", o.retryable, err)
	}
}

// TestIdempotencyUnstoredCodesOverGRPC pins UnstoredCodes end to end: by
// default an UNAVAILABLE outcome is released, so the retry runs the handler
// again; with a set of only OK it is stored, and the retry receives it
// without the handler running.
func TestIdempotencyUnstoredCodesOverGRPC(t *testing.T) {
	tests := []struct {
		name      string
		unstored  rescodes.Set
		wantCalls int64
		wantCode  codes.Code
	}{
		{"default releases UNAVAILABLE", 0, 2, codes.OK},
		{"only OK stores every outcome", rescodes.Of(codes.OK), 1, codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store, err := idempotency.NewMemoryStore()
				if err != nil {
					t.Fatal(err)
				}
				e := &idemEcho{}
				e.fn = func(_ context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
					if e.calls.Load() == 1 {
						return nil, status.Error(codes.Unavailable, "first attempt fails")
					}
					return &echov1.EchoResponse{Message: req.Message}, nil
				}
				cc := idemStart(t, e, Idempotency{Store: store, UnstoredCodes: tt.unstored})
				ctx := idemCtx(t)
				wantCode(t, "first", idemDo(ctx, cc, "k", "m").err, codes.Unavailable, "first attempt fails")
				retry := idemDo(ctx, cc, "k", "m")
				wantCode(t, "retry", retry.err, tt.wantCode, "")
				if tt.wantCode != codes.OK && !wire.IdempotencyReplayed(retry.header) {
					t.Errorf("retry's header %v: not marked replayed", retry.header)
				}
				wantCalls(t, e, tt.wantCalls)
			})
		})
	}
}

func TestServerWithoutOptionsPassesThrough(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	h := func(context.Context, any) (any, error) { calls++; return &echov1.EchoResponse{}, nil }
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", "k"))
	for range 2 {
		if _, err := s.UnaryServerInterceptor()(ctx, &echov1.EchoRequest{}, &grpc.UnaryServerInfo{FullMethod: idemEchoMethod}, h); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 2 {
		t.Errorf("handler ran %d times without a store, want 2", calls)
	}
}

func TestIdempotencyKeyPolicyMostSpecificWins(t *testing.T) {
	s := &srvIdem{policies: map[string]KeyPolicy{
		"":                    KeyRequired,
		"pkg.Svc":             KeyIgnored,
		"/pkg.Svc/Create":     KeyOptional,
		"/other.Svc/Required": KeyRequired,
	}}
	tests := []struct {
		method string
		want   KeyPolicy
	}{
		{"/pkg.Svc/Create", KeyOptional},
		{"/pkg.Svc/Get", KeyIgnored},
		{"/other.Svc/Any", KeyRequired},
		{"/pkg.SvcX/Get", KeyRequired},
	}
	for _, tt := range tests {
		if got := s.policy(tt.method); got != tt.want {
			t.Errorf("policy(%q) = %v, want %v", tt.method, got, tt.want)
		}
	}
}

func TestIdempotencyKeyValidation(t *testing.T) {
	tests := []struct {
		name string
		vals []string
		ok   bool
		err  bool
	}{
		{"absent", nil, false, false},
		{"one character", []string{"a"}, true, false},
		{"255 printable", []string{strings.Repeat("~", 255)}, true, false},
		{"space and symbols", []string{" a-b_c:1/2 "}, true, false},
		{"empty", []string{""}, false, true},
		{"256 characters", []string{strings.Repeat("a", 256)}, false, true},
		{"DEL", []string{"a\x7f"}, false, true},
		{"tab", []string{"a\tb"}, false, true},
		{"UTF-8", []string{"é"}, false, true},
		{"two values", []string{"a", "a"}, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ok, err := srvIdemKey(tt.vals)
			if ok != tt.ok || (err != nil) != tt.err {
				t.Fatalf("srvIdemKey(%q) = %v, %v; want ok %v, error %v", tt.vals, ok, err, tt.ok, tt.err)
			}
			if err != nil && (status.Code(err) != codes.InvalidArgument || !errors.Is(err, ErrIdempotencyKeyInvalid)) {
				t.Errorf("srvIdemKey(%q) error = %v, want INVALID_ARGUMENT wrapping ErrIdempotencyKeyInvalid", tt.vals, err)
			}
		})
	}
}

func FuzzIdempotencyKey(f *testing.F) {
	for _, s := range []string{"", "a", "ключ", strings.Repeat("x", 256), "a\x00b", "order-123"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		k, ok, err := srvIdemKey([]string{key})
		if ok == (err != nil) {
			t.Fatalf("srvIdemKey(%q) = ok %v, error %v: want exactly one", key, ok, err)
		}
		if !ok {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("srvIdemKey(%q) code = %v, want INVALID_ARGUMENT", key, status.Code(err))
			}
			return
		}
		if k != key || len(k) < 1 || len(k) > 255 {
			t.Fatalf("srvIdemKey(%q) accepted a key of length %d", key, len(k))
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x20 || k[i] > 0x7e {
				t.Fatalf("srvIdemKey(%q) accepted byte %#x", key, k[i])
			}
		}
	})
}

func TestIdempotencyPeerScope(t *testing.T) {
	uri := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	withPeer := func(ai credentials.AuthInfo) context.Context {
		return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: ai})
	}
	tlsPeer := func(c *x509.Certificate) context.Context {
		return withPeer(credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{c}}}})
	}
	scope := func(c *x509.Certificate) string {
		s, err := PeerScope(tlsPeer(c))
		if err != nil {
			t.Fatalf("PeerScope(%v) error = %v", c, err)
		}
		return s
	}
	refused := []struct {
		name string
		ctx  context.Context
	}{
		{"no peer", context.Background()},
		{"TLS peer without a verified certificate", withPeer(credentials.TLSInfo{})},
		{"certificate without a Subject or SAN", tlsPeer(&x509.Certificate{RawIssuer: []byte("ca")})},
		{"certificate with an empty DER Subject, no SAN", tlsPeer(&x509.Certificate{RawIssuer: []byte("ca"), RawSubject: []byte{0x30, 0}})},
	}
	for _, tt := range refused {
		if s, err := PeerScope(tt.ctx); status.Code(err) != codes.Unauthenticated {
			t.Errorf("PeerScope(%s) = %q, %v, want UNAUTHENTICATED", tt.name, s, err)
		}
	}
	a := scope(&x509.Certificate{RawSubject: []byte("alice"), RawIssuer: []byte("ca")})
	if !strings.HasPrefix(a, "x509:") || len(a) != len("x509:")+64 {
		t.Errorf("scope of a verified certificate = %q, want x509: and 64 hex digits", a)
	}
	distinct := []struct {
		name string
		a, b *x509.Certificate
	}{
		{"subjects", &x509.Certificate{RawSubject: []byte("alice"), RawIssuer: []byte("ca")},
			&x509.Certificate{RawSubject: []byte("bob"), RawIssuer: []byte("ca")}},
		{"bytes moved between issuer and subject", &x509.Certificate{RawSubject: []byte("b"), RawIssuer: []byte("ca")},
			&x509.Certificate{RawSubject: []byte("ab"), RawIssuer: []byte("c")}},
		{"SPIFFE IDs", &x509.Certificate{RawIssuer: []byte("ca"), URIs: []*url.URL{uri("spiffe://example.org/ns/a/sa/x")}},
			&x509.Certificate{RawIssuer: []byte("ca"), URIs: []*url.URL{uri("spiffe://example.org/ns/a/sa/y")}}},
		{"DNS names", &x509.Certificate{RawIssuer: []byte("ca"), DNSNames: []string{"a.svc"}},
			&x509.Certificate{RawIssuer: []byte("ca"), DNSNames: []string{"b.svc"}}},
		{"a DNS name or an e-mail address with the same text", &x509.Certificate{RawIssuer: []byte("ca"), DNSNames: []string{"x"}},
			&x509.Certificate{RawIssuer: []byte("ca"), EmailAddresses: []string{"x"}}},
		{"SANs split differently", &x509.Certificate{RawIssuer: []byte("ca"), DNSNames: []string{"ab"}},
			&x509.Certificate{RawIssuer: []byte("ca"), DNSNames: []string{"a", "b"}}},
		{"IP addresses", &x509.Certificate{RawIssuer: []byte("ca"), IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)}},
			&x509.Certificate{RawIssuer: []byte("ca"), IPAddresses: []net.IP{net.IPv4(10, 0, 0, 2)}}},
	}
	for _, tt := range distinct {
		if scope(tt.a) == scope(tt.b) {
			t.Errorf("%s: two identities share scope %q", tt.name, scope(tt.a))
		}
	}
	// The order of the SANs in the certificate does not matter.
	x := &x509.Certificate{RawIssuer: []byte("ca"), DNSNames: []string{"a", "b"}}
	y := &x509.Certificate{RawIssuer: []byte("ca"), DNSNames: []string{"b", "a"}}
	if scope(x) != scope(y) {
		t.Errorf("SAN order changed the scope: %q != %q", scope(x), scope(y))
	}
}

func TestIdempotencyInterceptorDirectlyWithoutGRPCStream(t *testing.T) {
	// Called outside a grpc server (no transport stream), the interceptor
	// still records and replays the metadata the handler sets.
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(WithIdempotency(Idempotency{Store: store, Scope: SharedScope}))
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	h := func(ctx context.Context, req any) (any, error) {
		calls++
		if err := grpc.SetTrailer(ctx, metadata.Pairs("x-t", "v")); err != nil {
			return nil, err
		}
		return &echov1.EchoResponse{Message: req.(*echov1.EchoRequest).Message}, nil
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", "k"))
	info := &grpc.UnaryServerInfo{FullMethod: idemEchoMethod}
	for range 2 {
		resp, err := s.UnaryServerInterceptor()(ctx, &echov1.EchoRequest{Message: "m"}, info, h)
		if err != nil || resp.(*echov1.EchoResponse).Message != "m" {
			t.Fatalf("interceptor = %v, %v", resp, err)
		}
	}
	if calls != 1 {
		t.Errorf("handler ran %d times, want 1", calls)
	}
	if _, err := s.UnaryServerInterceptor()(ctx, "not a proto", info, h); status.Code(err) != codes.Internal {
		t.Errorf("non-proto request: code %v, want INTERNAL", status.Code(err))
	}
}

func TestIdempotencyHotPathAllocations(t *testing.T) {
	// A small store, filled below so that every first execution evicts the
	// oldest record: the steady state, where the store no longer grows. No
	// minimum retention, so that it may.
	store, err := idempotency.NewMemoryStore(idempotency.WithMaxEntries(256), idempotency.WithMinRetention(0))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(WithIdempotency(Idempotency{Store: store, Scope: SharedScope}))
	if err != nil {
		t.Fatal(err)
	}
	unary := s.UnaryServerInterceptor()
	resp := &echov1.EchoResponse{Message: "m"}
	h := func(context.Context, any) (any, error) { return resp, nil }
	info := &grpc.UnaryServerInfo{FullMethod: idemEchoMethod}
	req := &echov1.EchoRequest{Message: "m"}
	bg := context.Background()
	if a := testing.AllocsPerRun(100, func() { _, _ = unary(bg, req, info, h) }); a != 0 {
		t.Errorf("call without a key: %v allocations, want 0", a)
	}

	// First execution, each run with a new key: the key's value copy
	// (metadata.ValueFromIncomingContext), the caller's values without its
	// cancellation (context.WithoutCancel) and the detached handler context
	// over them (srvDetached), the handler's context with the capturing
	// stream, that stream with the record (srvOwned), and the marshalled
	// reply: 6. The store allocates nothing but, once per 256 claims, a
	// chunk of tokens; the flight, the request buffer and the lease's
	// renewal (its state, timer and the timer's function) are pooled.
	// Exact without the race detector; with it, sync.Pool drops items at
	// random, and a dropped renewal costs its three again.
	const runs = 100
	fresh := make([]context.Context, 1024+runs+1)
	for i := range fresh {
		fresh[i] = metadata.NewIncomingContext(bg, metadata.Pairs("idempotency-key", "first-"+strconv.Itoa(i)))
	}
	for _, ctx := range fresh[:1024] {
		if _, err := unary(ctx, req, info, h); err != nil {
			t.Fatal(err)
		}
	}
	i := 1024
	const first, maxFirstRace = 6, 7
	if a := testing.AllocsPerRun(runs, func() {
		if _, err := unary(fresh[i], req, info, h); err != nil {
			t.Fatal(err)
		}
		i++
	}); a != first && (!raceEnabled || a > maxFirstRace) {
		t.Errorf("first execution: %v allocations, want %d (at most %d with -race)", a, first, maxFirstRace)
	}

	// Replay: the key's value copy and the new reply (its string, of one
	// byte, is the runtime's own).
	keyed := metadata.NewIncomingContext(bg, metadata.Pairs("idempotency-key", "k"))
	if _, err := unary(keyed, req, info, h); err != nil {
		t.Fatal(err)
	}
	const replay, maxReplayRace = 2, 3
	if a := testing.AllocsPerRun(runs, func() { _, _ = unary(keyed, req, info, h) }); a != replay && (!raceEnabled || a > maxReplayRace) {
		t.Errorf("replay: %v allocations, want %d (at most %d with -race)", a, replay, maxReplayRace)
	}
}

func TestIdempotencyRefusesMetadataAfterHandlerReturns(t *testing.T) {
	store, unary := newMemoryIdempotency(t)
	info := &grpc.UnaryServerInfo{FullMethod: idemEchoMethod}
	req := &echov1.EchoRequest{Message: "m"}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", "late"))
	var kept context.Context
	h := func(ctx context.Context, _ any) (any, error) {
		kept = ctx
		if err := grpc.SetHeader(ctx, metadata.Pairs("x-in", "1")); err != nil {
			t.Errorf("SetHeader() in the handler error = %v", err)
		}
		return &echov1.EchoResponse{Message: "m"}, nil
	}
	if _, err := unary(ctx, req, info, h); err != nil {
		t.Fatal(err)
	}
	if err := grpc.SetHeader(kept, metadata.Pairs("x-late", "1")); err == nil {
		t.Error("SetHeader() after the handler returned: no error, want one")
	}
	if err := grpc.SetTrailer(kept, metadata.Pairs("x-late", "1")); err == nil {
		t.Error("SetTrailer() after the handler returned: no error, want one")
	}
	c, err := store.Claim(context.Background(), idempotency.RecordKey{FullMethod: idemEchoMethod, Key: "late"},
		func() []byte { fp, _ := srvFingerprint(req); return fp[:] }(), time.Minute)
	if err != nil || c.State != idempotency.Completed {
		t.Fatalf("Claim() = %v, %v, want Completed", c.State, err)
	}
	if got := c.Record.Header; len(got) != 1 || got.Get("x-in")[0] != "1" || c.Record.Trailer != nil {
		t.Errorf("stored header, trailer = %v, %v, want only x-in: 1", got, c.Record.Trailer)
	}
}

func TestIdempotencyReplayOfUnknownReplyTypeIsInternal(t *testing.T) {
	store, unary := newMemoryIdempotency(t)
	info := &grpc.UnaryServerInfo{FullMethod: idemEchoMethod}
	req := &echov1.EchoRequest{Message: "m"}
	fp, err := srvFingerprint(req)
	if err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, any) (any, error) {
		t.Error("handler ran for a stored outcome")
		return nil, nil
	}
	tests := []struct {
		name      string
		replyType string
		want      codes.Code
	}{
		{"unknown type", "no.such.Reply", codes.Internal},
		{"known type", "resilience.echo.v1.EchoResponse", codes.OK},
		{"known type, again", "resilience.echo.v1.EchoResponse", codes.OK}, // from the cache
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rk := idempotency.RecordKey{FullMethod: idemEchoMethod, Key: tt.name}
			c, err := store.Claim(context.Background(), rk, fp[:], time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			rec := &idempotency.Record{Fingerprint: fp[:], ReplyType: tt.replyType, Reply: []byte{0x0a, 0x01, 'r'}}
			if err := store.Complete(context.Background(), rk, c.Token, rec, time.Hour); err != nil {
				t.Fatal(err)
			}
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", tt.name))
			resp, err := unary(ctx, req, info, h)
			if got := status.Code(err); got != tt.want {
				t.Fatalf("replay error = %v, want code %v", err, tt.want)
			}
			if tt.want == codes.OK && resp.(*echov1.EchoResponse).GetMessage() != "r" {
				t.Errorf("replay = %v, want message r", resp)
			}
		})
	}
}

// newMemoryIdempotency returns a memory store and the unary interceptor of a
// Server that keeps its records there.
func newMemoryIdempotency(t *testing.T) (*idempotency.MemoryStore, grpc.UnaryServerInterceptor) {
	t.Helper()
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(WithIdempotency(Idempotency{Store: store, Scope: SharedScope}))
	if err != nil {
		t.Fatal(err)
	}
	return store, s.UnaryServerInterceptor()
}

// TestIdempotencyIsCopiedByWithIdempotency pins that the Server keeps
// copies of the map and slice of the Idempotency it was given: the caller
// may change KeyPolicies and OmitMetadata afterwards, even while calls run
// (go test -race checks that nothing reads them), and the Server goes on
// as configured: the method still requires a key, and x-t is still never
// stored.
func TestIdempotencyIsCopiedByWithIdempotency(t *testing.T) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	c := Idempotency{Store: store, Scope: SharedScope,
		KeyPolicies:  map[string]KeyPolicy{idemEchoMethod: KeyRequired},
		OmitMetadata: []string{"x-t"}}
	e := &idemEcho{}
	cc := idemStart(t, e, c)
	ctx := idemCtx(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			c.KeyPolicies[idemEchoMethod] = KeyIgnored
			c.KeyPolicies["/x.S/M"+strconv.Itoa(i)] = KeyOptional
			c.OmitMetadata[0] = "x-other"
		}
	}()
	for range 20 {
		wantCode(t, "keyless call", idemDo(ctx, cc, "", "m").err, codes.InvalidArgument, "")
	}
	<-done
	first := idemDo(ctx, cc, "k", "m")
	replay := idemDo(ctx, cc, "k", "m")
	wantCode(t, "first", first.err, codes.OK, "")
	wantCode(t, "replay", replay.err, codes.OK, "")
	if !wire.IdempotencyReplayed(replay.header) || len(replay.trailer.Get("x-t")) != 0 {
		t.Errorf("replay header %v, trailer %v: want replayed, without the omitted x-t", replay.header, replay.trailer)
	}
	wantCalls(t, e, 1)
}
