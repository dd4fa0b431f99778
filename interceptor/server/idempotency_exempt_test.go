package server

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/wire"
)

// idemClaimCount wraps a store and counts its claims.
type idemClaimCount struct {
	idempotency.Store
	claims chan idempotency.RecordKey // receives each claimed key, without blocking
}

func (s *idemClaimCount) Claim(ctx context.Context, k idempotency.RecordKey, fp []byte, lease time.Duration) (idempotency.Claim, error) {
	select {
	case s.claims <- k:
	default:
	}
	return s.Store.Claim(ctx, k, fp, lease)
}

// TestIdempotencySkipsHealthAndReflection pins item 6 of issue 24 on the
// server: a keyed health check was claimed and its answer stored, so the
// same key replayed SERVING after the server had turned NOT_SERVING (and a
// server requiring keys refused keyless health checks). Now health and
// reflection (DefaultExemptServices) are never claimed or replayed unless
// a key policy names them, as the client's exemptions do; even a server
// whose every method requires a key answers their keyless calls.
func TestIdempotencySkipsHealthAndReflection(t *testing.T) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	spy := &idemClaimCount{Store: store, claims: make(chan idempotency.RecordKey, 16)}
	srv, err := New(WithIdempotency(Idempotency{
		Store:       spy,
		Scope:       SharedScope,
		KeyPolicies: map[string]KeyPolicy{"": KeyRequired},
	}))
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(srv.StreamServerInterceptor()))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cc.Close(); gs.Stop(); <-served }()

	ctx := idemCtx(t)
	keyed := metadata.AppendToOutgoingContext(ctx, wire.IdempotencyKeyHeader, "probe-1")
	check := func(ctx context.Context) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("health Check: %v", err)
		}
		return r.GetStatus()
	}
	if got := check(keyed); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first keyed Check = %v, want SERVING", got)
	}
	hs.Shutdown() // NOT_SERVING
	if got := check(keyed); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("keyed Check with the same key after the server turned NOT_SERVING = %v: a replay, want NOT_SERVING", got)
	}
	if got := check(ctx); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("keyless Check on a server requiring keys = %v, want NOT_SERVING", got)
	}

	// Reflection, keyed, as grpcurl with -H 'idempotency-key: ...' lists
	// services.
	stream, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(keyed)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || len(r.GetListServicesResponse().GetService()) == 0 {
		t.Errorf("keyed reflection ListServices = %v, %v; want the services", r, err)
	}
	_ = stream.CloseSend()
	if _, err := stream.Recv(); err != io.EOF {
		t.Errorf("reflection stream end = %v, want EOF", err)
	}
	select {
	case k := <-spy.claims:
		t.Errorf("%s was claimed, want health and reflection never claimed", k.FullMethod)
	default:
	}

	// A policy that names the service explicitly wins over the exemption.
	named, err := New(WithIdempotency(Idempotency{
		Store:       store,
		Scope:       SharedScope,
		KeyPolicies: map[string]KeyPolicy{"grpc.health.v1.Health": KeyRequired},
	}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = named.UnaryServerInterceptor()(context.Background(), &healthpb.HealthCheckRequest{},
		&grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"},
		func(context.Context, any) (any, error) { return &healthpb.HealthCheckResponse{}, nil })
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("keyless Check under an explicit Required policy for the service = %v, want INVALID_ARGUMENT", err)
	}
}
