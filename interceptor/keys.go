package interceptor

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/grpc-resilience/resilience/interceptor/wire"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

type idempotencyKeyCtxKey struct{}

// ContextWithIdempotencyKey makes key the idempotency key of the calls made
// with ctx, whatever their method: the caller's own key (an order number, a
// request ID) in place of a random one. A key that is not 1 to 255
// printable ASCII characters fails the call with INVALID_ARGUMENT before it
// is sent.
func ContextWithIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, idempotencyKeyCtxKey{}, key)
}

// IdempotencyKeyFromContext returns the key set by ContextWithIdempotencyKey.
func IdempotencyKeyFromContext(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(idempotencyKeyCtxKey{}).(string)
	return k, ok
}

// newIdempotencyKey returns 128 random bits in hex.
func newIdempotencyKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return hex.EncodeToString(b[:])
}

// withIdempotencyKey returns ctx with the call's idempotency key in its
// outgoing metadata, and whether the call is keyed: the caller's key from
// the context, a key already in the outgoing metadata, or a fresh one when
// generate is set (a unary call of a keyed method). A stream never gets a
// fresh key: a server's idempotency applies to unary calls only and runs a
// stream once per call, whatever its key, so a key made for it would do
// nothing but look as if it protected the stream.
func withIdempotencyKey(ctx context.Context, generate bool) (context.Context, bool, error) {
	if key, ok := IdempotencyKeyFromContext(ctx); ok {
		if err := wire.ValidIdempotencyKey(key); err != nil {
			return ctx, false, status.Error(codes.InvalidArgument, "resilience: "+err.Error())
		}
		if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(wire.IdempotencyKeyHeader)) > 0 {
			return ctx, true, nil
		}
		return metadata.AppendToOutgoingContext(ctx, wire.IdempotencyKeyHeader, key), true, nil
	}
	if !generate {
		return ctx, false, nil
	}
	if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(wire.IdempotencyKeyHeader)) > 0 {
		return ctx, true, nil
	}
	return metadata.AppendToOutgoingContext(ctx, wire.IdempotencyKeyHeader, newIdempotencyKey()), true, nil
}
