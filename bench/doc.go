// Package bench compares grpc-resilience with its peers side by side in one
// process. It is a separate module, so the library's go.mod never gains a
// peer dependency.
//
// Run the whole comparison, print its markdown tables and write
// BENCHMARKS.md (under 5 minutes on 2 cores at the default size):
//
//	cd bench && go run ./cmd/compare
//
// # What runs
//
// Every scenario drives real gRPC (bufconn, and loopback TCP for the success
// path) against one shared echo server (proto/resilience/echo/v1) whose
// behaviour the scenario scripts per attempt, deterministically (seeded
// draws per call and attempt), and counts attempts on the server. The same
// workload runs through each peer, configured with one policy
// ([DefaultPolicy]) as closely as each can express it:
//
//   - bare: no interceptor, grpc.WithDisableRetry();
//   - grpc-go's built-in retry (service config), with and without
//     retryThrottling;
//   - go-grpc-middleware v2 retry;
//   - failsafe-go through failsafegrpc: retry; retry + circuit breaker +
//     bulkhead; a fixed-delay hedge policy;
//   - sony/gobreaker v2 around the go-grpc-middleware retry;
//   - ours: interceptor.NewClient with a service config (retry, retry
//     budget, breaker and bulkhead per method; hedgingPolicy in the hedging
//     scenario).
//
// Where a peer cannot express a scenario (failsafegrpc has no stream
// interceptor, grpc-go and go-grpc-middleware do not hedge), its row says
// so in parentheses; no number is ever made up for it.
//
// # Measuring on a noisy machine
//
// Cells are ratios against the bare call or counts, never absolute times.
// Every call carries a deadline, as real calls do: a deadline changes what
// grpc and the peers allocate and do (a context with a timer, the
// grpc-timeout header), so a benchmark without one measures a call nobody
// makes.
// Success-path time is measured in alternating blocks of 20 calls (bare,
// peer, then peer, bare, ...) and the cell is the median of the blocks'
// ratios, so a burst of load elsewhere spoils a few blocks, not the
// result. Allocations are counted with runtime.MemStats over sequential
// calls, the bare call's subtracted. Failure scenarios count attempts on the
// server and successes on the client; only the recovery time is in
// milliseconds, and it is set by the breakers' open time, not by the
// machine's speed.
//
// # Per-method isolation, the rule of thumb
//
// A connection carries at most the server's MaxConcurrentStreams calls at
// once; a slow method that fills them makes every other method on the
// connection wait for a stream. Give the slow method a bulkhead whose
// maxConcurrent is below the connection's MaxConcurrentStreams minus the
// other methods' peak concurrency: its excess callers then wait in its own
// bulkhead, and the fast methods keep their latency (the saturation
// scenario: 64 streams, a bulkhead of 48 on the slow method, the fast
// method's p99 within 1.5× of its idle p99). A bulkhead per interceptor,
// shared by every method, cannot do this.
//
// # Adding a scenario
//
// A [Scenario] is a name, a documented fixed workload, and a Run function
// bounded in time by its [Size]. Scenarios of this package are listed in
// [All]; one from another package (bench/overload) is one more entry in
// cmd/compare's scenarios function. The smoke test (go test ./...) runs
// every scenario of [All] at the [Tiny] size.
package bench
