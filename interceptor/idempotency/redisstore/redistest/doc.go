// Package redistest runs a real redis-server for tests.
//
// [Addr] starts a fresh redis-server on a free loopback port for the calling
// test (no persistence: --save "" --appendonly no) and stops it when the
// test ends, or returns $REDIS_ADDR when that is set. Without redis-server on
// PATH the test is skipped with instructions, except in CI (the CI
// environment variable is set), where it fails: Redis tests never skip
// silently in CI.
//
// Tests sharing a server keep apart by key prefix: [Prefix] returns one that
// is unique to the test and the run.
//
// Hooks on a go-redis client observe or disturb its traffic: [CountRoundTrips]
// counts round trips, and [InjectFaults] loses the replies of commands Redis
// has run, as a reply delayed past the caller's deadline is lost, or drops
// commands before they are sent.
package redistest
