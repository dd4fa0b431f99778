package faultinject_test

import (
	"context"
	"net"
	"testing"

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

	"github.com/grpc-resilience/resilience/faultinject"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
)

// serveWithHealth serves the echo service, health and reflection behind
// inj, as examples/server does, and returns a connection to them.
func serveWithHealth(t *testing.T, inj *faultinject.Injector) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(
		grpc.ChainUnaryInterceptor(inj.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(inj.StreamServerInterceptor()))
	echov1.RegisterEchoServiceServer(gs, resiliencetest.NewServer())
	healthpb.RegisterHealthServer(gs, health.NewServer())
	reflection.Register(gs)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-served
	})
	cc, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// healthAndReflection returns the codes of a health check and of a
// reflection request (ListServices) made with ctx.
func healthAndReflection(ctx context.Context, t *testing.T, cc *grpc.ClientConn) (healthCode, reflectionCode codes.Code) {
	t.Helper()
	_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	healthCode = status.Code(err)
	stream, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err == nil {
		// A Send that fails (io.EOF) has its status in the Recv after it.
		_ = stream.Send(&reflectionpb.ServerReflectionRequest{
			MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{ListServices: "*"}})
		_, err = stream.Recv()
		_ = stream.CloseSend()
	}
	return healthCode, status.Code(err)
}

// TestMetadataFaultsSkipHealthAndReflection pins that a per-call fault
// never reaches health checking or reflection: grpcurl sends its -H
// headers on its reflection calls too, so before, grpcurl -H
// 'x-fault-abort: UNAVAILABLE' failed at reflection (UNAVAILABLE) and never
// reached Echo; after, reflection and health answer and Echo fails as asked.
func TestMetadataFaultsSkipHealthAndReflection(t *testing.T) {
	cc := serveWithHealth(t, newInjector(t, faultinject.Config{}, faultinject.WithMetadataFaults()))
	ctx := metadata.AppendToOutgoingContext(t.Context(), faultinject.MetadataAbort, "UNAVAILABLE")
	if h, r := healthAndReflection(ctx, t, cc); h != codes.OK || r != codes.OK {
		t.Errorf("with %s: health = %v, reflection = %v, want OK, OK", faultinject.MetadataAbort, h, r)
	}
	_, err := echov1.NewEchoServiceClient(cc).Echo(ctx, &echov1.EchoRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("Echo with %s = %v, want UNAVAILABLE", faultinject.MetadataAbort, err)
	}
}

// TestFaultForEveryMethodSkipsHealthAndReflection pins that a configured
// fault without methods leaves health and reflection alone, and that one
// naming them reaches them.
func TestFaultForEveryMethodSkipsHealthAndReflection(t *testing.T) {
	everything := faultinject.Config{Faults: []faultinject.Fault{{Abort: &faultinject.Abort{Code: codes.Unavailable}}}}
	cc := serveWithHealth(t, newInjector(t, everything))
	if h, r := healthAndReflection(t.Context(), t, cc); h != codes.OK || r != codes.OK {
		t.Errorf("fault for every method: health = %v, reflection = %v, want OK, OK", h, r)
	}
	if _, err := echov1.NewEchoServiceClient(cc).Echo(t.Context(), &echov1.EchoRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("Echo under a fault for every method = %v, want UNAVAILABLE", err)
	}

	named := faultinject.Config{Faults: []faultinject.Fault{{
		Methods: []string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"},
		Abort:   &faultinject.Abort{Code: codes.Unavailable}}}}
	cc = serveWithHealth(t, newInjector(t, named))
	if h, r := healthAndReflection(t.Context(), t, cc); h != codes.Unavailable || r != codes.Unavailable {
		t.Errorf("fault naming them: health = %v, reflection = %v, want UNAVAILABLE twice", h, r)
	}
}
