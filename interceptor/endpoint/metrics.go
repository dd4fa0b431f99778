package endpoint

import (
	"time"

	estats "google.golang.org/grpc/experimental/stats"
)

// The policy's metrics, in gRFC A79's registry under gRFC A91's names
// with the policy's own prefix (grpc's outlier_detection may register
// A91's): off by default, like every A79 metric, and enabled by name in
// grpc's OpenTelemetry plugin (google.golang.org/grpc/stats/opentelemetry,
// MetricsOptions.Metrics). Each has the label grpc.target.
var (
	ejectionsEnforced = estats.RegisterInt64Count(estats.MetricDescriptor{
		Name:        "grpc.lb.resilience_endpoint.ejections_enforced_total",
		Description: "EXPERIMENTAL. Ejections of an endpoint by the resilience_endpoint policy.",
		Unit:        "{ejection}",
		Labels:      []string{"grpc.target"},
	})
	ejectionsOverflow = estats.RegisterInt64Count(estats.MetricDescriptor{
		Name:        "grpc.lb.resilience_endpoint.ejections_overflow",
		Description: "EXPERIMENTAL. Ejections refused because maxEjectionPercent was reached.",
		Unit:        "{ejection}",
		Labels:      []string{"grpc.target"},
	})
	attemptsAvoided = estats.RegisterInt64Count(estats.MetricDescriptor{
		Name:        "grpc.lb.resilience_endpoint.attempts_avoided",
		Description: "EXPERIMENTAL. Retries and hedged copies sent away from an endpoint their call had used.",
		Unit:        "{attempt}",
		Labels:      []string{"grpc.target"},
	})
	ejectedEndpoints = estats.RegisterInt64AsyncGauge(estats.MetricDescriptor{
		Name:        "grpc.lb.resilience_endpoint.ejected_endpoints",
		Description: "EXPERIMENTAL. Endpoints out of rotation now.",
		Unit:        "{endpoint}",
		Labels:      []string{"grpc.target"},
	})
)

// count adds one to the counter h for the channel's target.
func (b *lb) count(h *estats.Int64CountHandle) {
	if b.recorder != nil {
		h.Record(b.recorder, 1, b.target)
	}
}

// report is the gauge's reporter, called by the recorder.
func (b *lb) report(r estats.AsyncMetricsRecorder) error {
	b.mu.Lock()
	g := b.group
	b.mu.Unlock()
	n, _ := g.EjectedCount(time.Now())
	ejectedEndpoints.Record(r, int64(n), b.target)
	return nil
}
