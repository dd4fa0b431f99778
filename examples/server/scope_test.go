package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// syncBuffer is a bytes.Buffer for a writer and a reader on two goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServer runs the server in process with args (on a free loopback
// port, without /metrics) until the test ends, and returns its address and
// its log.
func startServer(t *testing.T, args ...string) (addr string, log *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, w := io.Pipe()
	log = &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-addr", "127.0.0.1:0", "-metrics-addr", ""}, args...), w, log)
		w.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run() = %v", err)
		}
	})
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "grpc listening on "); ok {
			go func() { _, _ = io.Copy(io.Discard, out) }()
			return a, log
		}
	}
	t.Fatalf("the server stopped before listening; log:\n%s", log.String())
	return "", nil
}

// keyedEcho calls Echo on cc with an idempotency key and the extra
// metadata pairs kv.
func keyedEcho(t *testing.T, cc *grpc.ClientConn, key, msg string, kv ...string) (*echov1.EchoResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, append(kv, wire.IdempotencyKeyHeader, key)...)
	return echov1.NewEchoServiceClient(cc).Echo(ctx, &echov1.EchoRequest{Message: msg})
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// TestDefaultScopeRefusesKeyedCalls pins item 6 of issue 21: the example
// server's default scope was the caller's IP, one scope for every caller
// behind a NAT, load balancer, ingress or sidecar (and for every process on
// a host): a second caller sending the same key got the first caller's
// reply. With no -scope, keyed calls are now refused with
// FAILED_PRECONDITION naming the flag, plain calls are served, and the
// server says at startup which scope it runs with.
func TestDefaultScopeRefusesKeyedCalls(t *testing.T) {
	addr, log := startServer(t)
	alice, mallory := dial(t, addr, insecure.NewCredentials()), dial(t, addr, insecure.NewCredentials())
	if r, err := keyedEcho(t, alice, "order-42", "alice's order"); err == nil {
		if r2, err := keyedEcho(t, mallory, "order-42", "alice's order"); err == nil {
			t.Fatalf("keyed calls on the default scope: alice got %q, another caller with her key got %q; want both refused", r.GetMessage(), r2.GetMessage())
		}
	} else if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "-scope") {
		t.Fatalf("keyed call on the default scope = %v, want FAILED_PRECONDITION naming -scope", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := echov1.NewEchoServiceClient(alice).Echo(ctx, &echov1.EchoRequest{Message: "plain"}); err != nil {
		t.Errorf("a call without a key = %v, want it served", err)
	}
	if !strings.Contains(log.String(), `scope="none: keyed calls are refused`) {
		t.Errorf("startup log %q does not say which scope the server runs with", log.String())
	}
}

// TestMTLSScope: with -scope mtls, each client certificate is its own
// scope: a caller replays its own calls and never receives another's.
func TestMTLSScope(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	ca.writeLeaf(t, dir, "server", "127.0.0.1")
	ca.writeLeaf(t, dir, "alice", "")
	ca.writeLeaf(t, dir, "bob", "")
	addr, log := startServer(t, "-scope", "mtls", "-tls-cert", filepath.Join(dir, "server.pem"),
		"-tls-key", filepath.Join(dir, "server.key"), "-tls-client-ca", filepath.Join(dir, "ca.pem"))
	client := func(name string) *grpc.ClientConn {
		cert, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		return dial(t, addr, credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.pool}))
	}
	alice, bob := client("alice"), client("bob")
	if _, err := keyedEcho(t, alice, "k", "alice"); err != nil {
		t.Fatal(err)
	}
	if r, err := keyedEcho(t, alice, "k", "alice"); err != nil || r.GetMessage() != "alice" {
		t.Errorf("alice's duplicate = %v, %v; want her reply", r, err)
	}
	if r, err := keyedEcho(t, bob, "k", "bob"); err != nil || r.GetMessage() != "bob" {
		t.Errorf("bob with alice's key = %v, %v; want his own call run", r, err)
	}
	if !strings.Contains(log.String(), `scope="mtls:`) {
		t.Errorf("startup log %q does not name the mtls scope", log.String())
	}
}

// TestScopeFlagErrors: the scope and TLS flags say what is wrong.
func TestScopeFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-scope", "peer"}, `-scope "peer": want none, mtls, metadata:<key> or shared`},
		{[]string{"-scope", "mtls"}, `-scope mtls: the server must verify client certificates: give -tls-cert, -tls-key and -tls-client-ca`},
		{[]string{"-tls-cert", "x.pem"}, `-tls-cert and -tls-key: give both, the server's certificate and its key`},
	}
	for _, tt := range tests {
		err := run(context.Background(), append([]string{"-addr", "127.0.0.1:0", "-metrics-addr", ""}, tt.args...), io.Discard, io.Discard)
		if err == nil || err.Error() != tt.want {
			t.Errorf("run(%q) = %v, want %s", tt.args, err, tt.want)
		}
	}
}

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	der  []byte
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
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
	return &testCA{cert: cert, key: key, pool: pool, der: der}
}

var testSerial = big.NewInt(100)

// writeLeaf writes name.pem and name.key, a certificate of ca for the
// subject name (and the IP address ip, when given), and ca.pem, to dir.
func (ca *testCA) writeLeaf(t *testing.T, dir, name, ip string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	testSerial = new(big.Int).Add(testSerial, big.NewInt(1))
	tmpl := &x509.Certificate{SerialNumber: testSerial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}
	if ip != "" {
		tmpl.IPAddresses = []net.IP{net.ParseIP(ip)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(file, typ string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, file), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(name+".pem", "CERTIFICATE", der)
	write(name+".key", "EC PRIVATE KEY", kder)
	write("ca.pem", "CERTIFICATE", ca.der)
}

// TestMetadataScopeRefusesHeadersThatNameNoCaller pins -scope
// metadata:<key> against headers that grpc itself fills for every call:
// metadata::authority (grpc-go puts the :authority pseudo-header in the
// incoming metadata) was accepted, and then every caller of the server's
// host name was one scope, reading every other's replies, with none of the
// explicit choice or quota of -scope shared; user-agent made one scope per
// client library. Such keys, and any that is not a valid metadata key, are
// now refused at startup.
func TestMetadataScopeRefusesHeadersThatNameNoCaller(t *testing.T) {
	for _, key := range []string{":authority", "user-agent", "content-type", "te", "x principal", "x-tenant\n"} {
		if _, err := parseScope("metadata:"+key, false); err == nil || !strings.Contains(err.Error(), "-scope") {
			t.Errorf("-scope metadata:%q = %v, want an error naming -scope", key, err)
		}
	}
	if _, err := parseScope("metadata:X-Tenant", false); err != nil { // case does not matter
		t.Errorf("-scope metadata:X-Tenant = %v, want it accepted", err)
	}
}

// TestMetadataScopeBoundsLongValues pins the scope's length: a header of
// several KiB (a caller padding it to fill the store, or an XFCC header
// with a whole certificate) becomes a 67-byte scope that still tells
// callers apart.
func TestMetadataScopeBoundsLongValues(t *testing.T) {
	scope := metadataScope("x-tenant")
	in := func(v string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-tenant", v))
	}
	long := strings.Repeat("a", 8<<10)
	a, err := scope(in(long))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := scope(in(long[1:] + "b"))
	again, _ := scope(in(long))
	short, _ := scope(in("tenant-1"))
	switch {
	case len(a) > 2*maxScopeLen:
		t.Errorf("scope of an 8 KiB header is %d bytes, want at most %d", len(a), 2*maxScopeLen)
	case a == b:
		t.Errorf("two different long headers share the scope %q", a)
	case a != again:
		t.Errorf("one header gave two scopes: %q, %q", a, again)
	case short != "md:tenant-1":
		t.Errorf("short header's scope = %q, want md:tenant-1", short)
	}
}
