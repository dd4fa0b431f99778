// Package resilience names the version of the module
// github.com/grpc-resilience/resilience, gRPC interceptors for Go that make
// service-to-service calls survive failure: retries and hedging under gRFC
// A6's rules, per-method circuit breakers and bulkheads, a retry budget,
// server-side idempotency and overload protection.
//
// The features live in the module's packages; this one holds only [Version]:
//
//	interceptor          the client: NewClient, retries, hedging, breakers, bulkheads, budgets
//	interceptor/server   the server: idempotency, deadline headroom, overload protection
//	interceptor/endpoint a load-balancing policy that sends each retry to another backend
//	interceptor/idempotency/...  the idempotency stores: memory, Redis, PostgreSQL (and its outbox)
//	serviceconfig        the service-config document, parsed and validated
//	faultinject, resiliencetest  fault injection and testing aids
//
// The repository's README and docs/ pages are the guide; CHANGELOG.md says
// what each release changed.
package resilience
