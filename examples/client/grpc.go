package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/stats/opentelemetry"

	_ "github.com/grpc-resilience/resilience/interceptor/endpoint" // registers the resilience_endpoint policy
)

// endpointMetrics are the resilience_endpoint policy's metrics (gRFC A79's
// registry: off unless enabled by name).
var endpointMetrics = []string{
	"grpc.lb.resilience_endpoint.ejections_enforced_total",
	"grpc.lb.resilience_endpoint.ejections_overflow",
	"grpc.lb.resilience_endpoint.attempts_avoided",
	"grpc.lb.resilience_endpoint.ejected_endpoints",
}

// grpcOptions returns the dial options that give grpc itself what the
// service-config document holds for it, and record grpc's own client
// metrics with mp:
//   - the document's loadBalancingConfig, if any, as the channel's default
//     service config (so that `"resilience_endpoint"` sends each retry to
//     another backend); the interceptors read the rest of the document;
//   - grpc-go's OpenTelemetry plugin (gRFC A66's grpc.client.attempt.* and
//     call duration), with the endpoint policy's metrics enabled.
func grpcOptions(doc []byte, mp metric.MeterProvider) ([]grpc.DialOption, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(doc, &top); err != nil {
		return nil, fmt.Errorf("-config: %w", err)
	}
	opts := []grpc.DialOption{opentelemetry.DialOption(opentelemetry.Options{
		MetricsOptions: opentelemetry.MetricsOptions{
			MeterProvider: mp,
			Metrics:       opentelemetry.DefaultMetrics().Add(endpointMetrics...),
		},
	})}
	if lb, ok := top["loadBalancingConfig"]; ok {
		sc, err := json.Marshal(map[string]json.RawMessage{"loadBalancingConfig": lb})
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithDefaultServiceConfig(string(sc)))
	}
	return opts, nil
}

// targetOf returns the target of -addr and the dial options it needs: the
// address itself, or for several (HOST:PORT,...) a resolver of this
// process's own that gives grpc one endpoint per address, for the endpoint
// policy to choose among.
func targetOf(addr string) (string, []grpc.DialOption, error) {
	if !strings.Contains(addr, ",") {
		return addr, nil, nil
	}
	var addrs []resolver.Address
	for a := range strings.SplitSeq(addr, ",") {
		if a = strings.TrimSpace(a); a == "" {
			return "", nil, fmt.Errorf("-addr %q: an empty address", addr)
		}
		addrs = append(addrs, resolver.Address{Addr: a})
	}
	r := manual.NewBuilderWithScheme("servers")
	r.InitialState(resolver.State{Addresses: addrs})
	return "servers:///echo", []grpc.DialOption{grpc.WithResolvers(r)}, nil
}
