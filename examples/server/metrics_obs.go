//go:build resilience_obs

package main

import (
	"go.opentelemetry.io/otel/metric"

	"github.com/grpc-resilience/resilience/interceptor"
)

// serverMetrics records the server's idempotency metrics with mp.
//
// MERGE NOTE: interceptor.WithServerMeterProvider comes with branch obs.
// Once it is merged, delete metrics_noobs.go and this file's build tag.
func serverMetrics(mp metric.MeterProvider) []interceptor.ServerOption {
	return []interceptor.ServerOption{interceptor.WithServerMeterProvider(mp)}
}
