package interceptor

import (
	"time"

	"google.golang.org/grpc"
)

// Per-call options. Each is a grpc.CallOption that grpc itself ignores; the
// client's interceptors read them. Pass them to a stub method:
//
//	resp, err := client.Echo(ctx, req, interceptor.MaxAttempts(2))

// maxAttemptsOption overrides a call's MaxAttempts.
type maxAttemptsOption struct {
	grpc.EmptyCallOption
	n int
}

// MaxAttempts sets the number of attempts of this call, the first included,
// in place of its policy's; it is capped at the client's cap
// (WithMaxAttemptsCap, 5 by default). 1 turns retries off; a call whose
// method has no retry policy gets one with default backoff.
func MaxAttempts(n int) grpc.CallOption { return maxAttemptsOption{n: n} }

// noRetryOption turns retries off for a call.
type noRetryOption struct{ grpc.EmptyCallOption }

// NoRetry runs this call once, whatever its method's policy says.
func NoRetry() grpc.CallOption { return noRetryOption{} }

// perAttemptTimeoutOption overrides a call's per-attempt timeout.
type perAttemptTimeoutOption struct {
	grpc.EmptyCallOption
	d time.Duration
}

// PerAttemptTimeout bounds each attempt of this call by d (until it commits,
// for streams), in place of its policy's PerAttemptRecvTimeout; 0 removes the
// bound. On a method without a retry policy it bounds the call's one
// attempt: the call ends with DEADLINE_EXCEEDED after d, and is not
// retried.
func PerAttemptTimeout(d time.Duration) grpc.CallOption { return perAttemptTimeoutOption{d: d} }

// callOptions are the per-call options found on one call.
type callOptions struct {
	maxAttempts int // 0: the policy's
	noRetry     bool
	perAttempt  time.Duration
	setAttempt  bool // perAttempt was given
	any         bool // any of ours was given
	static      bool // grpc.StaticMethod: a generated stub's call
	// sizer measures messages for the replay buffer with the codec grpc's
	// call options chose.
	sizer wireSizer
}

// scanCallOptions finds this package's options in opts, and grpc's options
// that choose the call's codec.
func scanCallOptions(opts []grpc.CallOption) callOptions {
	var co callOptions
	for _, o := range opts {
		switch o := o.(type) {
		case maxAttemptsOption:
			co.maxAttempts, co.any = o.n, true
		case noRetryOption:
			co.noRetry, co.any = true, true
		case perAttemptTimeoutOption:
			co.perAttempt, co.setAttempt, co.any = o.d, true, true
		case grpc.ForceCodecV2CallOption:
			co.sizer.forced = o.CodecV2
		case grpc.ForceCodecCallOption:
			co.sizer.forced = o.Codec
		case grpc.CustomCodecCallOption:
			co.sizer.forced = o.Codec
		case grpc.ContentSubtypeCallOption:
			co.sizer.subtype = o.ContentSubtype
		case grpc.StaticMethodCallOption:
			co.static = true
		}
	}
	return co
}

// effectiveRetry returns the retry policy of one call: the method's, with the
// call options applied, or nil for a single attempt.
func (co *callOptions) effectiveRetry(rp *retryPolicy, maxCap int) (retryPolicy, bool) {
	if co.noRetry {
		return retryPolicy{}, false
	}
	var p retryPolicy
	switch {
	case rp != nil:
		p = *rp
	case co.maxAttempts > 1:
		p = *defaultRetryPolicy()
	case co.perAttempt > 0:
		// A per-attempt timeout on a method without a retry policy bounds
		// its one attempt.
		p = retryPolicy{maxAttempts: 1}
	default:
		return retryPolicy{}, false
	}
	if co.maxAttempts > 0 {
		p.maxAttempts = min(co.maxAttempts, maxCap)
	}
	if co.setAttempt {
		p.perAttempt = max(co.perAttempt, 0)
	}
	return p, p.maxAttempts > 1 || p.perAttempt > 0
}
