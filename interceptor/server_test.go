//go:build splittodo

// A server test (it reaches the server's internals): to be moved to
// interceptor/server by its owner; excluded from the client package meanwhile.

package interceptor

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
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

func TestNewServerRejectsBadOptions(t *testing.T) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	withStore := func(opts ...ServerOption) []ServerOption {
		return append([]ServerOption{WithIdempotencyStore(store), WithIdempotencySharedScope()}, opts...)
	}
	tests := []struct {
		name string
		opts []ServerOption
		want string
	}{
		{"nil option", []ServerOption{nil}, "nil ServerOption"},
		{"nil scope", withStore(WithIdempotencyScope(nil)), "WithIdempotencyScope(nil)"},
		{"zero TTL", withStore(WithIdempotencyTTL(0)), "WithIdempotencyTTL(0s)"},
		{"sub-millisecond lease", withStore(WithIdempotencyLease(time.Microsecond)), "WithIdempotencyLease(1µs)"},
		{"negative pushback", withStore(WithIdempotencyPushback(-time.Second)), "WithIdempotencyPushback(-1s)"},
		{"poll max below initial", withStore(WithIdempotencyPoll(time.Second, time.Millisecond)), "WithIdempotencyPoll(1s, 1ms)"},
		{"bad full method", withStore(WithIdempotencyKeyPolicy("/svc", IdempotencyKeyRequired)), `WithIdempotencyKeyPolicy("/svc")`},
		{"service with slash", withStore(WithIdempotencyKeyPolicy("a/b", IdempotencyKeyRequired)), `WithIdempotencyKeyPolicy("a/b")`},
		{"unknown policy", withStore(WithIdempotencyKeyPolicy("", 7)), "unknown policy 7"},
		{"policy without store", []ServerOption{WithIdempotencyKeyPolicy("", IdempotencyKeyRequired)}, "needs WithIdempotencyStore"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewServer(tt.opts...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewServer() error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestServerWithoutOptionsPassesThrough(t *testing.T) {
	s, err := NewServer()
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
	s := &srvIdem{policies: map[string]IdempotencyKeyPolicy{
		"":                    IdempotencyKeyRequired,
		"pkg.Svc":             IdempotencyKeyIgnored,
		"/pkg.Svc/Create":     IdempotencyKeyOptional,
		"/other.Svc/Required": IdempotencyKeyRequired,
	}}
	tests := []struct {
		method string
		want   IdempotencyKeyPolicy
	}{
		{"/pkg.Svc/Create", IdempotencyKeyOptional},
		{"/pkg.Svc/Get", IdempotencyKeyIgnored},
		{"/other.Svc/Any", IdempotencyKeyRequired},
		{"/pkg.SvcX/Get", IdempotencyKeyRequired},
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
		s, err := IdempotencyPeerScope(tlsPeer(c))
		if err != nil {
			t.Fatalf("IdempotencyPeerScope(%v) error = %v", c, err)
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
		if s, err := IdempotencyPeerScope(tt.ctx); status.Code(err) != codes.Unauthenticated {
			t.Errorf("IdempotencyPeerScope(%s) = %q, %v, want UNAUTHENTICATED", tt.name, s, err)
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
	s, err := NewServer(WithIdempotencyStore(store), WithIdempotencySharedScope())
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
	s, err := NewServer(WithIdempotencyStore(store), WithIdempotencySharedScope())
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
	// (metadata.ValueFromIncomingContext), the handler's context with the
	// capturing stream, that stream with the record, and the marshalled
	// reply. The store allocates nothing but, once per 256 claims, a chunk
	// of tokens; the flight and the request buffer are recycled.
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
	// Three more since the lease follows the handler: the renewal, its
	// timer and the timer's function.
	const maxFirst = 7
	if a := testing.AllocsPerRun(runs, func() {
		if _, err := unary(fresh[i], req, info, h); err != nil {
			t.Fatal(err)
		}
		i++
	}); a > maxFirst {
		t.Errorf("first execution: %v allocations, want at most %d", a, maxFirst)
	}

	// Replay: the key's value copy, the new reply and its string.
	keyed := metadata.NewIncomingContext(bg, metadata.Pairs("idempotency-key", "k"))
	if _, err := unary(keyed, req, info, h); err != nil {
		t.Fatal(err)
	}
	const maxReplay = 3
	if a := testing.AllocsPerRun(runs, func() { _, _ = unary(keyed, req, info, h) }); a > maxReplay {
		t.Errorf("replay: %v allocations, want at most %d", a, maxReplay)
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
	s, err := NewServer(WithIdempotencyStore(store), WithIdempotencySharedScope())
	if err != nil {
		t.Fatal(err)
	}
	return store, s.UnaryServerInterceptor()
}
