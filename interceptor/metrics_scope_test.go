package interceptor

import (
	"context"
	"testing"
	"testing/synctest"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestClientMetricsKeepTheirScope pins the instrumentation scope of the
// client's metrics, over real gRPC: the package path of interceptor, which
// the server's metrics share (the changelog of the split promises both
// unchanged). A literal, not the constant, so that renaming the constant
// cannot move it unnoticed.
func TestClientMetricsKeepTheirScope(t *testing.T) {
	const scope = "github.com/grpc-resilience/resilience/interceptor"
	synctest.Test(t, func(t *testing.T) {
		reader, mp := newMeterReader()
		srv := &testserver.Server{}
		srv.SetScript(failFirst(1, codes.Unavailable))
		stub, c := newEcho(t, srv, WithMeterProvider(mp), WithRetryPolicy(fastPolicy(3)))
		defer c.Close()
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{Message: "hi"}); err != nil {
			t.Fatal(err)
		}
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		names := 0
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				names++
				if sm.Scope.Name != scope {
					t.Errorf("%s recorded in scope %q, want %q", m.Name, sm.Scope.Name, scope)
				}
			}
		}
		if names == 0 {
			t.Fatal("no metric recorded")
		}
	})
}
