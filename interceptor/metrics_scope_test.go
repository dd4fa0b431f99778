package interceptor

import (
	"testing"
	"testing/synctest"

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
		testserver.WantScope(t, reader, scope)
	})
}
