package endpoint_test

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats/opentelemetry"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
)

// metricsByName collects r and returns each metric's data points, by name.
func metricsByName(t *testing.T, r *sdkmetric.ManualReader) map[string][]metricdata.DataPoint[int64] {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string][]metricdata.DataPoint[int64]{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				out[m.Name] = d.DataPoints
			case metricdata.Gauge[int64]:
				out[m.Name] = d.DataPoints
			}
		}
	}
	return out
}

// TestMetricsThroughGrpcOpenTelemetryAndClosedChannelsReportNothing pins
// the policy's metrics through grpc's OpenTelemetry plugin: an ejection
// is counted and the gauge reports it with the channel's target; and the
// gauge of channels built and closed is unregistered (its data points do
// not grow with every channel ever made).
func TestMetricsThroughGrpcOpenTelemetryAndClosedChannelsReportNothing(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	const (
		enforced = "grpc.lb.resilience_endpoint.ejections_enforced_total"
		gauge    = "grpc.lb.resilience_endpoint.ejected_endpoints"
	)
	otel := opentelemetry.DialOption(opentelemetry.Options{MetricsOptions: opentelemetry.MetricsOptions{
		MeterProvider: mp,
		Metrics:       opentelemetry.DefaultMetrics().Add(enforced, gauge),
	}})
	sc := resiliencetest.WithServiceConfig(
		`{"loadBalancingConfig": [{"resilience_endpoint": {"consecutiveFailures": 1, "baseEjectionTime": "600s"}}]}`)
	for i := range 10 {
		cl, stop, err := resiliencetest.ServeCluster(3, []grpc.DialOption{otel}, sc)
		if err != nil {
			t.Fatal(err)
		}
		cl.Backends[0].OnCall(func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Code: codes.Unavailable} })
		client := cl.EchoClient()
		// Until backend 0 (READY when the rotation reaches it) fails once.
		for j := 0; len(cl.Backends[0].Attempts("")) == 0; j++ {
			if j == 1000 {
				t.Fatal("backend 0 got no call")
			}
			_, _ = client.Echo(t.Context(), &echov1.EchoRequest{Message: "x"}, grpc.WaitForReady(true))
		}
		m := metricsByName(t, reader)
		var live int
		for _, dp := range m[gauge] {
			if v, _ := dp.Attributes.Value("grpc.target"); v.AsString() == cl.Conn.Target() && dp.Value == 1 {
				live++
			}
		}
		if live != 1 {
			t.Fatalf("channel %d: gauge %s = %v, want 1 for %s", i, gauge, m[gauge], cl.Conn.Target())
		}
		stop()
		if n := len(metricsByName(t, reader)[gauge]); n != 0 {
			t.Fatalf("after channel %d closed, the gauge reports %d data points, want 0", i, n)
		}
		if n := len(metricsByName(t, reader)[enforced]); n != i+1 {
			t.Fatalf("%s has %d data points after %d channels, want one per target", enforced, n, i+1)
		}
	}
}
