package main

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats/opentelemetry"

	"github.com/grpc-resilience/resilience/faultinject"
	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// serverMetrics records the server's idempotency metrics with mp.
func serverMetrics(mp metric.MeterProvider) []server.Option {
	return []server.Option{server.WithMeterProvider(mp)}
}

// grpcMetrics records grpc-go's own server metrics with mp, through its
// OpenTelemetry plugin (gRFC A66): grpc.server.call.started, .duration and
// the message sizes, by grpc.method and grpc.status, beside the
// interceptor's resilience.* series.
func grpcMetrics(mp metric.MeterProvider) grpc.ServerOption {
	return opentelemetry.ServerOption(opentelemetry.Options{
		MetricsOptions: opentelemetry.MetricsOptions{MeterProvider: mp},
	})
}

// faultMetrics exports the injector's counts with mp, as the counters
// resilience.faultinject.delays, .aborts and .stream_aborts.
func faultMetrics(mp metric.MeterProvider, inj *faultinject.Injector) error {
	m := mp.Meter("github.com/grpc-resilience/resilience/examples/server")
	var counters [3]metric.Int64ObservableCounter
	for i, c := range []struct{ name, desc string }{
		{"resilience.faultinject.delays", "Calls the fault injector delayed."},
		{"resilience.faultinject.aborts", "Calls the fault injector aborted before the handler."},
		{"resilience.faultinject.stream_aborts", "Streams the fault injector aborted part-way."},
	} {
		var err error
		if counters[i], err = m.Int64ObservableCounter(c.name, metric.WithUnit("{call}"), metric.WithDescription(c.desc)); err != nil {
			return err
		}
	}
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		n := inj.Counts()
		o.ObserveInt64(counters[0], n.Delays)
		o.ObserveInt64(counters[1], n.Aborts)
		o.ObserveInt64(counters[2], n.StreamAborts)
		return nil
	}, counters[0], counters[1], counters[2])
	return err
}

// limitOptions reads -server-config, a server document of concurrency and
// rate limits (serviceconfig.ParseServer), into the option that installs
// it.
func (c *config) limitOptions() ([]server.Option, error) {
	if c.serverConfig == "" {
		return nil, nil
	}
	data, err := os.ReadFile(c.serverConfig)
	if err != nil {
		return nil, fmt.Errorf("-server-config: %w", err)
	}
	cfg, err := serviceconfig.ParseServer(data)
	if err != nil {
		return nil, fmt.Errorf("-server-config %s: %w", c.serverConfig, err)
	}
	return []server.Option{server.WithLimits(server.Limits{Config: *cfg})}, nil
}
