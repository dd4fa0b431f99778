// Package testserver is a scriptable echo server for the tests of package
// interceptor. It serves resilience.echo.v1.EchoService over bufconn, records
// every attempt it sees (method, metadata, messages), and lets a test decide
// each attempt's outcome.
package testserver
