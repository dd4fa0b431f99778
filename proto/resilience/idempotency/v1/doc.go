// Package idempotencyv1 is the generated Go of resilience.idempotency.v1:
// the versioned record format in which the idempotency stores keep a
// request's outcome (status, reply bytes, header and trailer). Regenerate
// with "buf generate" from the repository root.
package idempotencyv1
