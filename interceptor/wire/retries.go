package wire

import "context"

// CallerRetriesKey is the metadata key with which a client in one-layer
// mode (package interceptor, WithOneLayerRetry) marks the calls it will
// retry itself. A server reads it (the interceptors of package
// interceptor/server do) so that clients inside its handlers retry less.
const CallerRetriesKey = "resilience-caller-retries"

type callerRetriesCtxKey struct{}

// ContextWithCallerRetries marks ctx as the context of a handler whose
// caller retries the call itself. The interceptors of package
// interceptor/server do it for every incoming call that carries
// CallerRetriesKey; use it directly in servers that do not use them.
func ContextWithCallerRetries(ctx context.Context) context.Context {
	return context.WithValue(ctx, callerRetriesCtxKey{}, true)
}

// CallerRetries reports whether ctx is marked as coming from a caller that
// retries (ContextWithCallerRetries).
func CallerRetries(ctx context.Context) bool {
	v, _ := ctx.Value(callerRetriesCtxKey{}).(bool)
	return v
}
