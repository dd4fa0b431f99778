// Package adminv1 is the generated Go of resilience.admin.v1, the admin
// view of grpc-resilience: the service AdminService (served by package
// interceptor/admin's Register, read by the command cmd/resadmin) and its
// messages. Regenerate with "buf generate" from the repository root.
//
// Two files are written by hand: this one, and names.go, the names of the
// enums as an operator reads them (Part.Label, BreakerState.Label,
// EventKind.Label), which the admin page and cmd/resadmin share: the
// command imports this package alone, not the library.
package adminv1
