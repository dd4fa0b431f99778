package resiliencetest_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"testing/synctest"

	"google.golang.org/grpc"
	_ "google.golang.org/grpc/balancer/leastrequest"
	_ "google.golang.org/grpc/balancer/weightedroundrobin"
	"google.golang.org/grpc/peer"

	_ "github.com/grpc-resilience/resilience/interceptor/endpoint"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
)

// distinctPeers makes n calls, one at a time, and returns how many
// backends they reached.
func distinctPeers(t *testing.T, cl *resiliencetest.Cluster, n int) int {
	t.Helper()
	seen := map[string]bool{}
	for range n {
		var p peer.Peer
		if _, err := cl.EchoClient().Echo(t.Context(), &echov1.EchoRequest{Message: "x"}, grpc.Peer(&p)); err != nil {
			t.Fatal(err)
		}
		seen[p.Addr.String()] = true
	}
	return len(seen)
}

// TestClusterSpreadsCallsAndReportsEachBackendAsPeer pins the cluster:
// round_robin reaches every backend, each backend counts its own attempts,
// and the client's peer is the backend's resolver address.
//
// It also pins the wait that StartCluster makes (regression: it returned
// before every backend was READY, and the calls of a busy machine went to
// the one or two that were): with no WaitForReady, the first three calls
// already reach the three backends.
func TestClusterSpreadsCallsAndReportsEachBackendAsPeer(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts []resiliencetest.ClusterOption
	}{{"bufconn", nil}, {"loopback TCP", []resiliencetest.ClusterOption{resiliencetest.WithLoopbackTCP()}}} {
		t.Run(tt.name, func(t *testing.T) {
			cl := resiliencetest.StartCluster(t, 3, nil, append(tt.opts,
				resiliencetest.WithServiceConfig(`{"loadBalancingConfig": [{"round_robin": {}}]}`))...)
			if got := distinctPeers(t, cl, 3); got != 3 {
				t.Fatalf("the first 3 calls reached %d backends, want 3: StartCluster returned before every backend was READY", got)
			}
			peers := map[string]bool{}
			for range 27 {
				var p peer.Peer
				if _, err := cl.EchoClient().Echo(t.Context(), &echov1.EchoRequest{Message: "x"}, grpc.Peer(&p)); err != nil {
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

// TestClusterSpreadsByDefault pins the cluster's default policy:
// round_robin, not grpc's pick_first.
func TestClusterSpreadsByDefault(t *testing.T) {
	cl := resiliencetest.StartCluster(t, 4, nil)
	if got := distinctPeers(t, cl, 4); got != 4 {
		t.Fatalf("4 calls reached %d backends, want 4", got)
	}
}

// TestClusterWithPickFirstWaitsForTheBackendItPicks pins the wait under a
// policy that connects to one backend: StartCluster returns (it does not
// wait for the backends pick_first never connects to) and every call goes
// to the first backend.
func TestClusterWithPickFirstWaitsForTheBackendItPicks(t *testing.T) {
	cl := resiliencetest.StartCluster(t, 3, nil,
		resiliencetest.WithServiceConfig(`{"loadBalancingPolicy": "pick_first"}`))
	distinctPeers(t, cl, 6)
	if got := cl.Counts(""); got[0] != 6 {
		t.Fatalf("pick_first: attempts per backend %v, want all 6 on backend 0", got)
	}
}

// TestClusterRefusesADialOptionThatReplacesItsServiceConfig pins that a
// service config given as a dial option, which would replace the one by
// which the cluster waits, is an error naming the option to use.
func TestClusterRefusesADialOptionThatReplacesItsServiceConfig(t *testing.T) {
	_, _, err := resiliencetest.ServeCluster(2, []grpc.DialOption{
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"round_robin": {}}]}`)})
	if err == nil || !strings.Contains(err.Error(), "WithServiceConfig") {
		t.Fatalf("ServeCluster with grpc.WithDefaultServiceConfig: err = %v, want one naming resiliencetest.WithServiceConfig", err)
	}
}

// TestClusterNamesTheBackendsThatFailToConnect pins the wait's end when a
// backend cannot be reached: an error naming each, not a hang.
func TestClusterNamesTheBackendsThatFailToConnect(t *testing.T) {
	refuse := grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) {
		return nil, errors.New("dial refused by the test")
	})
	_, _, err := resiliencetest.ServeCluster(2, []grpc.DialOption{refuse})
	if err == nil {
		t.Fatal("ServeCluster returned although no backend could be reached")
	}
	for _, want := range []string{"backend 0 (backend-0):", "backend 1 (backend-1):", "dial refused by the test"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ServeCluster: err = %v, want it to contain %q", err, want)
		}
	}
}

// TestSetEndpointsWaitsForTheBackendsItAdds pins SetEndpoints' wait: the
// backends it lists again are READY when it returns.
func TestSetEndpointsWaitsForTheBackendsItAdds(t *testing.T) {
	cl := resiliencetest.StartCluster(t, 3, nil)
	if err := cl.SetEndpoints(1); err != nil {
		t.Fatal(err)
	}
	if got := distinctPeers(t, cl, 3); got != 1 {
		t.Fatalf("with one endpoint listed, 3 calls reached %d backends", got)
	}
	if err := cl.SetEndpoints(0, 1, 2); err != nil {
		t.Fatal(err)
	}
	if got := distinctPeers(t, cl, 3); got != 3 {
		t.Fatalf("after SetEndpoints(0, 1, 2), the first 3 calls reached %d backends, want 3", got)
	}
}

// TestSetServiceConfigWaitsForTheNewPolicy pins SetServiceConfig's wait
// when the policy changes (its new connections are READY when it returns),
// that a config naming no policy keeps the cluster's, and that a stopped
// backend is not waited for.
func TestSetServiceConfigWaitsForTheNewPolicy(t *testing.T) {
	cl := resiliencetest.StartCluster(t, 3, nil)
	if err := cl.SetServiceConfig(`{"loadBalancingConfig": [{"pick_first": {}}]}`); err != nil {
		t.Fatal(err)
	}
	if got := distinctPeers(t, cl, 3); got != 1 {
		t.Fatalf("pick_first: 3 calls reached %d backends, want 1", got)
	}
	if err := cl.SetServiceConfig(`{"loadBalancingConfig": [{"round_robin": {}}]}`); err != nil {
		t.Fatal(err)
	}
	if got := distinctPeers(t, cl, 3); got != 3 {
		t.Fatalf("back to round_robin, the first 3 calls reached %d backends, want 3", got)
	}
	if err := cl.SetServiceConfig(`{"methodConfig": []}`); err != nil {
		t.Fatal(err)
	}
	if got := distinctPeers(t, cl, 3); got != 3 {
		t.Fatalf("a config naming no policy: 3 calls reached %d backends, want 3 (the cluster's round_robin)", got)
	}
	cl.StopBackend(2)
	if err := cl.SetServiceConfig(`{"loadBalancingConfig": [{"pick_first": {}}]}`); err != nil {
		t.Fatalf("SetServiceConfig with backend 2 stopped: %v, want no wait for it", err)
	}
}

func TestClusterInSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl := resiliencetest.StartCluster(t, 2, nil)
		if got := distinctPeers(t, cl, 2); got != 2 {
			t.Fatalf("in a bubble, the first 2 calls reached %d backends, want 2", got)
		}
	})
}

// TestClusterWaitsUnderEachPolicy pins the wait under grpc's policies and
// ours: ServeCluster returns, with every backend the policy connects to
// READY, and calls succeed; the policies that spread reach every backend
// with their first calls. Policies that wrap SubConns or build producers
// on them (weighted_round_robin's ORCA listener) work behind the
// cluster's parent policy.
func TestClusterWaitsUnderEachPolicy(t *testing.T) {
	for _, tt := range []struct {
		policy string
		spread int // backends the first 3 calls reach; 0: not checked
	}{
		{`[{"round_robin": {}}]`, 3},
		{`[{"pick_first": {}}]`, 1},
		{`[{"resilience_endpoint": {}}]`, 3},
		{`[{"resilience_endpoint": {"childPolicy": [{"pick_first": {}}]}}]`, 0},
		{`[{"weighted_round_robin": {}}]`, 0},
		{`[{"least_request_experimental": {}}]`, 0},
		{`[{"no_such_policy": {}}, {"round_robin": {}}]`, 3},
	} {
		t.Run(tt.policy, func(t *testing.T) {
			cl := resiliencetest.StartCluster(t, 3, nil,
				resiliencetest.WithServiceConfig(`{"loadBalancingConfig": `+tt.policy+`}`))
			if got := distinctPeers(t, cl, 3); tt.spread > 0 && got != tt.spread {
				t.Errorf("the first 3 calls reached %d backends, want %d", got, tt.spread)
			}
			distinctPeers(t, cl, 6)
		})
	}
}
