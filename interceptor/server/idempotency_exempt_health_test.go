package server

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
)

// serveHealthIdem serves grpc's health service behind a Server with
// idempotency on a memory store and the key policies, and returns a health
// client and the health server.
func serveHealthIdem(t *testing.T, policies map[string]KeyPolicy) (healthpb.HealthClient, *health.Server) {
	t.Helper()
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(WithIdempotency(Idempotency{Store: store, Scope: SharedScope, KeyPolicies: policies}))
	if err != nil {
		t.Fatal(err)
	}
	hs := health.NewServer()
	cc := testserver.ServeWith(t, []grpc.ServerOption{grpc.ChainUnaryInterceptor(s.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(s.StreamServerInterceptor())}, func(gs *grpc.Server) { healthpb.RegisterHealthServer(gs, hs) })
	return healthpb.NewHealthClient(cc), hs
}

// TestServerIdempotencySkipsHealthChecks pins that the server's
// idempotency leaves grpc's health checks alone by default, as the client
// exempts DefaultExemptServices: a probe with a reused key (grpcurl -H
// 'idempotency-key: …' sends it on every call) must see the current
// status, not a stored one, and a key policy for every method ("") must
// not refuse the probes of a load balancer, which send no key. Before: the
// second keyed check replayed SERVING after the status went NOT_SERVING,
// and with "" Required a keyless check got INVALID_ARGUMENT; after,
// NOT_SERVING and SERVING.
func TestServerIdempotencySkipsHealthChecks(t *testing.T) {
	t.Run("a reused key", func(t *testing.T) {
		hc, hs := serveHealthIdem(t, nil)
		ctx := metadata.AppendToOutgoingContext(t.Context(), "idempotency-key", "probe")
		if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Check() = %v, %v, want SERVING", r, err)
		}
		hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("Check() with the same key after the status changed = %v, %v, want NOT_SERVING", r, err)
		}
	})
	t.Run(`"" Required`, func(t *testing.T) {
		hc, _ := serveHealthIdem(t, map[string]KeyPolicy{"": KeyRequired})
		if r, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check() without a key, every method Required = %v, %v (%v), want SERVING", r, err, status.Code(err))
		}
	})
	t.Run("named, it applies", func(t *testing.T) {
		hc, _ := serveHealthIdem(t, map[string]KeyPolicy{"grpc.health.v1.Health": KeyRequired})
		if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("Check() without a key, Health Required by name = %v, want INVALID_ARGUMENT", err)
		}
	})
}
