package endpoint_test

import (
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/grpc-resilience/resilience/interceptor/endpoint"
	"github.com/grpc-resilience/resilience/interceptor/internal/trail"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
)

// TestClosedChannelLeavesNoSnapshot pins the policy's one registration:
// a channel's entry in Snapshots goes with the channel, and no goroutine
// stays (the package's goleak).
func TestClosedChannelLeavesNoSnapshot(t *testing.T) {
	cl, stop, err := resiliencetest.ServeCluster(2, nil,
		resiliencetest.WithServiceConfig(`{"loadBalancingConfig": [{"resilience_endpoint": {}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.EchoClient().Echo(t.Context(), &echov1.EchoRequest{Message: "x"}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	has := func() bool {
		for _, s := range endpoint.Snapshots(time.Now()) {
			if s.Target == cl.Conn.Target() {
				return true
			}
		}
		return false
	}
	if !has() {
		t.Fatal("no snapshot for a live channel")
	}
	if !trail.Wanted(cl.Conn.Target()) {
		t.Fatal("the Client is not told that the live channel's policy reads trails")
	}
	stop()
	if has() {
		t.Fatal("a closed channel's snapshot stayed")
	}
	if trail.Wanted(cl.Conn.Target()) {
		t.Fatal("a closed channel's policy still asks for trails (trail.Want not released)")
	}
}

// TestUnknownChildPolicyIsRefusedByTheChannel pins that grpc refuses the
// service config with the policy's JSON path error.
func TestUnknownChildPolicyIsRefusedByTheChannel(t *testing.T) {
	_, _, err := resiliencetest.ServeCluster(2, nil, resiliencetest.WithServiceConfig(
		`{"loadBalancingConfig": [{"resilience_endpoint": {"childPolicy": [{"weighted_round_robin": {}}]}}]}`))
	if err == nil {
		t.Fatal("grpc.NewClient accepted a child policy the endpoint policy does not support")
	}
	t.Log(err)
}
