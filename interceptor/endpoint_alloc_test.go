package interceptor

import (
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestEndpointPolicyTrailAllocations pins what the endpoint policy costs a
// call, exactly, against the same call through the same Client on a
// channel with grpc's default policy, over bufconn to one server: a unary
// call that may retry pays one allocation, its trail (package trail; the
// policy's pick and Done allocate nothing, TestPickAndDoneAllocateNothing
// in package endpoint); a unary call that sends one attempt carries no
// trail and pays nothing; a stream that may retry holds its trail inside
// the stream's own allocation and pays nothing.
func TestEndpointPolicyTrailAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("exact allocation counts need the race detector off: with it, sync.Pool drops items at random")
	}
	var srv leanEcho
	retrying := newTestClient(t, WithRetryPolicy(fastPolicy(4)), WithRetryBudget(nil))
	single := newTestClient(t)
	hedging := newTestClient(t, WithMethodConfig(serviceconfig.MethodConfig{
		Name:          []serviceconfig.Name{{Service: echoService}},
		HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: time.Hour}, // one copy sent
	}))
	unary := func(c echov1.EchoServiceClient) { unaryOnce(t, c, floorUnaryReq) }
	stream := func(c echov1.EchoServiceClient) { streamOnce(t, c, floorStreamReq) }
	tests := []struct {
		name  string
		c     *Client
		call  func(echov1.EchoServiceClient)
		extra float64
	}{
		{"unary, maxAttempts 4", retrying, unary, 1},
		{"unary, one attempt", single, unary, 0},
		{"server stream, maxAttempts 4", retrying, stream, 0},
		{"unary, hedged", hedging, unary, 1},
	}
	// measure dials a channel (every one has the same target), warms it up
	// and counts a call's allocations.
	measure := func(call func(echov1.EchoServiceClient), opts ...grpc.DialOption) float64 {
		cc := testserver.Start(t, srv, opts...)
		defer cc.Close() // the endpoint policy's want of trails ends with it
		stub := echov1.NewEchoServiceClient(cc)
		for range 3 { // connection up, policies resolved
			call(stub)
		}
		return testing.AllocsPerRun(300, func() { call(stub) })
	}
	for _, tt := range tests {
		// The default policy's channel first: no endpoint policy on its
		// target wants trails (trail.Wanted) while it runs.
		plain := measure(tt.call, tt.c.DialOptions()...)
		ep := measure(tt.call, append(tt.c.DialOptions(), lbDial(`{}`))...)
		t.Logf("%s: default policy %v allocs per call, endpoint policy %v", tt.name, plain, ep)
		if ep-plain != tt.extra {
			t.Errorf("%s: endpoint policy %v allocs per call, default %v: +%v, want exactly +%v", tt.name, ep, plain, ep-plain, tt.extra)
		}
	}
}
