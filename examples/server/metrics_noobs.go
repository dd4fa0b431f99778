//go:build !resilience_obs

package main

import (
	"go.opentelemetry.io/otel/metric"

	"github.com/grpc-resilience/resilience/interceptor"
)

// serverMetrics is empty until interceptor.WithServerMeterProvider exists
// (branch obs); see metrics_obs.go. Delete this file at that merge.
func serverMetrics(metric.MeterProvider) []interceptor.ServerOption { return nil }
