package interceptor

import (
	"context"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/internal/trail"
)

// trailBound returns the instant before which an attempt's deadline is the
// policy's own per-attempt timeout (package trail's OwnBound), which the
// endpoint load-balancing policy counts against an endpoint that does not
// answer in time: zero when the call has no per-attempt timeout, or when a
// call option set it (a caller's choice must not eject a healthy endpoint).
// An attempt deadline at or past it comes from the caller's deadline, less
// the client's headroom.
func (r *retrier) trailBound(ctx context.Context) time.Time {
	if r.rp.perAttempt <= 0 || r.attemptByCaller {
		return time.Time{}
	}
	dl, _ := ctx.Deadline()
	return trail.OwnBound(dl, r.c.opts.headroom)
}
