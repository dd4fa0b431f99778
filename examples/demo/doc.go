// Command demo runs a flaky in-process gRPC server and a client that
// survives it, printing what happened to every call: attempts, delays, codes
// and why retrying stopped.
//
//	go run ./examples/demo
//
// Everything runs in one process over an in-memory connection, on the
// embedded defaults; nothing else needs to be installed.
package main
