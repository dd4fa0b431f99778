package interceptor

import (
	"context"
	"testing"
	"testing/synctest"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// counters collects every int64 sum point as "name{attr=value,...}" → value.
func counters(t *testing.T, r *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				key := m.Name + "{"
				for i, kv := range dp.Attributes.ToSlice() {
					if i > 0 {
						key += ","
					}
					key += string(kv.Key) + "=" + kv.Value.String()
				}
				out[key+"}"] += dp.Value
			}
		}
	}
	return out
}

func TestMetricsCountAttemptsRetriesStopsAndStateChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		srv := &testserver.Server{}
		srv.SetScript(failFirst(4, codes.Unavailable))
		stub, _ := newEcho(t, srv, WithMeterProvider(mp), WithMethodConfig(serviceconfig.MethodConfig{
			Name:           []serviceconfig.Name{{Service: echoService}},
			RetryPolicy:    fastPolicy(3),
			CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 10},
		}))
		_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{}) // 3 failed attempts: exhausted
		_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{}) // 1 failed, 1 ok
		got := counters(t, reader)
		m := "rpc.method=" + echoMethod
		want := map[string]int64{ // attributes in sorted order
			"resilience.client.attempts{rpc.grpc.status_code=14," + m + "}":       4,
			"resilience.client.attempts{rpc.grpc.status_code=0," + m + "}":        1,
			"resilience.client.retries{" + m + "}":                                3,
			"resilience.client.stops{resilience.stop_reason=exhausted," + m + "}": 1,
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s = %d, want %d (all: %v)", k, got[k], v, got)
			}
		}
	})
}

func TestMetricsStateChangesAndBudgetGauge(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	c := newTestClient(t, WithMeterProvider(mp), WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: echoService}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{},
	}))
	if err := c.ForceOpen(echoMethod); err != nil {
		t.Fatal(err)
	}
	got := counters(t, reader)
	key := "resilience.client.breaker.state_changes{resilience.breaker.from=closed,resilience.breaker.to=forced-open,rpc.method=" + echoMethod + "}"
	if got[key] != 1 {
		t.Errorf("%s = %d, want 1 (all: %v)", key, got[key], got)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[float64]); ok && m.Name == metricBudget {
				found = len(g.DataPoints) == 1 && g.DataPoints[0].Value == 100
			}
		}
	}
	if !found {
		t.Error("retry budget gauge missing or not 100 (the default reserve) on a fresh client")
	}
}
