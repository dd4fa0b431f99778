// Command server is a real TCP server of the echo service
// (resilience.echo.v1.EchoService) behind the server interceptors of
// grpc-resilience: idempotency (an in-memory or Redis store) and deadline
// headroom, with fault injection (failure rate, latency, outage windows)
// for trying clients' retry policies, gRPC
// server reflection and health, and an OpenTelemetry Prometheus exporter
// on /metrics: the interceptors' resilience.* series, grpc-go's own server
// metrics (its OpenTelemetry plugin: grpc.server.call.*) and the fault
// injector's counts (resilience.faultinject.*). The Grafana dashboard in
// examples/dashboards reads them.
//
//	go run ./examples/server -fail-rate 0.2 -latency 20ms
//
// On start it prints, on stdout, exactly
//
//	grpc listening on HOST:PORT
//	metrics listening on HOST:PORT
//
// (the second line only when -metrics-addr is not empty), so that a script
// can start it on port 0 and read the addresses. SIGINT or SIGTERM stop it:
// health turns NOT_SERVING, calls in flight get -shutdown-timeout to end
// (GracefulStop), and the rest are cut.
//
// # Flags
//
//	-addr             gRPC address (default 127.0.0.1:50051; 127.0.0.1:0 picks a port)
//	-metrics-addr     Prometheus /metrics address (default 127.0.0.1:9464; empty disables)
//	-store            memory | redis (default memory)
//	-redis-addr       Redis address for -store redis (default 127.0.0.1:6379)
//	-scope            idempotency scope: peer | metadata:<key> | shared (default peer)
//	-faults           fault-injection config, JSON (see package faultinject)
//	-server-config    concurrency limits, a server document (see svcconfig server)
//	-fail-rate        shorthand: abort this fraction of calls to the echo service
//	                  (0 to 1, such as 0.3, or a percentage such as 30%)
//	-fail-code        shorthand: the code of -fail-rate (default UNAVAILABLE)
//	-latency          shorthand: delay every echo call this long
//	-outage           shorthand: DURATION/EVERY, e.g. 2s/10s: fail every echo call
//	                  (with -fail-code) for the first 2s of every 10s
//	-seed             seed of the fault injector (default: the config's, else 1)
//	-metadata-faults  honour per-call fault metadata (x-fault-abort, ...); off by default
//	-execution-log    append "<idempotency-key> <method> <message>\n" per handler
//	                  execution of a keyed call, before replying
//	-headroom, -headroom-floor  deadline headroom (default 20ms, 5ms)
//	-shutdown-timeout bound of the graceful stop (default 5s)
//
// # Idempotency scope
//
// A record is found by (scope, method, key): callers of one scope share
// records, so a caller who learns or guesses another's key receives that
// caller's reply. The server has no authentication, so the scope is a
// choice, never a silent default shared by everyone:
//
//   - peer (the default): the caller's IP address. Keys of different hosts
//     never meet; processes on one host (or behind one NAT) share a scope.
//     The port is left out on purpose, so that a retry on a new connection
//     (after a reconnect or a server restart) still finds its record.
//   - metadata:<key>: the value of that request header, e.g.
//     metadata:x-tenant. Callers choose it, so use it only behind a proxy
//     that authenticates callers and sets the header (stripping theirs).
//     A keyed call without the header is refused with UNAUTHENTICATED.
//   - shared: one scope for everyone; keys must then be unguessable
//     (random, 128 bits or more).
//
// A real service scopes by its authenticated principal, or by the client
// certificate (interceptor.IdempotencyPeerScope) under mTLS.
//
// # Interceptor order
//
//	recovery ─► resilience (headroom, idempotency) ─► faultinject ─► handler
//
// Faults are injected inside idempotency, where the handler's own failures
// would be: an injected UNAVAILABLE is not stored, so a retry with the same
// key runs again; an injected latency holds the key's claim, so
// duplicates wait, as they would for a slow handler.
package main
