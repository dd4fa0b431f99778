// Package echov1 is the generated Go of resilience.echo.v1, the echo
// service the tests and examples of grpc-resilience call: Echo (unary, with
// side effects), Lookup (unary, idempotency_level NO_SIDE_EFFECTS),
// ServerStream, ClientStream and BidiStream. Regenerate with
// "buf generate" from the repository root.
package echov1
