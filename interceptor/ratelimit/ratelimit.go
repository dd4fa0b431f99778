// Package ratelimit is what a server's distributed rate limits need of the
// store that shares them among replicas: the interfaces Store and Limiter,
// which package redisquota implements on Redis. The server
// (server.Limits.Quota) asks the Store for one Limiter per distributed
// limit of its document (serviceconfig.RateLimit with Distributed set) and
// decides each call by it; the local limits need no store.
//
// It is a leaf, as package idempotency is for the idempotency stores: the
// server imports it, not the store, so a server that shares no limit does
// not link a Redis client.
package ratelimit

import (
	"context"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Store shares rate limits among the replicas of a server.
type Store interface {
	// RateLimiter returns this replica's side of the distributed limit r,
	// which the server's document declares (r.Name identifies it among
	// the replicas: replicas that give a limit the same name share it).
	// The server calls it once per limit, from server.New, and returns
	// its error, naming the limit.
	RateLimiter(r serviceconfig.RateLimit) (Limiter, error)
}

// Limiter is one distributed rate limit of one replica. Its methods are
// called on every call the limit applies to, concurrently.
type Limiter interface {
	// Allow decides a call of criticality c for key, bounded by ctx (the
	// caller's context): an error is ctx's, when it ended before the
	// decision.
	Allow(ctx context.Context, key string, c wire.Criticality) (Decision, error)
	// Refund gives back the token of a call Allow admitted and that did
	// not run (another limit, or the server's concurrency limit, refused
	// it).
	Refund(key string)
}

// Decision is a Limiter's decision on one call.
type Decision struct {
	// OK: admitted.
	OK bool
	// Wait is, for a refused call, how long until the limit expects to
	// admit one: the server's answer tells the caller to come back then.
	Wait time.Duration
	// Fallback: decided while the store was unreachable, by the limit's
	// fallback.
	Fallback bool
}
