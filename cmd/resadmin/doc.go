// Command resadmin reads the admin view of a process that uses
// grpc-resilience (package interceptor/admin, the gRPC service
// resilience.admin.v1.AdminService), as grpcdebug reads channelz: which
// part is refusing calls now and why, the state of every part, and the
// recent events; watch follows the events as they happen.
//
// Usage:
//
//	go run ./cmd/resadmin [flags] [view]
//	go run ./cmd/resadmin [flags] events [-after SEQUENCE] [-n N]
//	go run ./cmd/resadmin [flags] watch [-after SEQUENCE]
//	go run ./cmd/resadmin [flags] breaker force-open|force-closed|reset CLIENT METHOD
//
// Flags (before or after the command):
//
//	-addr HOST:PORT   the process's gRPC address (default 127.0.0.1:50051)
//	-json             print protojson: the View, the ListEventsResponse, or
//	                  one Event per line for watch, for scripts
//	-H KEY:VALUE      send this metadata with each call (repeatable), such
//	                  as the authorization a process's write hook checks
//	-tls-ca FILE      use TLS, trusting the CA certificates in FILE (PEM)
//	-timeout D        bound of each call but watch (default 10s)
//
// view prints "refusing now" first (the open breakers, the ejected
// endpoints, the parts whose refusals are recent, each with its cause),
// then each Client's methods, each Server's limits and store, each
// channel's endpoints, and the latest events. watch prints the events
// kept after SEQUENCE (none without -after; all with -after 0), then one
// line per event as it happens, and one more each time an episode of
// refusals grows (at most every 50ms), until interrupted. breaker asks the process to
// force a Client method's breaker open or closed, or to reset it; the
// process refuses unless it turned writes on (admin.WithWrites) and its
// hook allows the call.
//
// Exit status: 0 ok; 1 the call failed (unreachable, refused); 2 usage
// error.
package main
