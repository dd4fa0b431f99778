package endpoint

import (
	"time"

	estats "google.golang.org/grpc/experimental/stats"
)

// Label names. grpc.target is required on every metric; the cause and
// reason labels on the counters that carry them; the endpoint label is
// optional (gRFC A79): off unless enabled by name in grpc's OpenTelemetry
// plugin (MetricsOptions.OptionalLabels), and bounded per channel to
// maxLabels distinct values over its life (later endpoints are "other"),
// since every value is a series the metrics pipeline keeps.
const (
	labelTarget   = "grpc.target"
	labelCause    = "grpc.lb.resilience_endpoint.cause"
	labelReason   = "grpc.lb.resilience_endpoint.reason"
	labelEndpoint = "grpc.lb.resilience_endpoint.endpoint"
)

// The policy's metrics, in gRFC A79's registry under gRFC A91's names
// with the policy's own prefix (grpc's outlier_detection may register
// A91's): off by default, like every A79 metric, and enabled by name in
// grpc's OpenTelemetry plugin (google.golang.org/grpc/stats/opentelemetry,
// MetricsOptions.Metrics).
var (
	ejectionsEnforced = estats.RegisterInt64Count(estats.MetricDescriptor{
		Name:           "grpc.lb.resilience_endpoint.ejections_enforced_total",
		Description:    "EXPERIMENTAL. Ejections of an endpoint by the resilience_endpoint policy, by cause.",
		Unit:           "{ejection}",
		Labels:         []string{labelTarget, labelCause},
		OptionalLabels: []string{labelEndpoint},
	})
	ejectionsDetected = estats.RegisterInt64Count(estats.MetricDescriptor{
		Name:           "grpc.lb.resilience_endpoint.ejections_detected_total",
		Description:    "EXPERIMENTAL. Endpoints found over an ejection threshold, ejected or not (maxEjectionPercent), by cause.",
		Unit:           "{ejection}",
		Labels:         []string{labelTarget, labelCause},
		OptionalLabels: []string{labelEndpoint},
	})
	ejectionsOverflow = estats.RegisterInt64Count(estats.MetricDescriptor{
		Name:           "grpc.lb.resilience_endpoint.ejections_overflow",
		Description:    "EXPERIMENTAL. Ejections detected but not enforced because maxEjectionPercent was reached.",
		Unit:           "{ejection}",
		Labels:         []string{labelTarget},
		OptionalLabels: []string{labelEndpoint},
	})
	unejections = estats.RegisterInt64Count(estats.MetricDescriptor{
		Name: "grpc.lb.resilience_endpoint.unejections_total",
		Description: "EXPERIMENTAL. Ejections that ended, by reason: expired, answered (a last-resort attempt succeeded), " +
			"reconnected, max_ejection_percent, max_ejection_time.",
		Unit:           "{ejection}",
		Labels:         []string{labelTarget, labelReason},
		OptionalLabels: []string{labelEndpoint},
	})
	attemptsAvoided = estats.RegisterInt64Count(estats.MetricDescriptor{
		Name:        "grpc.lb.resilience_endpoint.attempts_avoided",
		Description: "EXPERIMENTAL. Retries and hedged copies sent away from an endpoint their call had used.",
		Unit:        "{attempt}",
		Labels:      []string{labelTarget},
	})
	ejectedEndpoints = estats.RegisterInt64AsyncGauge(estats.MetricDescriptor{
		Name:        "grpc.lb.resilience_endpoint.ejected_endpoints",
		Description: "EXPERIMENTAL. Endpoints out of rotation now.",
		Unit:        "{endpoint}",
		Labels:      []string{labelTarget},
	})
)

// countAvoided adds one to attempts_avoided, on the pick path: its label
// slice is built once, so that the count allocates nothing.
func (b *lb) countAvoided() {
	if b.recorder != nil {
		attemptsAvoided.Record(b.recorder, 1, b.targetLabel...)
	}
}

// count adds one to the counter h for the channel's target, with the
// labels that follow it (rare events: the slice is built per call).
func (b *lb) count(h *estats.Int64CountHandle, labels ...string) {
	if b.recorder != nil {
		h.Record(b.recorder, 1, append([]string{b.target}, labels...)...)
	}
}

// report is the gauge's reporter, called by the recorder. It ends the
// ejections whose time has passed first, so that their returns are logged
// and counted when they happen rather than at the endpoint's next call.
func (b *lb) report(r estats.AsyncMetricsRecorder) error {
	now := time.Now()
	b.reportReturns(b.group.Sweep(now))
	n, _ := b.group.EjectedCount(now)
	ejectedEndpoints.Record(r, int64(n), b.target)
	return nil
}
