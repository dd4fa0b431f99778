package interceptor

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor/internal/telemetry"
)

// Events on the caller's current span (trace.SpanFromContext), added only
// while it records: a span that does not record, or none, costs one context
// lookup and no allocation. The client adds its events to the span of the
// context the call was made with, so a span the application (or otelgrpc's
// client handler, which runs inside the interceptors) started around the
// call carries them; grpc's own per-attempt spans are below, one per
// attempt.
const (
	// eventRetry: a failed attempt is retried. Attributes: the attempt
	// that failed, its status code, the delay before the next one, and
	// whether the delay was the server's pushback.
	eventRetry = "resilience.retry"
	// eventHedge: a hedged copy is sent. Attributes: the copy's number (2
	// for the first hedge) and the delay after the copy before it.
	eventHedge = "resilience.hedge"
	// eventRejected: the breaker or bulkhead refused an attempt.
	// Attributes: the attempt's number and the reason (circuit_open,
	// bulkhead_full).
	eventRejected = "resilience.rejected"
	// eventStop: a call under a retry policy ends without success.
	// Attributes: the attempts run, the returned status code and why
	// retrying stopped.
	eventStop = "resilience.retry.stop"
)

// Attribute keys of the events.
var (
	attrAttempt  = attribute.Key("resilience.attempt")
	attrCode     = telemetry.AttrCode
	attrDelay    = attribute.Key("resilience.delay") // seconds
	attrPushback = attribute.Key("resilience.pushback")
)

// recordingSpan returns ctx's span when it records, else nil.
func recordingSpan(ctx context.Context) trace.Span {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		return span
	}
	return nil
}

// onRetried records a retry after the attempt that failed with err, in
// metrics and on the caller's span.
func (r *retrier) onRetried(ctx context.Context, err error, d decision) {
	if span := recordingSpan(ctx); span != nil {
		span.AddEvent(eventRetry, trace.WithAttributes(attrAttempt.Int(r.attempts),
			attrCode.Int(int(rescodes.Classify(err))), attrDelay.Float64(d.delay.Seconds()), attrPushback.Bool(d.pushback)))
	}
	r.c.metrics.retry(ctx, r.mm) // last: a span event that aborts leaves it uncounted (see onRetry)
}

// onHedged records a hedged copy sent delay after the one before, in
// metrics and on the caller's span.
func (r *retrier) onHedged(ctx context.Context, delay time.Duration) {
	r.c.metrics.retry(ctx, r.mm)
	if span := recordingSpan(ctx); span != nil {
		span.AddEvent(eventHedge, trace.WithAttributes(attrAttempt.Int(r.attempts), attrDelay.Float64(delay.Seconds())))
	}
}

// onRejected records the local rejection of the call's next attempt for
// reason, in metrics and on the caller's span.
func (r *retrier) onRejected(ctx context.Context, reason StopReason) {
	r.c.metrics.rejected(ctx, r.mm, reason)
	if span := recordingSpan(ctx); span != nil {
		span.AddEvent(eventRejected, trace.WithAttributes(attrAttempt.Int(r.attempts+1), attrReason.String(reason.token())))
	}
}

// onStopped records a call under a retry policy that ended with err for
// reason, in metrics and on the caller's span.
func (r *retrier) onStopped(reason StopReason, err error) {
	r.c.metrics.stop(r.ctx, r.mm, reason)
	if span := recordingSpan(r.ctx); span != nil {
		span.AddEvent(eventStop, trace.WithAttributes(attrAttempt.Int(r.attempts),
			attrCode.Int(int(rescodes.Classify(err))), attrReason.String(reason.token())))
	}
}

// skip records a retry or hedge not sent for reason (the budget, A6
// throttling or the deadline) and returns the decision to stop.
func (r *retrier) skip(reason StopReason) decision {
	r.c.metrics.skipped(r.ctx, r.mm, reason)
	return decision{stop: reason}
}

// callEnded records gRFC A96's per-call metrics of the call, made on cc.
func (r *retrier) callEnded(cc *grpc.ClientConn) {
	r.c.metrics.callEnded(r.ctx, r.mm, cc, r.attempts, r.hedged, r.waited)
}
