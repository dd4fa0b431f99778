// Command client drives load at a gRPC echo server (examples/server)
// through the client interceptors of grpc-resilience, configured by a
// service-config JSON file, and prints a live summary every second: calls
// finished, how many succeeded, the status codes, attempts per call and
// the method's circuit-breaker state. Its own /metrics serves the client's
// OpenTelemetry metrics in Prometheus form: the interceptors' series, and
// grpc-go's own client metrics with those of the resilience_endpoint
// load-balancing policy. The document's loadBalancingConfig, if any, is
// given to grpc as the channel's default service config. The client is
// registered in an admin view (package interceptor/admin) named
// "example": its page is on the debug port at /debug/resilience/, and
// with -admin-addr cmd/resadmin reads it over gRPC.
//
//	go run ./examples/server -fail-rate 0.3 &
//	go run ./examples/client -config examples/client/config.json -rate 200 -duration 10s
//
// On start it prints `metrics listening on HOST:PORT` when -metrics-addr
// is not empty, then `admin listening on HOST:PORT` when -admin-addr is
// not empty; at the end a line starting with "total" sums the run. The
// exit status is 0 when the run completed, whatever the calls' outcomes.
//
// # Flags
//
//	-config       service-config JSON (methodConfig with retryPolicy, circuitBreaker, ...)
//	-addr         server address (default 127.0.0.1:50051), or several, HOST:PORT,...
//	              (one endpoint each, for the resilience_endpoint policy)
//	-method       Echo or Lookup (default Echo)
//	-rate         calls per second in total; 0 means as fast as -concurrency allows
//	-concurrency  callers at once (default 8)
//	-duration     how long to drive load (default 10s)
//	-timeout      deadline of each call (default 2s)
//	-keyed        send an idempotency key with every call (kept across its retries)
//	-metrics-addr debug HTTP address: Prometheus /metrics and the admin page
//	              /debug/resilience/ (default 127.0.0.1:9465; empty disables)
//	-admin-addr   serve the admin view over gRPC on this address, for
//	              cmd/resadmin (default empty: off)
package main
