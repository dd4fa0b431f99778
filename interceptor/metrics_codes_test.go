package interceptor

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestMetricsStatusLabelIsBoundedWhateverTheServerSends pins REVIEW.md
// class 4 on grpc.status: grpc-go hands a caller whatever number a server
// (or a proxy relaying its backend) writes in grpc-status, and
// resilience.client.attempts labelled each code outside the 17 with its
// own "Code(n)", so a server sending 200 distinct codes made 200 attribute
// sets (and allocated a set on every such attempt). Codes outside the 17
// are not gRPC codes: they are recorded as UNKNOWN, as grpc-java reads
// them.
func TestMetricsStatusLabelIsBoundedWhateverTheServerSends(t *testing.T) {
	reader, mp := newMeterReader()
	srv := &testserver.Server{}
	srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
		return testserver.Outcome{Err: status.Error(codes.Code(1000+a.N), "a code of its own")}
	})
	stub, _ := newEcho(t, srv, WithMeterProvider(mp), WithRetryPolicy(fastPolicy(2)))
	const calls = 200
	for range calls {
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); status.Code(err) < 1000 {
			t.Fatalf("Echo() = %v, want the server's own code", err)
		}
	}
	got := collect(t, reader)
	got.Expect(t, metricAttempts, "{attempt}", map[string]float64{
		echoMethodAttr + ",grpc.status=UNKNOWN": calls,
	})
}
