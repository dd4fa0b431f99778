// Package redistest runs a real redis-server for tests.
//
// [Addr] starts a fresh redis-server on a free loopback port for the calling
// test (no persistence: --save "" --appendonly no) and stops it when the
// test ends, or returns $REDIS_ADDR when that is set. Without redis-server on
// PATH the test is skipped with instructions, except in CI (the CI
// environment variable is set), where it fails: Redis tests never skip
// silently in CI.
//
// [Start] and [StartWith] always start a server of the test's own (with extra
// redis-server arguments), which [Server.Restart] kills and starts again as
// a crashed Redis; [StartReplica] adds a replica of one, and [StartCluster] a
// Redis Cluster of n primaries (it also needs redis-cli, with the same skip
// or failure). Each waits on what the server reports (its log's "Ready to
// accept connections", INFO replication, CLUSTER INFO), not on a sleep, and
// every process is stopped by a cleanup of the test, whether it passes or
// fails.
//
// Tests sharing a server keep apart by key prefix: [Prefix] returns one that
// is unique to the test and the run.
//
// Hooks on a go-redis client observe or disturb its traffic: [CountRoundTrips]
// counts round trips, and [InjectFaults] loses the replies of commands Redis
// has run, as a reply delayed past the caller's deadline is lost, or drops
// commands before they are sent.
package redistest
