package resiliencetest_test

import (
	"testing"
	"testing/synctest"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
)

// TestClusterSpreadsCallsAndReportsEachBackendAsPeer pins the cluster:
// round_robin reaches every backend, each backend counts its own attempts,
// and the client's peer is the backend's resolver address.
func TestClusterSpreadsCallsAndReportsEachBackendAsPeer(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts []resiliencetest.ClusterOption
	}{{"bufconn", nil}, {"loopback TCP", []resiliencetest.ClusterOption{resiliencetest.WithLoopbackTCP()}}} {
		t.Run(tt.name, func(t *testing.T) {
			cl := resiliencetest.StartCluster(t, 3, []grpc.DialOption{
				grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"round_robin": {}}]}`)}, tt.opts...)
			peers := map[string]bool{}
			for range 30 {
				var p peer.Peer
				if _, err := cl.EchoClient().Echo(t.Context(), &echov1.EchoRequest{Message: "x"}, grpc.Peer(&p), grpc.WaitForReady(true)); err != nil {
					t.Fatal(err)
				}
				peers[p.Addr.String()] = true
			}
			total := 0
			for i, n := range cl.Counts(resiliencetest.EchoMethod) {
				if n == 0 {
					t.Errorf("backend %d got no call", i)
				}
				total += n
				if !peers[cl.Addrs[i]] {
					t.Errorf("no call reported backend %d's address %q as its peer; peers %v", i, cl.Addrs[i], peers)
				}
			}
			if total != 30 {
				t.Errorf("%d attempts counted, want 30", total)
			}
		})
	}
}

func TestClusterInSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl := resiliencetest.StartCluster(t, 2, nil)
		if _, err := cl.EchoClient().Echo(t.Context(), &echov1.EchoRequest{Message: "x"}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
	})
}
