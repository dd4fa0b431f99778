// Package wire holds what the client (package interceptor) and the server
// (package interceptor/server) of grpc-resilience agree on over the wire:
// the metadata keys each side sends and reads, the request criticality that
// a client sets and a server sheds by, the form of an idempotency key, and
// the marks a server puts on a context for the clients inside its
// handlers. Both sides import it; it imports neither.
//
// The metadata keys:
//
//	idempotency-key            (IdempotencyKeyHeader)      client → server
//	idempotency-replayed       (IdempotencyReplayedHeader) server → client, response header
//	resilience-criticality     (CriticalityKey)            client → server
//	resilience-caller-retries  (CallerRetriesKey)          client → server
//
// A server that does not run this library can still take part: it reads
// and writes the same keys.
package wire
