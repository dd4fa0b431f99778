// Package serviceconfig is the data model of grpc-resilience: gRPC service
// config (gRFC A6) and this module's extension blocks, as plain Go structs
// with Validate methods.
//
// The same structs come from Go code and from a service-config JSON
// document, so one data model drives the client either way. The package is
// pure data and validation; package interceptor turns it into behaviour.
//
// See https://github.com/grpc/proposal/blob/master/A6-client-retries.md.
package serviceconfig
