package interceptor_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// quotaEcho is a server over its quota for a minute: it answers every
// call with RESOURCE_EXHAUSTED and a google.rpc.RetryInfo of one minute.
type quotaEcho struct {
	echov1.UnimplementedEchoServiceServer
	calls int
}

func (s *quotaEcho) Echo(context.Context, *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	s.calls++
	st, _ := status.New(codes.ResourceExhausted, "quota exceeded").WithDetails(
		&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Minute)})
	return nil, st.Err()
}

// A rateLimit block paces a method by its server's answer: after a
// RESOURCE_EXHAUSTED with RetryInfo, the method's attempts go one per that
// wait (capped by WithMaxServerPushback, 30s by default), so the next nine
// calls fail at once, locally, instead of each sending a doomed attempt. The block's rate, when set, also limits what
// the client sends.
func ExampleClient_rateLimit() {
	srv := &quotaEcho{}
	dial, stop := serve(srv)
	defer stop()

	cfg, err := serviceconfig.Parse([]byte(`{
  "methodConfig": [{
    "name": [{"service": "resilience.echo.v1.EchoService"}],
    "rateLimit": {"rate": 100, "burst": 10, "maxWait": "0.05s"}
  }]
}`))
	if err != nil {
		panic(err)
	}
	c, err := interceptor.NewClient(interceptor.WithServiceConfig(cfg))
	if err != nil {
		panic(err)
	}
	conn := connect(c, dial) // as ExampleNewClient connects
	defer conn.Close()
	stub := echov1.NewEchoServiceClient(conn)

	local := 0
	for range 10 {
		_, err := stub.Echo(context.Background(), &echov1.EchoRequest{})
		if errors.Is(err, interceptor.ErrRateLimited) {
			local++
		}
	}
	fmt.Println("server calls:", srv.calls, "refused locally:", local)
	_, err = stub.Echo(context.Background(), &echov1.EchoRequest{})
	fmt.Println(status.Code(err), errors.Is(err, interceptor.ErrRateLimited))
	st := c.Status("/resilience.echo.v1.EchoService/Echo").RateLimit
	fmt.Println("paced by", st.Period) // the minute, capped by WithMaxServerPushback
	// Output:
	// server calls: 1 refused locally: 9
	// ResourceExhausted true
	// paced by 30s
}
