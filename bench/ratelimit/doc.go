// Package ratelimit measures the rate limits of grpc-resilience side by
// side with their peers, in real time.
//
// The local decision (go test -bench . -count 5 ./ratelimit): one
// decision, admitted, with the clock read per decision as a server does,
// on one key and on 10,000 keys in turn, through
//
//   - ours: internal/ratelimit's Limiter (GCRA, one bucket per key,
//     lock-free);
//   - golang.org/x/time/rate: one *rate.Limiter, and for many keys one per
//     key in a sync.Map (the usual pattern: x/time/rate has no keys);
//   - failsafe-go's ratelimiter (smooth, the GCRA-like one): one, and one
//     per key in a sync.Map.
//
// Each benchmark reports ns/op (wall), cpu-ns/op (the process's CPU time
// per decision: on a machine whose cores other work shares, wall time
// includes the waits for a core) and allocations.
//
// The admitted rate (go run ./ratelimit/cmd/ratelimit): calls offered at
// 3× the configured rate for 10 s of real time, from several goroutines;
// the admitted rate against the configured one, over several runs
// (min/median/max).
//
// The client's pacing (go run ./ratelimit/cmd/pacing, RunPacing): a server
// admitting one call per 100ms and refusing the others with RetryInfo,
// called by 8 goroutines every 5ms through a client that retries
// RESOURCE_EXHAUSTED, with and without a rateLimit block: the attempts the
// server refuses per pushback period.
package ratelimit
