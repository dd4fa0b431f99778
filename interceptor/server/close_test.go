package server

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestServerCloseStopsItsMetrics pins item 5 of issue 21: a Server kept its
// gauge callbacks registered on the meter provider for ever (it had no
// Close), so after a configuration reload the old and the new Server
// reported under the same labels. Over real gRPC, with a reader of delta
// temporality (a counter reports only what was recorded since the last
// collection): after Close, the provider reports nothing from the closed
// Server, and the Server that replaces it is the only one under the
// labels. Close is idempotent, and calls after it are still served.
func TestServerCloseStopsItsMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader(sdkmetric.WithTemporalitySelector(
		func(sdkmetric.InstrumentKind) metricdata.Temporality { return metricdata.DeltaTemporality }))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	newServer := func(limit int) (*Server, echov1.EchoServiceClient) {
		t.Helper()
		store, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(WithIdempotency(Idempotency{Store: store, Scope: SharedScope}), WithMeterProvider(mp),
			WithLimits(Limits{Config: serviceconfig.ServerConfig{
				ConcurrencyLimit: &serviceconfig.ConcurrencyLimit{InitialLimit: limit, MinLimit: limit, MaxLimit: limit}}}))
		if err != nil {
			t.Fatal(err)
		}
		return s, echov1.NewEchoServiceClient(closeTestServe(t, s))
	}
	call := func(c echov1.EchoServiceClient, key string) {
		t.Helper()
		ctx := metadata.AppendToOutgoingContext(t.Context(), wire.IdempotencyKeyHeader, key)
		if _, err := c.Echo(ctx, &echov1.EchoRequest{Message: "m"}); err != nil {
			t.Fatal(err)
		}
	}

	old, oldClient := newServer(7)
	call(oldClient, "k1")
	got := collect(t, reader)
	got.Expect(t, metricSrvLimitCurrent, "{call}", map[string]float64{"resilience.limiter=server": 7})
	got.Expect(t, metricSrvExecutions, "{call}", map[string]float64{"grpc.method=resilience.echo.v1.EchoService/Echo": 1})

	for range 2 {
		if err := old.Close(); err != nil {
			t.Fatalf("Close() = %v, want nil", err)
		}
	}
	if got := collect(t, reader); len(got) != 0 {
		t.Errorf("after Close, the provider reports %d instruments from the closed Server, want none: %v", len(got), got)
	}

	// A reload: the new Server alone reports under the labels, and the
	// closed one still serves the calls that reach it.
	_, newClient := newServer(9)
	call(newClient, "k2")
	call(oldClient, "k3")
	got = collect(t, reader)
	got.Expect(t, metricSrvLimitCurrent, "{call}", map[string]float64{"resilience.limiter=server": 9})
}

// closeTestServe serves the echo service behind s on bufconn and returns a
// connection to it, both closed when t ends.
func closeTestServe(t *testing.T, s *Server) *grpc.ClientConn {
	t.Helper()
	return testserver.StartWith(t, &idemEcho{}, []grpc.ServerOption{grpc.ChainUnaryInterceptor(s.UnaryServerInterceptor())})
}
