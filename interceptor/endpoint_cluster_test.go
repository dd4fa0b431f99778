package interceptor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/endpoint"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// These tests run the endpoint load-balancing policy (package
// interceptor/endpoint) over real gRPC: a cluster of bufconn backends
// behind a manual resolver, with the Client's interceptors on the
// connection, inside testing/synctest so that ejection times pass on the
// bubble's clock.

// lbConfig returns a service config selecting the endpoint policy with
// the given JSON object.
func lbConfig(policy string) resiliencetest.ClusterOption {
	return resiliencetest.WithServiceConfig(`{"loadBalancingConfig": [{"` + endpoint.Name + `": ` + policy + `}]}`)
}

// noEjection is a policy that ejects nothing in these tests' volumes: they
// see the avoidance of tried endpoints alone.
const noEjection = `{"consecutiveFailures": -1, "failurePercentageEjection": {"threshold": 100, "requestVolume": 1000000}}`

// startCluster starts n backends behind the endpoint policy configured by
// policy, with c's interceptors; StartCluster returns once every backend
// is READY.
func startCluster(t *testing.T, n int, c *Client, policy string) *resiliencetest.Cluster {
	t.Helper()
	return resiliencetest.StartCluster(t, n, c.DialOptions(), lbConfig(policy))
}

func snapshotOf(t *testing.T, cl *resiliencetest.Cluster) endpoint.Snapshot {
	t.Helper()
	for _, s := range endpoint.Snapshots(time.Now()) {
		if s.Target == cl.Conn.Target() {
			return s
		}
	}
	t.Fatal("no snapshot for the cluster's connection")
	return endpoint.Snapshot{}
}

func failAlways(code codes.Code) func(resiliencetest.Attempt) resiliencetest.Step {
	return func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Code: code} }
}

// TestRetryGoesToAnEndpointTheCallHasNotUsed pins the avoidance of tried
// endpoints for unary retries: with one backend of three failing every
// call, no retry is sent to it (it sees first attempts only), and every
// call succeeds with maxAttempts 2. Before: a third of the retries went
// back to it.
func TestRetryGoesToAnEndpointTheCallHasNotUsed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
		cl := startCluster(t, 3, c, noEjection)
		cl.Backends[0].OnCall(failAlways(codes.Unavailable))
		client := cl.EchoClient()
		// 16 callers at once, as a real client: the rotation alone would
		// send a third of the retries back to the failing backend.
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for i := range 20 {
					if _, err := client.Echo(t.Context(), &echov1.EchoRequest{Message: "x"}); err != nil {
						t.Errorf("call %d: %v", i, err)
						return
					}
				}
			})
		}
		wg.Wait()
		for _, a := range cl.Backends[0].Attempts(resiliencetest.EchoMethod) {
			if a.Previous > 0 {
				t.Fatalf("the failing backend got a retry (grpc-previous-rpc-attempts %d)", a.Previous)
			}
		}
		if n := len(cl.Backends[0].Attempts(resiliencetest.EchoMethod)); n < 50 {
			t.Fatalf("the failing backend saw %d first attempts of 320, want about 100", n)
		}
		if s := snapshotOf(t, cl); s.AttemptsAvoided == 0 {
			t.Errorf("Snapshot.AttemptsAvoided = 0, want the retries sent elsewhere:\n%s", s)
		}
	})
}

// TestStreamRetryGoesToAnEndpointTheCallHasNotUsed is the same for a
// server stream failing before its first message.
func TestStreamRetryGoesToAnEndpointTheCallHasNotUsed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
		cl := startCluster(t, 3, c, noEjection)
		cl.Backends[0].OnCall(failAlways(codes.Unavailable))
		client := cl.EchoClient()
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for i := range 10 {
					st, err := client.ServerStream(t.Context(), &echov1.ServerStreamRequest{Message: "x", Count: 1})
					if err == nil {
						_, err = st.Recv()
					}
					if err != nil {
						t.Errorf("stream %d: %v", i, err)
						return
					}
				}
			})
		}
		wg.Wait()
		for _, a := range cl.Backends[0].Attempts(resiliencetest.ServerStreamMethod) {
			if a.Previous > 0 {
				t.Fatalf("the failing backend got a retried stream (grpc-previous-rpc-attempts %d)", a.Previous)
			}
		}
	})
}

// TestHedgeGoesToAnotherEndpoint pins that a hedged copy is sent to an
// endpoint no earlier copy of its call went to: with one backend of three
// slow, each call's copies (told apart by a call-id header) land on
// distinct backends, and no call waits for the slow one.
func TestHedgeGoesToAnotherEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryBudget(nil), WithMethodConfig(serviceconfig.MethodConfig{
			Name: []serviceconfig.Name{{Service: echoService}},
			HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 3, HedgingDelay: 10 * time.Millisecond,
				NonFatalStatusCodes: []codes.Code{codes.Unavailable}},
		}))
		cl := startCluster(t, 3, c, noEjection)
		cl.Backends[1].OnCall(func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Delay: time.Second} })
		client := cl.EchoClient()
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Go(func() {
				for i := range 8 {
					id := strconv.Itoa(g*100 + i)
					ctx := metadata.AppendToOutgoingContext(t.Context(), "call-id", id)
					start := time.Now()
					if _, err := client.Echo(ctx, &echov1.EchoRequest{Message: "x"}); err != nil {
						t.Errorf("call %s: %v", id, err)
						return
					}
					if d := time.Since(start); d >= time.Second {
						t.Errorf("call %s took %v: it waited for the slow backend", id, d)
					}
				}
			})
		}
		wg.Wait()
		synctest.Wait()
		time.Sleep(2 * time.Second) // the slow backend's losers end
		seen := map[string]map[int]bool{}
		copies := 0
		for b, srv := range cl.Backends {
			for _, a := range srv.Attempts(resiliencetest.EchoMethod) {
				id := a.MD.Get("call-id")[0]
				if seen[id] == nil {
					seen[id] = map[int]bool{}
				}
				if seen[id][b] {
					t.Fatalf("call %s: two copies on backend %d", id, b)
				}
				seen[id][b] = true
				copies++
			}
		}
		if copies <= 128 {
			t.Fatalf("%d copies for 128 calls: no hedging happened", copies)
		}
	})
}

// TestBadEndpointIsEjectedAndComesBack pins passive ejection over real
// gRPC: a backend failing every call is ejected after
// consecutiveFailures, gets no first attempt while ejected, and is back in
// rotation once its ejection time has passed and it has recovered.
func TestBadEndpointIsEjectedAndComesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
		cl := startCluster(t, 3, c, `{"consecutiveFailures": 3, "baseEjectionTime": "1s"}`)
		var broken atomic.Bool
		broken.Store(true)
		cl.Backends[0].OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
			if broken.Load() {
				return resiliencetest.Step{Code: codes.Unavailable}
			}
			return resiliencetest.Step{}
		})
		client := cl.EchoClient()
		call := func() {
			t.Helper()
			if _, err := client.Echo(t.Context(), &echov1.EchoRequest{Message: "x"}); err != nil {
				t.Fatal(err)
			}
		}
		for range 30 {
			call()
		}
		s := snapshotOf(t, cl)
		if s.Ejections != 1 || s.Endpoints[0].EjectedUntil.IsZero() {
			t.Fatalf("the failing backend is not ejected:\n%s", s)
		}
		before := cl.Counts(resiliencetest.EchoMethod)[0]
		for range 30 {
			call()
			time.Sleep(10 * time.Millisecond) // 300 ms in all: within the ejection
		}
		if got := cl.Counts(resiliencetest.EchoMethod)[0]; got != before {
			t.Fatalf("an ejected backend got %d attempts", got-before)
		}
		broken.Store(false)
		time.Sleep(time.Second) // the ejection ends
		for range 30 {
			call()
		}
		if got := cl.Counts(resiliencetest.EchoMethod)[0]; got-before < 5 {
			t.Fatalf("the recovered backend got %d of 30 calls after its ejection, want about 10", got-before)
		}
		if s := snapshotOf(t, cl); !s.Endpoints[0].EjectedUntil.IsZero() || s.Ejections != 1 {
			t.Fatalf("the recovered backend was ejected again:\n%s", s)
		}
	})
}

// TestWholeClusterOutageEjectsAtMostMaxEjectionPercent pins the strict
// bound: every backend failing, 50% of 3 endpoints ejects one; the calls
// fail with the backends' status, and the Client's breaker still opens on
// them as it does without the policy.
func TestWholeClusterOutageEjectsAtMostMaxEjectionPercent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryBudget(nil), WithMethodConfig(serviceconfig.MethodConfig{
			Name:           []serviceconfig.Name{{Service: echoService}},
			RetryPolicy:    fastPolicy(2),
			CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 40},
		}))
		cl := startCluster(t, 3, c, `{"consecutiveFailures": 2, "maxEjectionPercent": 50}`)
		for _, b := range cl.Backends {
			b.OnCall(failAlways(codes.Unavailable))
		}
		client := cl.EchoClient()
		var open int
		for range 100 {
			_, err := client.Echo(t.Context(), &echov1.EchoRequest{Message: "x"})
			switch {
			case err == nil:
				t.Fatal("a call succeeded against a dead cluster")
			case status.Code(err) != codes.Unavailable:
				t.Fatalf("err = %v, want UNAVAILABLE", err)
			}
			if isOpen(err) {
				open++
			}
			ejected := 0
			for _, e := range snapshotOf(t, cl).Endpoints {
				if !e.EjectedUntil.IsZero() {
					ejected++
				}
			}
			if ejected > 1 {
				t.Fatalf("%d of 3 endpoints ejected, maxEjectionPercent 50", ejected)
			}
		}
		if open == 0 {
			t.Fatal("the breaker never opened on a dead cluster")
		}
		if s := snapshotOf(t, cl); s.Overflow == 0 {
			t.Errorf("no ejection refused by maxEjectionPercent:\n%s", s)
		}
	})
}

func isOpen(err error) bool { return errors.Is(err, ErrCircuitOpen) }

// TestPickFirstChildAvoidsTheTriedEndpoint pins the pick_first child: all
// calls go to the first endpoint in the resolver's order while it works;
// when it fails, retries go to the next, and every call succeeds.
func TestPickFirstChildAvoidsTheTriedEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
		cl := startCluster(t, 3, c, `{"childPolicy": [{"pick_first": {}}], "consecutiveFailures": 1000}`)
		client := cl.EchoClient()
		for range 20 {
			if _, err := client.Echo(t.Context(), &echov1.EchoRequest{Message: "x"}); err != nil {
				t.Fatal(err)
			}
		}
		if got := cl.Counts(resiliencetest.EchoMethod); fmt.Sprint(got) != "[20 0 0]" {
			t.Fatalf("attempts per backend = %v, want [20 0 0]: pick_first's order", got)
		}
		cl.Backends[0].OnCall(failAlways(codes.Unavailable))
		for i := range 20 {
			if _, err := client.Echo(t.Context(), &echov1.EchoRequest{Message: "x"}); err != nil {
				t.Fatalf("call %d with the first backend failing: %v", i, err)
			}
		}
		if got := cl.Counts(resiliencetest.EchoMethod); fmt.Sprint(got) != "[40 20 0]" {
			t.Fatalf("attempts per backend = %v, want [40 20 0]", got)
		}
	})
}

// TestEndpointPolicyConcurrentCallsHoldNothing runs many callers with
// random cancellations against a cluster with a failing backend, and ends
// with nothing held (newTestClient's check) and no goroutine left (the
// package's goleak).
func TestEndpointPolicyConcurrentCallsHoldNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithMethodConfig(serviceconfig.MethodConfig{
			Name:           []serviceconfig.Name{{Service: echoService}},
			RetryPolicy:    fastPolicy(3),
			CircuitBreaker: &serviceconfig.CircuitBreaker{},
			Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 8, MaxQueue: 8, MaxQueueWait: 50 * time.Millisecond},
		}))
		cl := startCluster(t, 3, c, `{"consecutiveFailures": 3, "baseEjectionTime": "0.1s"}`)
		var n atomic.Int64
		cl.Backends[2].OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
			if n.Add(1)%2 == 0 {
				return resiliencetest.Step{Code: codes.Unavailable}
			}
			return resiliencetest.Step{Delay: 5 * time.Millisecond}
		})
		client := cl.EchoClient()
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Go(func() {
				for i := range 20 {
					ctx, cancel := context.WithTimeout(t.Context(), time.Duration(1+(g*7+i)%20)*time.Millisecond)
					_, _ = client.Echo(ctx, &echov1.EchoRequest{Message: "x"})
					cancel()
				}
			})
		}
		wg.Wait()
	})
}
