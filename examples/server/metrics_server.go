package main

import (
	"go.opentelemetry.io/otel/metric"

	"github.com/grpc-resilience/resilience/interceptor"
)

// serverMetrics records the server's idempotency metrics with mp.
func serverMetrics(mp metric.MeterProvider) []interceptor.ServerOption {
	return []interceptor.ServerOption{interceptor.WithServerMeterProvider(mp)}
}
