// Command server is a real TCP server of the echo service
// (resilience.echo.v1.EchoService) behind the server interceptors of
// grpc-resilience: idempotency (an in-memory or Redis store) and deadline
// headroom, with fault injection (failure rate, latency, outage windows)
// for trying clients' retry policies, gRPC
// server reflection and health, and an OpenTelemetry Prometheus exporter
// on /metrics: the interceptors' resilience.* series, grpc-go's own server
// metrics (its OpenTelemetry plugin: grpc.server.call.*) and the fault
// injector's counts (resilience.faultinject.*). The Grafana dashboard in
// examples/dashboards reads them. With -forward, Echo and Lookup forward to
// backends (other instances of this server) through an interceptor.Client
// with retries, a breaker and the resilience_endpoint policy: a middle
// tier with both sides of the library.
//
// Its admin view (package interceptor/admin) shows the server (named
// "example") and, with -forward, its client (named "backends") and the
// backends' endpoints: as a plain page on the debug port at
// /debug/resilience/ (with its JSON), and over gRPC on the server's own
// port (resilience.admin.v1.AdminService, kept out of the limits and
// faults), which cmd/resadmin reads:
//
//	go run ./cmd/resadmin -addr 127.0.0.1:50051
//	go run ./cmd/resadmin -addr 127.0.0.1:50051 watch
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
// health turns NOT_SERVING, and calls in flight get -shutdown-timeout to
// end (GracefulStop, beside server.Server.Shutdown, which refuses new
// calls and waits for the keyed calls' handlers: they run detached from
// their callers, so grpc.Server.Stop does not reach them); the rest are
// then cut, keyed handlers included (Shutdown cancels them; their
// outcomes are not stored, so a retry runs them again). A keyed handler
// that finishes in time stores its outcome before the store closes.
//
// # Flags
//
//	-addr             gRPC address (default 127.0.0.1:50051; 127.0.0.1:0 picks a port)
//	-metrics-addr     debug HTTP address: Prometheus /metrics and the admin page
//	                  /debug/resilience/ (default 127.0.0.1:9464; empty disables)
//	-store            memory | redis (default memory)
//	-redis-addr       Redis address for -store redis (default 127.0.0.1:6379)
//	-scope            idempotency scope: none | mtls | metadata:<key> | shared
//	                  (default none: keyed calls are refused)
//	-tls-cert, -tls-key  serve TLS with this certificate and key (PEM)
//	-tls-client-ca    require client certificates signed by this CA (PEM): mTLS
//	-faults           fault-injection config, JSON (see package faultinject)
//	-server-config    concurrency and rate limits, a server document (see
//	                  svcconfig server); limits.json, beside this file, limits
//	                  each tenant (metadata x-tenant) to 20 calls a second
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
//	-forward          forward Echo and Lookup to these backends, HOST:PORT,...
//	                  (one endpoint each), through an interceptor.Client
//	-forward-config   the forwarding client's service config (JSON; default
//	                  forward.json: 3 attempts on UNAVAILABLE, a breaker that
//	                  opens after 5 failures in a row, resilience_endpoint)
//
// # Idempotency scope
//
// A record is found by (scope, method, key): callers of one scope share
// records, so a caller who learns or guesses another's key receives that
// caller's reply. The scope must say who the caller is, which only
// authentication knows, so it is a choice the operator makes, never a
// default; the server prints it at startup (on stderr: level=INFO
// msg=idempotency scope=... quota=...):
//
//   - none (the default): keyed calls are refused with FAILED_PRECONDITION
//     naming this flag; calls without a key are served.
//   - mtls: the verified client certificate's identity (issuer, subject and
//     SANs: server.PeerScope), with -tls-cert, -tls-key and
//     -tls-client-ca. Each workload's keys are its own.
//   - metadata:<key>: the value of that request header, e.g.
//     metadata:x-tenant, as a principal that an authenticating proxy sets.
//     Callers could send it themselves, so use it only behind a proxy that
//     authenticates callers, sets the header and strips the one a caller
//     sent. A keyed call without the header is refused with
//     UNAUTHENTICATED. The key must be a metadata key, not one that grpc
//     fills for every call (:authority, user-agent, content-type, te),
//     which would make one scope of every caller of a host or library.
//   - shared: one scope for everyone; keys must then be unguessable
//     (random, 128 bits or more), as examples/client's are.
//
// There is no scope by the caller's address. Behind a NAT, a load
// balancer, an ingress or a sidecar mesh (Envoy, Istio, Linkerd), every
// caller reaches the server from the proxy's address: one scope for all,
// where every caller reads every other's replies; and a client whose
// address changes (a new pod, a reconnect through another proxy) loses its
// records. Under a mesh that terminates mTLS in the sidecar, the server
// sees plaintext from the sidecar, so -scope mtls sees no client
// certificate: scope by the identity the sidecar forwards instead, e.g.
// -scope metadata:x-forwarded-client-cert with Envoy's
// forward_client_cert_details set to SANITIZE_SET (it sets the header to
// the client certificate's identity and drops any a caller sent), or by
// the principal your authentication proxy sets.
//
// Quotas are on: each scope may hold a quarter of the store (the memory
// store's entries and bytes, or a quarter of Redis's maxmemory), so one
// caller cannot fill it for the others. With -scope shared every caller is
// one scope, so the store's own bounds are that scope's.
//
// # Interceptor order
//
//	recovery ─► resilience (limits, headroom, idempotency) ─► faultinject ─► handler
//
// The admin service skips the middle two: an operator reads the view while
// the limits shed everything else.
//
// Faults are injected inside idempotency, where the handler's own failures
// would be: an injected UNAVAILABLE is not stored, so a retry with the same
// key runs again; an injected latency holds the key's claim, so
// duplicates wait, as they would for a slow handler.
package main
