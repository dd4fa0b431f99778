package main

import (
	"context"
	"net"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// peerIPScope scopes idempotency keys by the caller's IP address, without
// the port, so that a retry on a new connection finds its record. Callers
// on one host, or behind one NAT or proxy, share a scope.
func peerIPScope(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "", status.Error(codes.Unauthenticated, "idempotency: no peer address to scope the key")
	}
	if tcp, ok := p.Addr.(*net.TCPAddr); ok {
		return "ip:" + tcp.IP.String(), nil
	}
	host, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		return "", status.Error(codes.Unauthenticated, "idempotency: no peer IP address to scope the key")
	}
	return "ip:" + host, nil
}

// metadataScope scopes idempotency keys by the value of a request header,
// which an authenticating proxy must set.
func metadataScope(key string) func(context.Context) (string, error) {
	missing := status.Errorf(codes.Unauthenticated, "idempotency: a keyed call needs the %s header to scope its key", key)
	return func(ctx context.Context) (string, error) {
		vs := metadata.ValueFromIncomingContext(ctx, key)
		if len(vs) != 1 || vs[0] == "" {
			return "", missing
		}
		return "md:" + vs[0], nil
	}
}
