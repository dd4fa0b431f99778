// Package telemetry holds the names that the client's and the server's
// metrics and trace events share: the instrumentation scope, the attribute
// keys of gRFC A66 and this library, and A66's latency buckets. One place,
// so that a dashboard reads the same keys from both sides.
package telemetry

import "go.opentelemetry.io/otel/attribute"

// MeterName is the instrumentation scope of every instrument of the client
// and the server (the package path the server had before it moved: a
// dashboard that selects by scope keeps working).
const MeterName = "github.com/grpc-resilience/resilience/interceptor"

// Attribute keys both sides use. grpc.method is gRFC A66's.
var (
	// AttrMethod is the full method, or "other" for one that generated
	// code does not register (A66).
	AttrMethod = attribute.Key("grpc.method")
	// AttrReason is why a call or an attempt was refused.
	AttrReason = attribute.Key("resilience.reason")
	// AttrCode is a status code's number, on trace events.
	AttrCode = attribute.Key("rpc.grpc.status_code")
)

// EventReplay is the trace event of an idempotent duplicate that receives
// the stored outcome. Attributes: the source (store or flight) and the
// replayed status code.
const EventReplay = "resilience.idempotency.replay"

// A66LatencyBounds are gRFC A66's bucket boundaries for latencies, in
// seconds.
var A66LatencyBounds = []float64{0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002,
	0.003, 0.004, 0.005, 0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08,
	0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1, 2, 5, 10, 20, 50, 100}
