package interceptor

import "google.golang.org/grpc/metadata"

// IdempotencyReplayedHeader is the response header that the server's
// idempotency (NewServer with WithIdempotencyStore) sets, with the value
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
//	if interceptor.IdempotencyReplayed(header) { ... } // created by an earlier attempt
//
// A client with WithMeterProvider also counts the attempts answered by a
// replay (resilience.client.idempotency.replays).
func IdempotencyReplayed(header metadata.MD) bool {
	vs := header[IdempotencyReplayedHeader]
	return len(vs) == 1 && vs[0] == "true"
}

// idemReplayedMD is the header of a replayed answer.
var idemReplayedMD = metadata.MD{IdempotencyReplayedHeader: {"true"}}
