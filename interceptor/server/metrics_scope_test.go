package server

import (
	"context"
	"testing"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestServerMetricsKeepTheirScope pins the instrumentation scope of the
// server's metrics, over real gRPC: the package path the server had before
// it moved to interceptor/server, which dashboards select by (the
// changelog promises it unchanged). A literal, not the constant, so that
// renaming the constant cannot move it unnoticed.
func TestServerMetricsKeepTheirScope(t *testing.T) {
	const scope = "github.com/grpc-resilience/resilience/interceptor"
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	reader, mp := newMeterReader()
	srv, err := New(WithIdempotency(Idempotency{Store: store, Scope: SharedScope}), WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{})),
		WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	client := serveLimited(t, &idemEcho{}, srv)
	if _, err := client.Echo(context.Background(), &echov1.EchoRequest{Message: "m"}); err != nil {
		t.Fatal(err)
	}
	testserver.WantScope(t, reader, scope)
}
