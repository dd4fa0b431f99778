package server

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// serveEchoAndHealth serves impl and grpc's health service behind srv's
// interceptors over bufconn, and returns their clients.
func serveEchoAndHealth(t *testing.T, impl echov1.EchoServiceServer, srv *Server) (echov1.EchoServiceClient, healthpb.HealthClient) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(srv.StreamServerInterceptor()))
	echov1.RegisterEchoServiceServer(gs, impl)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close(); gs.Stop(); <-done })
	return echov1.NewEchoServiceClient(cc), healthpb.NewHealthClient(cc)
}

// checkServing asks hc for the server's health, as a kubelet's gRPC probe
// does (1s deadline, SHEDDABLE: a probe claims nothing), and fails t unless
// the answer is SERVING.
func checkServing(t *testing.T, hc healthpb.HealthClient, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(wire.ContextWithCriticality(context.Background(), wire.Sheddable), time.Second)
	defer cancel()
	r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("%s: Check() = %v, %v (%v), want SERVING", what, r, err, status.Code(err))
	}
}

// TestOverloadProtectionNeverShedsHealthChecks (review r24): an overloaded
// server still answers its health checks. Shed, a probe tells Kubernetes
// the pod is dead; the restart moves its load onto the other replicas and
// the outage grows. The concurrency limit (full, and with a door that
// rejects short deadlines) and the CPU shedding (hot, over its
// bandwidth-delay product) exempt grpc.health.v1.Health and reflection, as
// idempotency and faultinject do; an echo call beside the probe is shed,
// so the protection is on. A limit that names the health service is kept:
// that is the operator's explicit choice. Before: the probes got
// RESOURCE_EXHAUSTED (limit, CPU); after: SERVING.
func TestOverloadProtectionNeverShedsHealthChecks(t *testing.T) {
	t.Run("concurrency limit", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			impl := &blockingEcho{started: make(chan struct{}, 1), release: make(chan struct{})}
			echo, hc := serveEchoAndHealth(t, impl, limitOfOne(t))
			held := make(chan error)
			go func() {
				_, err := echo.Echo(context.Background(), &echov1.EchoRequest{Message: "holds the slot"})
				held <- err
			}()
			<-impl.started
			if _, err := echo.Echo(context.Background(), &echov1.EchoRequest{Message: "over"}); status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("echo over the limit: %v, want RESOURCE_EXHAUSTED", err)
			}
			checkServing(t, hc, "limit full")
			close(impl.release)
			if err := <-held; err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("door", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// Calls of 2s teach the door a service time of 2s: a probe's 1s
			// deadline would be shorter.
			srv, err := New(WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{})))
			if err != nil {
				t.Fatal(err)
			}
			echo, hc := serveEchoAndHealth(t, &blockingEcho{svc: 2 * time.Second}, srv)
			for range 3 {
				if _, err := echo.Echo(context.Background(), &echov1.EchoRequest{Message: "slow"}); err != nil {
					t.Fatal(err)
				}
			}
			// The door lets one short call through per service time, to see
			// whether the service has become fast again: it runs out its
			// deadline. The next is refused.
			_ = echoWithin(echo, time.Second, "let through")
			if err := echoWithin(echo, time.Second, "short"); !isDoorReject(err) {
				t.Fatalf("echo with 1s left: %v, want DEADLINE_EXCEEDED at the door", err)
			}
			checkServing(t, hc, "door at 2s")
			time.Sleep(2 * time.Second) // the call let through ends
		})
	})
	t.Run("CPU shedding", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var hot atomic.Bool
			srv := newLimitServer(t, Limits{CPU: &CPUShedding{CPU: func() float64 {
				if hot.Load() {
					return 1
				}
				return 0
			}}})
			impl := &blockingEcho{svc: 10 * time.Millisecond}
			echo, hc := serveEchoAndHealth(t, impl, srv)
			// One call at a time for 1.2s: a bandwidth-delay product of 1.
			for end := time.Now().Add(1200 * time.Millisecond); time.Now().Before(end); {
				if _, err := echo.Echo(context.Background(), &echov1.EchoRequest{Message: "m"}); err != nil {
					t.Fatal(err)
				}
			}
			impl.started, impl.release = make(chan struct{}, 1), make(chan struct{})
			hot.Store(true)
			held := make(chan error)
			go func() {
				_, err := echo.Echo(context.Background(), &echov1.EchoRequest{Message: "held"})
				held <- err
			}()
			<-impl.started
			if _, err := echo.Echo(context.Background(), &echov1.EchoRequest{Message: "over"}); status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("echo with the CPU hot and the product in flight: %v, want RESOURCE_EXHAUSTED", err)
			}
			checkServing(t, hc, "CPU hot")
			close(impl.release)
			if err := <-held; err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("named by a method limit", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := newLimitServer(t, Limits{Config: serviceconfig.ServerConfig{MethodConfig: []serviceconfig.ServerMethodConfig{
				methodLimitOf(t, "grpc.health.v1.Health", serviceconfig.ConcurrencyLimit{InitialLimit: 1, MinLimit: 1, MaxLimit: 1})}}})
			_, hc := serveEchoAndHealth(t, &blockingEcho{}, srv)
			checkServing(t, hc, "own limit")
			st := srv.LimitStatuses()
			if len(st) != 1 || st[0].Name != "grpc.health.v1.Health" || st[0].Admitted[wire.Sheddable] != 1 {
				t.Errorf("LimitStatuses() = %+v, want the health service's limit to have admitted the probe", st)
			}
		})
	})
}

// TestLimitExemptionAllocatesNothing pins the cost of the exemption on the
// admitted path: an ordinary method and a health check, under the limit,
// allocate nothing for it.
func TestLimitExemptionAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	srv := limitOfOne(t)
	icpt := srv.UnaryServerInterceptor()
	h := func(context.Context, any) (any, error) { return nil, nil }
	ctx := context.Background()
	for _, m := range []string{"/x.Y/Z", "/grpc.health.v1.Health/Check", "/grpc.other.Svc/M"} {
		info := &grpc.UnaryServerInfo{FullMethod: m}
		if n := testing.AllocsPerRun(1000, func() { _, _ = icpt(ctx, nil, info, h) }); n != 0 {
			t.Errorf("allocs per call of %s = %v, want 0", m, n)
		}
	}
}
