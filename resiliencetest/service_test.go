package resiliencetest_test

import (
	"context"
	"net"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/grpc-resilience/resilience/faultinject"
	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

const (
	healthCheck = "/grpc.health.v1.Health/Check"
	healthWatch = "/grpc.health.v1.Health/Watch"
)

// registerHealth returns a registrar of grpc's health service, SERVING.
func registerHealth() func(*grpc.Server) {
	hs := health.NewServer()
	return func(s *grpc.Server) { healthgrpc.RegisterHealthServer(s, hs) }
}

func retrying(t *testing.T, maxAttempts int) *interceptor.Client {
	t.Helper()
	c, err := interceptor.NewClient(interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{
		MaxAttempts: maxAttempts, InitialBackoff: time.Second, RetryableStatusCodes: []codes.Code{codes.Unavailable},
	}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRegisteredServiceIsScriptedAndRecorded pins a Server of a service
// that is not echo: its attempts are recorded per method (count,
// grpc-previous-rpc-attempts, metadata, Handled), and its script fails the
// first two before the handler, which answers the third.
func TestRegisteredServiceIsScriptedAndRecorded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := resiliencetest.NewServer(registerHealth())
		srv.Script(healthCheck, resiliencetest.FailTimes(2, codes.Unavailable)...)
		conn := resiliencetest.Start(t, srv, retrying(t, 3).DialOptions())
		ctx := metadata.AppendToOutgoingContext(t.Context(), "tenant", "blue")
		resp, err := healthgrpc.NewHealthClient(conn).Check(ctx, &healthgrpc.HealthCheckRequest{})
		if err != nil || resp.GetStatus() != healthgrpc.HealthCheckResponse_SERVING {
			t.Fatalf("Check = %v, %v; want SERVING from the handler on the third attempt", resp, err)
		}
		resiliencetest.RequireAttempts(t, srv, healthCheck, 3)
		resiliencetest.RequirePreviousAttempts(t, srv, healthCheck, -1, 1, 2)
		for _, a := range srv.Attempts(healthCheck) {
			if !a.Handled || slices.Compare(a.MD.Get("tenant"), []string{"blue"}) != 0 {
				t.Errorf("attempt %d: Handled %v, tenant %q; want true, [blue]", a.N, a.Handled, a.MD.Get("tenant"))
			}
		}
		if n := len(srv.Attempts(resiliencetest.EchoMethod)); n != 0 {
			t.Errorf("%d echo attempts recorded, want 0", n)
		}
		_, err = echov1.NewEchoServiceClient(conn).Echo(t.Context(), &echov1.EchoRequest{})
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("Echo on a Server of the health service = %v, want UNIMPLEMENTED (no echo service beside it)", err)
		}
	})
}

// TestRegisteredStreamFailsAfterResponses pins Step.After on a
// server-streaming method that is not echo's: the handler's responses
// past After are refused and the stream fails with the step's status.
func TestRegisteredStreamFailsAfterResponses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hs := health.NewServer()
		srv := resiliencetest.NewServer(func(s *grpc.Server) { healthgrpc.RegisterHealthServer(s, hs) })
		srv.Script(healthWatch, resiliencetest.Step{Code: codes.Unavailable, Message: "backend going away", After: 1})
		conn := resiliencetest.Start(t, srv, nil)
		watch, err := healthgrpc.NewHealthClient(conn).Watch(t.Context(), &healthgrpc.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		first, err := watch.Recv()
		if err != nil || first.GetStatus() != healthgrpc.HealthCheckResponse_SERVING {
			t.Fatalf("first Watch response = %v, %v; want SERVING", first, err)
		}
		hs.SetServingStatus("", healthgrpc.HealthCheckResponse_NOT_SERVING) // a second response, refused
		if _, err := watch.Recv(); status.Code(err) != codes.Unavailable {
			t.Fatalf("after 1 response, Watch = %v, want UNAVAILABLE", err)
		}
	})
}

// TestRegisteredServiceCountsAttemptsFaultinjectAborts pins the recording
// with faultinject's server interceptors in front of a registered service:
// the attempts the injector aborts count (Handled false) and take no step.
func TestRegisteredServiceCountsAttemptsFaultinjectAborts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inj, err := faultinject.New(faultinject.Config{Seed: 8, Faults: []faultinject.Fault{{
			Methods: []string{healthCheck},
			Abort:   &faultinject.Abort{Code: codes.Unavailable, Rate: 0.5},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		srv := resiliencetest.NewServer(registerHealth())
		srv.Script(healthCheck, resiliencetest.Step{Code: codes.Unavailable})
		conn := resiliencetest.Start(t, srv, retrying(t, 5).DialOptions(),
			grpc.ChainUnaryInterceptor(inj.UnaryServerInterceptor()))
		if _, err := healthgrpc.NewHealthClient(conn).Check(t.Context(), &healthgrpc.HealthCheckRequest{}); err != nil {
			t.Fatalf("Check = %v, want success", err)
		}
		var handled []bool
		for _, a := range srv.Attempts(healthCheck) {
			handled = append(handled, a.Handled)
		}
		// Seed 8 aborts the first two attempts (as in Example_faultinject).
		if want := []bool{false, false, true, true}; !slices.Equal(handled, want) || inj.Counts().Aborts != 2 {
			t.Errorf("Handled = %v with %d aborts, want %v with 2: the injector aborted two, the script failed the next",
				handled, inj.Counts().Aborts, want)
		}
	})
}

// TestClusterOfARegisteredService pins WithService: each backend serves
// its own implementation, records its attempts, and takes its own script.
func TestClusterOfARegisteredService(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		servers := []*health.Server{health.NewServer(), health.NewServer(), health.NewServer()}
		servers[2].SetServingStatus("", healthgrpc.HealthCheckResponse_NOT_SERVING)
		cl := resiliencetest.StartCluster(t, 3, nil, resiliencetest.WithService(func(i int, s *grpc.Server) {
			healthgrpc.RegisterHealthServer(s, servers[i])
		}))
		cl.Backends[0].OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
			return resiliencetest.Step{Code: codes.Unavailable}
		})
		got := map[string]int{}
		hc := healthgrpc.NewHealthClient(cl.Conn)
		for range 9 {
			resp, err := hc.Check(t.Context(), &healthgrpc.HealthCheckRequest{})
			got[status.Code(err).String()+"/"+resp.GetStatus().String()]++
		}
		want := map[string]int{"Unavailable/UNKNOWN": 3, "OK/SERVING": 3, "OK/NOT_SERVING": 3}
		if len(got) != len(want) || got["Unavailable/UNKNOWN"] != 3 || got["OK/SERVING"] != 3 || got["OK/NOT_SERVING"] != 3 {
			t.Errorf("9 round-robin Checks answered %v, want %v", got, want)
		}
		if c := cl.Counts(healthCheck); !slices.Equal(c, []int{3, 3, 3}) {
			t.Errorf("Counts(%s) = %v, want [3 3 3]", healthCheck, c)
		}
	})
}

// TestServerRegisteredByHandStillPlaysItsSteps pins the echo Server on a
// grpc.Server that Start did not build (registered by hand, as
// faultinject's tests do): it records and plays its steps in its handlers.
func TestServerRegisteredByHandStillPlaysItsSteps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := resiliencetest.NewServer()
		srv.Script(resiliencetest.EchoMethod, resiliencetest.FailTimes(1, codes.Unavailable)...)
		srv.Script(resiliencetest.ServerStreamMethod, resiliencetest.Step{Code: codes.Aborted, After: 2})
		lis := bufconn.Listen(1 << 16)
		gs := grpc.NewServer()
		echov1.RegisterEchoServiceServer(gs, srv)
		go func() { _ = gs.Serve(lis) }()
		defer gs.Stop()
		conn, err := grpc.NewClient("passthrough:///by-hand",
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ec := echov1.NewEchoServiceClient(conn)
		var codesGot []codes.Code
		for range 2 {
			_, err := ec.Echo(t.Context(), &echov1.EchoRequest{})
			codesGot = append(codesGot, status.Code(err))
		}
		if want := []codes.Code{codes.Unavailable, codes.OK}; !slices.Equal(codesGot, want) {
			t.Errorf("Echo codes = %v, want %v", codesGot, want)
		}
		st, err := ec.ServerStream(t.Context(), &echov1.ServerStreamRequest{Count: 5})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for ; ; n++ {
			if _, err = st.Recv(); err != nil {
				break
			}
		}
		if n != 2 || status.Code(err) != codes.Aborted {
			t.Errorf("ServerStream: %d responses then %v, want 2 then ABORTED", n, err)
		}
		resiliencetest.RequireAttempts(t, srv, resiliencetest.EchoMethod, 2)
	})
}
