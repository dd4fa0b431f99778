package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/server"
)

// scopeChoice is the idempotency scope that -scope names.
type scopeChoice struct {
	scope  func(context.Context) (string, error) // server.Idempotency.Scope
	shared bool                                  // one scope for every caller: the store's quota is its whole bounds
	desc   string                                // what the server prints at startup
}

// parseScope returns the idempotency scope named by -scope: none (the
// default: keyed calls are refused), mtls (the verified client
// certificate; mtls says whether the server verifies them), metadata:<key>
// or shared.
func parseScope(s string, mtls bool) (scopeChoice, error) {
	switch {
	case s == "none":
		return scopeChoice{scope: noScope,
			desc: "none: keyed calls are refused (choose -scope mtls, metadata:<key> or shared)"}, nil
	case s == "mtls":
		if !mtls {
			return scopeChoice{}, errors.New("-scope mtls: the server must verify client certificates: give -tls-cert, -tls-key and -tls-client-ca")
		}
		return scopeChoice{scope: server.PeerScope,
			desc: "mtls: each client certificate's identity (issuer, subject, SANs)"}, nil
	case s == "shared":
		return scopeChoice{scope: server.SharedScope, shared: true,
			desc: "shared: one scope for every caller, whose keys must be unguessable"}, nil
	case strings.HasPrefix(s, "metadata:"):
		key := strings.ToLower(strings.TrimPrefix(s, "metadata:"))
		if !validMetadataKey(key) || strings.HasPrefix(key, "grpc-") || strings.HasSuffix(key, "-bin") {
			return scopeChoice{}, fmt.Errorf("-scope %q: want metadata:<key> with a text header that is not grpc-*", s)
		}
		if callerBlind[key] {
			return scopeChoice{}, fmt.Errorf("-scope %q: grpc sets %s on every call, the same for many callers; "+
				"name the header your authenticating proxy sets", s, key)
		}
		return scopeChoice{scope: metadataScope(key),
			desc: "metadata:" + key + ": the principal an authenticating proxy sets in that header"}, nil
	default:
		return scopeChoice{}, fmt.Errorf("-scope %q: want none, mtls, metadata:<key> or shared", s)
	}
}

// callerBlind are headers that grpc or HTTP/2 fill for every call, which
// name a host or a client library rather than a caller: a scope by one of
// them would be one scope for many callers.
var callerBlind = map[string]bool{"content-type": true, "user-agent": true, "te": true, "host": true}

// validMetadataKey reports whether k is a gRPC metadata key: lower-case
// letters, digits, '-', '_' and '.'. Pseudo-headers such as :authority,
// which grpc-go puts in the incoming metadata too, are not.
func validMetadataKey(k string) bool {
	if k == "" {
		return false
	}
	for _, c := range []byte(k) {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// errNoScope is the answer to a keyed call when the server was started
// without a scope choice.
var errNoScope = status.Error(codes.FailedPrecondition,
	"idempotency: this server was started without an idempotency scope, so it refuses keyed calls; "+
		"start it with -scope mtls, -scope metadata:<header> or -scope shared (go doc ./examples/server)")

// noScope is the scope function of -scope none: it refuses every keyed
// call, since records shared by callers who did not choose to share them
// would hand one caller's reply to another.
func noScope(context.Context) (string, error) { return "", errNoScope }

// metadataScope scopes idempotency keys by the value of a request header,
// which an authenticating proxy must set (stripping the one a caller sent).
func metadataScope(key string) func(context.Context) (string, error) {
	missing := status.Errorf(codes.Unauthenticated, "idempotency: a keyed call needs the %s header to scope its key", key)
	return func(ctx context.Context) (string, error) {
		vs := metadata.ValueFromIncomingContext(ctx, key)
		if len(vs) != 1 || vs[0] == "" {
			return "", missing
		}
		if len(vs[0]) > maxScopeLen {
			sum := sha256.Sum256([]byte(vs[0]))
			return "md#" + hex.EncodeToString(sum[:]), nil
		}
		return "md:" + vs[0], nil
	}
}

// maxScopeLen bounds the scope that a header names as it is stored with
// every record: a longer value (an XFCC header with a whole certificate,
// or a caller padding its header to fill the store) is stored as its
// SHA-256, 67 bytes, which still names one caller.
const maxScopeLen = 128

// transportCreds returns the server's TLS credentials from -tls-cert,
// -tls-key and -tls-client-ca (which makes it require and verify client
// certificates: mTLS), as grpc.Server options; none when no flag is given
// (plaintext).
func (c *config) transportCreds() ([]grpc.ServerOption, error) {
	if c.tlsCert == "" && c.tlsKey == "" && c.tlsClientCA == "" {
		return nil, nil
	}
	if c.tlsCert == "" || c.tlsKey == "" {
		return nil, errors.New("-tls-cert and -tls-key: give both, the server's certificate and its key")
	}
	cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
	if err != nil {
		return nil, fmt.Errorf("-tls-cert, -tls-key: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.tlsClientCA != "" {
		pem, err := os.ReadFile(c.tlsClientCA)
		if err != nil {
			return nil, fmt.Errorf("-tls-client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-tls-client-ca %s: no PEM certificate in it", c.tlsClientCA)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(cfg))}, nil
}
