package wire

import (
	"fmt"

	"google.golang.org/grpc/metadata"
)

// IdempotencyKeyHeader is the metadata key that carries an idempotency key:
// 1 to 255 printable ASCII characters, the same on every attempt of one
// logical call. A server with idempotency (package interceptor/server,
// server.WithIdempotency) executes a call with a given key once per caller
// scope and method, and replays its outcome to every duplicate. A Client
// of package interceptor sets it (WithIdempotencyKeys,
// ContextWithIdempotencyKey).
const IdempotencyKeyHeader = "idempotency-key"

// ValidIdempotencyKey reports why key is not a valid idempotency key, or nil:
// it must be 1 to 255 printable ASCII characters (0x20 to 0x7E).
func ValidIdempotencyKey(key string) error {
	if len(key) == 0 || len(key) > 255 {
		return fmt.Errorf("idempotency-key is %d bytes long; it must be 1 to 255 printable ASCII characters", len(key))
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("idempotency-key has byte %#02x at offset %d; it must be 1 to 255 printable ASCII characters (0x20-0x7E)", c, i)
		}
	}
	return nil
}

// IdempotencyReplayedHeader is the response header that the server's
// idempotency (server.WithIdempotency) sets, with the value
// "true", on every answer for which the handler did not run: a replay of a
// stored outcome (reply or status), and the outcome of a running execution
// that a concurrent duplicate waited for (coalesced). An answer of a
// handler run never carries it: the interceptor drops it from the header
// and trailer metadata that a keyed call's handler sets (a gateway passing
// on a downstream server's headers), from what is sent and what is stored.
// (A call without a key runs its handler plainly: what it sets passes as
// is.) It is the gRPC form of Stripe's Idempotent-Replayed; read it with
// IdempotencyReplayed.
const IdempotencyReplayedHeader = "idempotency-replayed"

// IdempotencyReplayed reports whether header, the response header metadata
// of a call (as grpc.Header fills it), marks the answer as a replay: the
// server had already run the call with this idempotency key, for this
// caller's scope, method and request, and answered with its outcome rather
// than running the handler again. With the client's retries, header is the
// last attempt's, the one whose answer the call returned.
//
//	var header metadata.MD
//	reply, err := orders.Create(ctx, req, grpc.Header(&header))
//	if wire.IdempotencyReplayed(header) { ... } // created by an earlier attempt
//
// A Client of package interceptor with WithMeterProvider also counts the
// attempts answered by a replay (resilience.client.idempotency.replays).
func IdempotencyReplayed(header metadata.MD) bool {
	vs := header[IdempotencyReplayedHeader]
	return len(vs) == 1 && vs[0] == "true"
}
