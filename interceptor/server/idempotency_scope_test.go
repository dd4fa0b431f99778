package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

var testSerial = big.NewInt(100)

// issue returns a leaf certificate of ca whose template tmpl sets the
// identity (Subject and SANs); the rest is filled in.
func (ca *testCA) issue(t *testing.T, tmpl x509.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	testSerial = new(big.Int).Add(testSerial, big.NewInt(1))
	tmpl.SerialNumber = testSerial
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// spiffeCert is a SPIFFE X.509-SVID as Istio and SPIRE issue them: an
// empty Subject and the workload's identity in a URI SAN.
func (ca *testCA) spiffeCert(t *testing.T, id string) tls.Certificate {
	t.Helper()
	u, err := url.Parse(id)
	if err != nil {
		t.Fatal(err)
	}
	return ca.issue(t, x509.Certificate{URIs: []*url.URL{u}})
}

// idemStartMTLS serves impl on a loopback TCP port with mutual TLS (client
// certificates of ca required and verified), behind a Server built from
// opts, and returns a function that dials it with a client certificate.
func idemStartMTLS(t *testing.T, ca *testCA, impl echov1.EchoServiceServer, opts ...Option) func(cert tls.Certificate) *grpc.ClientConn {
	t.Helper()
	s, err := New(opts...)
	if err != nil {
		t.Fatalf("New() error = %v", err)
	}
	serverCert := ca.issue(t, x509.Certificate{DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
	creds := credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{serverCert},
		ClientCAs:    ca.pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(creds), grpc.ChainUnaryInterceptor(idemRecover, s.UnaryServerInterceptor()))
	echov1.RegisterEchoServiceServer(gs, impl)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-served
	})
	return func(cert tls.Certificate) *grpc.ClientConn {
		cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{cert},
			RootCAs:      ca.pool,
			MinVersion:   tls.VersionTLS13,
		})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}
}

// TestIdempotencySPIFFEWorkloadsOfOneCADoNotShareRecords pins finding 2a of
// issue 14: two workloads whose certificates come from one CA, with an
// empty Subject and their identity in a URI SAN (SPIFFE), sending the same
// key and request, each run their own call; the second never receives the
// first's reply or metadata. The peer scope used to hash the issuer and the
// Subject only, so both shared one scope.
func TestIdempotencySPIFFEWorkloadsOfOneCADoNotShareRecords(t *testing.T) {
	ca := newTestCA(t)
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		p, _ := PeerScope(ctx)
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-owner", p))
		return &echov1.EchoResponse{Message: "reply for " + p}, nil
	}}
	dial := idemStartMTLS(t, ca, e, WithIdempotency(Idempotency{Store: store, Scope: PeerScope}))
	x := dial(ca.spiffeCert(t, "spiffe://example.org/ns/a/sa/x"))
	y := dial(ca.spiffeCert(t, "spiffe://example.org/ns/a/sa/y"))
	ctx := idemCtx(t)

	first := idemReply(t, idemDo(ctx, x, "order-1", "charge 10"))
	intruder := idemDo(ctx, y, "order-1", "charge 10")
	got := idemReply(t, intruder)
	if got.Message == first.Message {
		t.Errorf("workload y got workload x's reply %q", got.Message)
	}
	if v := intruder.header.Get("x-owner"); len(v) == 1 && "reply for "+v[0] == first.Message {
		t.Errorf("workload y got workload x's header x-owner %q", v[0])
	}
	wantCalls(t, e, 2)
	// x's own retry is still a replay.
	if again := idemReply(t, idemDo(ctx, x, "order-1", "charge 10")); again.Message != first.Message {
		t.Errorf("x's retry = %q, want its replay %q", again.Message, first.Message)
	}
	wantCalls(t, e, 2)
}

// TestIdempotencyPeerScopeRefusesCertificateWithoutIdentity: a verified
// certificate with neither a Subject nor a SAN names nobody; sharing a scope
// among all such workloads of a CA would be finding 2a again, so the keyed
// call is refused with UNAUTHENTICATED and the handler does not run.
func TestIdempotencyPeerScopeRefusesCertificateWithoutIdentity(t *testing.T) {
	ca := newTestCA(t)
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	e := &idemEcho{}
	dial := idemStartMTLS(t, ca, e, WithIdempotency(Idempotency{Store: store, Scope: PeerScope}))
	anon := dial(ca.issue(t, x509.Certificate{}))
	ctx := idemCtx(t)
	wantCode(t, "keyed call with an anonymous certificate", idemDo(ctx, anon, "k", "m").err, codes.Unauthenticated, "no identity")
	wantCalls(t, e, 0)
	// Calls without a key are not the scope's business.
	if r := idemDo(ctx, anon, "", "m"); r.err != nil {
		t.Errorf("call without a key: %v, want success", r.err)
	}
}

// TestIdempotencyPeerScopeRefusesCallerWithoutCertificate pins finding 2b of
// issue 14 for the peer scope: a caller without a verified certificate used
// to get the empty scope, shared by every such caller, so a second caller
// got the first one's reply, headers and trailers. Now its keyed call is
// refused with UNAUTHENTICATED.
func TestIdempotencyPeerScopeRefusesCallerWithoutCertificate(t *testing.T) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	e := &idemEcho{}
	cc := idemStart(t, e, Idempotency{Store: store, Scope: PeerScope})
	ctx := idemCtx(t)
	for range 2 {
		wantCode(t, "keyed call without a certificate", idemDo(ctx, cc, "k", "secret").err, codes.Unauthenticated, "verified client certificate")
	}
	wantCalls(t, e, 0)
}

// TestNewServerRequiresAnIdempotencyScope pins finding 2b of issue 14 for
// the configuration: a store without a scope used to mean a scope shared by
// every caller without a certificate (the README's own setup). New now
// asks for a choice, and says which are there.
func TestNewServerRequiresAnIdempotencyScope(t *testing.T) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(WithIdempotency(Idempotency{Store: store}))
	if err == nil || !strings.Contains(err.Error(), "Idempotency.Scope is nil") ||
		!strings.Contains(err.Error(), "server.PeerScope") || !strings.Contains(err.Error(), "server.SharedScope") {
		t.Errorf("New(WithIdempotency(Idempotency{Store: store})) error = %v, want one naming Idempotency.Scope, server.PeerScope and server.SharedScope", err)
	}
	for _, scope := range []func(context.Context) (string, error){SharedScope, PeerScope} {
		if _, err := New(WithIdempotency(Idempotency{Store: store, Scope: scope})); err != nil {
			t.Errorf("New with a scope: %v, want none", err)
		}
	}
}

// TestNewServerRefusesANilStore pins a nil Idempotency.Store (item 4 of
// issue 24): a nil store silently turned idempotency off, and a nil
// *MemoryStore (a constructor's error dropped) panicked on the first keyed
// call. New now refuses both, saying what is wrong.
func TestNewServerRefusesANilStore(t *testing.T) {
	tests := []struct {
		name  string
		store idempotency.Store
		want  string
	}{
		{"nil", nil, "server: Idempotency.Store is nil: the store must not be nil"},
		{"nil pointer", (*idempotency.MemoryStore)(nil), "server: Idempotency.Store is a nil *idempotency.MemoryStore: the store must not be nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(WithIdempotency(Idempotency{Store: tt.store, Scope: SharedScope}))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New(WithIdempotency(Idempotency{Store: %#v})) = %v, %v; want an error containing %q", tt.store, s, err, tt.want)
			}
		})
	}
}

// TestIdempotencyOmitMetadataNeverReplayed: the metadata keys the server
// names are neither stored nor replayed; the first caller still gets them,
// and the rest of the metadata is replayed.
func TestIdempotencyOmitMetadataNeverReplayed(t *testing.T) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-h", "kept", "Set-Cookie", "session=1"))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-t", "kept", "x-debug-bin", "\x01"))
		return &echov1.EchoResponse{Message: req.Message}, nil
	}}
	cc := idemStart(t, e, Idempotency{
		Store:        store,
		Scope:        SharedScope,
		OmitMetadata: []string{"set-cookie", "X-Debug-Bin"},
	})
	ctx := idemCtx(t)
	first := idemDo(ctx, cc, "k", "m")
	dup := idemDo(ctx, cc, "k", "m")
	wantCalls(t, e, 1)
	if got := first.header.Get("set-cookie"); len(got) != 1 {
		t.Errorf("first call's header set-cookie = %q, want the handler's", got)
	}
	if got := dup.header.Get("set-cookie"); len(got) != 0 {
		t.Errorf("replayed header set-cookie = %q, want none", got)
	}
	if got := dup.trailer.Get("x-debug-bin"); len(got) != 0 {
		t.Errorf("replayed trailer x-debug-bin = %q, want none", got)
	}
	if dup.header.Get("x-h")[0] != "kept" || dup.trailer.Get("x-t")[0] != "kept" {
		t.Errorf("replay lost x-h or x-t: header %v trailer %v", dup.header, dup.trailer)
	}
	if _, err := New(WithIdempotency(Idempotency{Store: store, Scope: SharedScope, OmitMetadata: []string{"Bad Key"}})); err == nil ||
		!strings.Contains(err.Error(), "Idempotency.OmitMetadata") {
		t.Errorf(`OmitMetadata "Bad Key": error %v, want one naming Idempotency.OmitMetadata`, err)
	}
}
