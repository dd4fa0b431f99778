package admin

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/interceptor/server"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

func echoReq(msg string) *echov1.EchoRequest { return &echov1.EchoRequest{Message: msg} }

// newLimitedServer is a Server with a server-wide limit of one, tenants by
// x-tenant, its refusals reported to src.
func newLimitedServer(t *testing.T, src *ServerSource) *server.Server {
	t.Helper()
	one := serviceconfig.ConcurrencyLimit{InitialLimit: 1, MinLimit: 1, MaxLimit: 1}
	srv, err := server.New(append(src.Options(), server.WithLimits(server.Limits{Config: serviceconfig.ServerConfig{
		ConcurrencyLimit: &one, TenantFairness: &serviceconfig.TenantFairness{MetadataKey: "x-tenant"}}}))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	src.Attach(srv)
	return srv
}

// holdingEcho holds each Echo of message "hold" until release closes.
type holdingEcho struct {
	echov1.UnimplementedEchoServiceServer
	entered chan struct{}
	release chan struct{}
}

func (e *holdingEcho) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	if req.GetMessage() == "hold" {
		e.entered <- struct{}{}
		select {
		case <-e.release:
		case <-ctx.Done():
		}
	}
	return &echov1.EchoResponse{Message: req.GetMessage()}, nil
}

// serveHolding serves a holdingEcho behind srv over bufconn, starts one
// held call and waits until it is in the handler; release lets it end and
// waits for it.
func serveHolding(t *testing.T, srv *server.Server) (echov1.EchoServiceClient, func()) {
	t.Helper()
	e := &holdingEcho{entered: make(chan struct{}, 1), release: make(chan struct{})}
	cc := testserver.StartWith(t, e, []grpc.ServerOption{grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor())})
	ec := echov1.NewEchoServiceClient(cc)
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = ec.Echo(context.Background(), echoReq("hold")) })
	<-e.entered
	var once sync.Once
	return ec, func() {
		once.Do(func() { close(e.release) })
		wg.Wait()
	}
}

// getPage serves v's handler over loopback HTTP and returns the status and
// body of a GET of path.
func getPage(t *testing.T, v *View, path string) (int, string) {
	t.Helper()
	hs := httptest.NewServer(v.Handler())
	defer hs.Close()
	resp, err := http.Get(hs.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
