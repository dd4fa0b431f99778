package endpoint

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/grpc-resilience/resilience/internal/outlier"
)

// logger is the logger SetLogger set; nil: slog.Default().
var logger atomic.Pointer[slog.Logger]

// SetLogger sets the logger of every channel's ejections and returns; nil
// restores the default, slog.Default() at the time of each event. It is
// safe to call at any time, from any goroutine. One logger for the
// process: the policy is registered with grpc once, and a channel reaches
// it only through its service config, which carries no Go values.
//
// Each event is logged once, outside every lock of the policy:
//
//   - an ejection, at slog.LevelWarn: "resilience_endpoint: endpoint
//     ejected", with target, endpoint (its addresses), cause
//     (consecutive_failures, failure_rate, local_origin, probation),
//     ejections (the endpoint's count, this one included) and duration;
//   - an ejection refused by maxEjectionPercent, at slog.LevelWarn, once
//     per crossing of the threshold: "resilience_endpoint: ejection not
//     enforced", with target, endpoint and cause;
//   - a return, at slog.LevelInfo: "resilience_endpoint: endpoint
//     returned", with target, endpoint, reason (expired, answered,
//     reconnected, max_ejection_percent, max_ejection_time) and
//     ejected_for. An expiry is noticed at the endpoint's next outcome, a
//     change of any of the channel's connections, a Snapshots call or a
//     metrics collection, whichever comes first; ejected_for is exact
//     either way.
//
// To silence the policy, set a logger with slog.DiscardHandler.
func SetLogger(l *slog.Logger) { logger.Store(l) }

func log() *slog.Logger {
	if l := logger.Load(); l != nil {
		return l
	}
	return slog.Default()
}

// reportChange logs and counts what an outcome or a reconnection did to
// the endpoint e.
func (b *lb) reportChange(e *entry, ch outlier.Change) {
	if ch.Return != outlier.NotReturned {
		b.reportReturn(e, ch)
	}
	l := log()
	switch {
	case ch.Ejected():
		cause := ch.Cause.String()
		b.count(ejectionsEnforced, cause, e.label)
		b.count(ejectionsDetected, cause, e.label)
		l.LogAttrs(context.Background(), slog.LevelWarn, Name+": endpoint ejected",
			slog.String("target", b.target), slog.String("endpoint", e.name), slog.String("cause", cause),
			slog.Uint64("ejections", ch.Count), slog.Duration("duration", ch.Duration))
	case ch.Refused != outlier.NotEjected:
		cause := ch.Refused.String()
		b.count(ejectionsDetected, cause, e.label)
		b.count(ejectionsOverflow, e.label)
		l.LogAttrs(context.Background(), slog.LevelWarn, Name+": ejection not enforced",
			slog.String("target", b.target), slog.String("endpoint", e.name), slog.String("cause", cause),
			slog.String("reason", "max_ejection_percent"))
	}
}

func (b *lb) reportReturn(e *entry, ch outlier.Change) {
	reason := ch.Return.String()
	b.count(unejections, reason, e.label)
	log().LogAttrs(context.Background(), slog.LevelInfo, Name+": endpoint returned",
		slog.String("target", b.target), slog.String("endpoint", e.name), slog.String("reason", reason),
		slog.Duration("ejected_for", ch.EjectedFor))
}

// reportReturns logs and counts the returns a group-wide change reported.
func (b *lb) reportReturns(rs []outlier.Returned) {
	if len(rs) == 0 {
		return
	}
	b.mu.Lock()
	es := make([]*entry, len(rs))
	for i, r := range rs {
		es[i] = b.byOut[r.Endpoint]
	}
	b.mu.Unlock()
	for i, r := range rs {
		if e := es[i]; e != nil {
			b.reportReturn(e, r.Change)
		}
	}
}
