// Package pgtest runs a real PostgreSQL for tests: a cluster of its own,
// made with initdb in a temporary directory and started on a free loopback
// port, never a mock.
//
// [DSN] returns $PG_DSN when it is set; otherwise the cluster shared by the
// test binary, started at its first use (initdb and start take about a
// second) and stopped by [StopShared], from a TestMain after m.Run. A test
// binary without one leaves nothing behind all the same: each cluster is
// watched by a small process (sh) that holds the read end of a pipe whose
// write end only the test binary holds; when the binary exits, however it
// exits (a return, a panic, a timeout, SIGKILL), the pipe ends and the
// watcher stops the cluster and removes its directory (about 40 MB).
// [Start] and [StartWith] start a cluster of the caller's own, stopped by a
// cleanup of the test, for tests that kill, restart ([Server.Restart], -m
// fast or -m immediate) or configure it; [Launch] one for a benchmark
// command, which stops it itself.
//
// The binaries (initdb, postgres) are found with pg_config --bindir, then
// in /usr/lib/postgresql/*/bin (Debian's postgresql package), then on PATH.
// Without them the test is skipped with instructions, except in CI (the CI
// environment variable is set), where it fails: Postgres tests never skip
// silently in CI. PostgreSQL refuses to run as root: as root, the cluster
// runs as the unprivileged system user "postgres" (which Debian's package
// creates), its directory chowned to that user.
//
// A cluster runs with fsync off (the tests kill clients and servers of
// their own, never the machine), listens on 127.0.0.1 only, and is stopped
// by its process id (SIGINT, Postgres's fast shutdown; SIGKILL after 10 s)
// before its directory is removed.
//
// Tests sharing a cluster keep apart by schema: [Schema] creates one that
// is unique to the test and drops it at its end. [CountRoundTrips] counts
// the round trips of a pool's connections; [InjectFaults] breaks them on
// purpose (a reply lost, a request dropped, every socket closed at once as
// when the process that holds them dies).
package pgtest
