// Package failuremodes holds the tests behind README's "Failure modes":
// a real grpc client and server on loopback TCP with toxiproxy in-process
// between them (netfault_test.go), and examples/server run as a child
// process, killed mid-load and restarted (process_test.go). They live in
// the examples module, not beside package interceptor, so that the
// library's go.mod requires neither toxiproxy (and its zerolog,
// gorilla/mux, ...) nor the Prometheus client the example programs serve
// their metrics with. They test the interceptor through its exported API;
// the test files import it with a dot, as they were written inside it.
package failuremodes
