package interceptor

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/endpoint"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// These tests put the endpoint policy through what an incident does to a
// channel: resolver updates mid-flight, backends crashing, configuration
// changes, the channel closing under load; each ends with the calls
// recovering and nothing held.

func ejectedCount(s endpoint.Snapshot) int {
	n := 0
	for _, e := range s.Endpoints {
		if !e.EjectedUntil.IsZero() {
			n++
		}
	}
	return n
}

func echoOK(t *testing.T, client echov1.EchoServiceClient, opts ...grpc.CallOption) {
	t.Helper()
	if _, err := client.Echo(t.Context(), &echov1.EchoRequest{Message: "x"}, opts...); err != nil {
		t.Fatal(err)
	}
}

// TestEjectedEndpointRemovedThenReAddedFreesItsShare pins the resolver's
// churn around an ejection: an ejected endpoint the resolver removes no
// longer holds the share maxEjectionPercent allows, so another bad
// endpoint can be ejected; re-added (healthy), it starts afresh in
// rotation, and every call succeeds throughout.
func TestEjectedEndpointRemovedThenReAddedFreesItsShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
		cl := startCluster(t, 3, c, `{"consecutiveFailures": 2, "baseEjectionTime": "60s", "maxEjectionPercent": 50}`)
		client := cl.EchoClient()
		cl.Backends[0].OnCall(failAlways(codes.Unavailable))
		for range 20 {
			echoOK(t, client)
		}
		if s := snapshotOf(t, cl); s.Endpoints[0].EjectedUntil.IsZero() {
			t.Fatalf("backend 0 not ejected:\n%s", s)
		}
		if err := cl.SetEndpoints(1, 2); err != nil {
			t.Fatal(err)
		}
		cl.Backends[0].OnCall(nil)
		cl.Backends[1].OnCall(failAlways(codes.Unavailable))
		for range 20 {
			echoOK(t, client)
		}
		s := snapshotOf(t, cl)
		if len(s.Endpoints) != 2 || s.Endpoints[0].EjectedUntil.IsZero() {
			t.Fatalf("with backend 0 removed, backend 1 (1 of 2, 50%%) is not ejected:\n%s", s)
		}
		if err := cl.SetEndpoints(0, 1, 2); err != nil {
			t.Fatal(err)
		}
		before := cl.Counts(resiliencetest.EchoMethod)[0]
		for range 30 {
			echoOK(t, client)
		}
		if got := cl.Counts(resiliencetest.EchoMethod)[0] - before; got < 10 {
			t.Fatalf("re-added backend 0 got %d of 30 calls, want about 15 (it and backend 2 share them)", got)
		}
		if s := snapshotOf(t, cl); ejectedCount(s) != 1 || !s.Endpoints[0].EjectedUntil.IsZero() {
			t.Fatalf("after backend 0 came back, want only backend 1 ejected:\n%s", s)
		}
	})
}

// TestAllEndpointsRemovedThenBackRecovers pins the resolver listing no
// endpoint mid-flight: waiting calls wait, the channel recovers when the
// endpoints return, and the policy's snapshot follows.
func TestAllEndpointsRemovedThenBackRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(3)), WithRetryBudget(nil))
		cl := startCluster(t, 3, c, `{"consecutiveFailures": 2}`)
		client := cl.EchoClient()
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 10 {
					echoOK(t, client, grpc.WaitForReady(true))
				}
			})
		}
		if err := cl.SetEndpoints(); err != nil {
			t.Fatal(err)
		}
		if s := snapshotOf(t, cl); len(s.Endpoints) != 0 {
			t.Fatalf("snapshot with no endpoint:\n%s", s)
		}
		time.Sleep(100 * time.Millisecond)
		if err := cl.SetEndpoints(2, 1, 0); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		for range 10 {
			echoOK(t, client)
		}
	})
}

// TestBackendKilledMidCallRetriesElsewhere pins a crash: the calls a
// backend is serving when it dies fail there with UNAVAILABLE, and their
// retries succeed on the others; later calls never reach it.
func TestBackendKilledMidCallRetriesElsewhere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
		cl := startCluster(t, 3, c, `{"consecutiveFailures": 2}`)
		cl.Backends[0].OnCall(func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Delay: time.Hour} })
		client := cl.EchoClient()
		var wg sync.WaitGroup
		for range 12 {
			wg.Go(func() { echoOK(t, client) })
		}
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		if n := cl.Counts(resiliencetest.EchoMethod)[0]; n == 0 {
			t.Fatal("no call reached backend 0")
		}
		cl.StopBackend(0)
		wg.Wait()
		for range 20 {
			echoOK(t, client)
		}
	})
}

// TestEveryBackendDownFailsUnavailable pins picks while no endpoint is
// READY (all CONNECTING or TRANSIENT_FAILURE): calls fail with UNAVAILABLE
// and nothing else, and nothing is held.
func TestEveryBackendDownFailsUnavailable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(3)), WithRetryBudget(nil))
		cl := startCluster(t, 3, c, `{"consecutiveFailures": 1, "maxEjectionPercent": 100}`)
		client := cl.EchoClient()
		for i := range 3 {
			cl.StopBackend(i)
		}
		for range 20 {
			_, err := client.Echo(t.Context(), &echov1.EchoRequest{Message: "x"})
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("err = %v, want UNAVAILABLE", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// TestConfigUpdateChangesThePolicyMidFlight pins a service config pushed
// by the resolver while calls run: new ejection knobs keep each endpoint's
// ejection where they allow it (REVIEW class 12; before: any change
// un-ejected every endpoint and forgot the multipliers), and a new child
// policy changes the order of picks.
func TestConfigUpdateChangesThePolicyMidFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
		cl := startCluster(t, 3, c, `{"consecutiveFailures": 2, "baseEjectionTime": "600s"}`)
		client := cl.EchoClient()
		cl.Backends[0].OnCall(failAlways(codes.Unavailable))
		for range 20 {
			echoOK(t, client)
		}
		if s := snapshotOf(t, cl); ejectedCount(s) != 1 {
			t.Fatalf("backend 0 not ejected:\n%s", s)
		}
		cl.Backends[0].OnCall(nil)
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					echoOK(t, client)
					time.Sleep(time.Millisecond)
				}
			})
		}
		sc := func(policy string) string {
			return `{"loadBalancingConfig": [{"` + endpoint.Name + `": ` + policy + `}]}`
		}
		if err := cl.SetServiceConfig(sc(`{"consecutiveFailures": 3, "baseEjectionTime": "600s", "childPolicy": [{"pick_first": {}}]}`)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		s := snapshotOf(t, cl)
		if ejectedCount(s) != 1 || s.Endpoints[0].EjectedUntil.IsZero() || s.ChildPolicy != "pick_first" {
			t.Fatalf("after the config update, want pick_first and backend 0 still ejected:\n%s", s)
		}
		before := cl.Counts(resiliencetest.EchoMethod)
		time.Sleep(100 * time.Millisecond)
		after := cl.Counts(resiliencetest.EchoMethod)
		if after[0] != before[0] || after[2] != before[2] || after[1] == before[1] {
			t.Fatalf("pick_first: attempts per backend went from %v to %v, want backend 1 only (0 is ejected)", before, after)
		}
		close(stop)
		wg.Wait()
		if err := cl.SetServiceConfig(`{"loadBalancingConfig": [{"` + endpoint.Name + `": {"maxEjectionPercent": 101}}]}`); err == nil ||
			!strings.Contains(err.Error(), "resilience_endpoint.maxEjectionPercent") {
			t.Fatalf("a bad config pushed by the resolver: err = %v, want its JSON path", err)
		}
		echoOK(t, client)
	})
}

// TestChannelClosedWhileCallsRunHoldsNothing pins the channel's end under
// load: calls in flight and waiting end, the policy's registration goes
// (Snapshots lists the channel only as idle, with its ejection, until the
// ejection would have ended: grpc closes an idle channel's policy as it
// closes a closed one's), and nothing is held (newTestClient's check).
func TestChannelClosedWhileCallsRunHoldsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(3)), WithRetryBudget(nil))
		targets := map[string]bool{}
		for range 5 {
			cl, stopCluster, err := resiliencetest.ServeCluster(3, c.DialOptions(), lbConfig(`{"consecutiveFailures": 2}`))
			if err != nil {
				t.Fatal(err)
			}
			targets[cl.Conn.Target()] = true
			cl.Backends[1].OnCall(failAlways(codes.Unavailable))
			cl.Backends[2].OnCall(func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Delay: time.Second} })
			client := cl.EchoClient()
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() {
					for range 5 {
						_, _ = client.Echo(t.Context(), &echov1.EchoRequest{Message: "x"}, grpc.WaitForReady(true))
					}
				})
			}
			time.Sleep(20 * time.Millisecond)
			stopCluster()
			wg.Wait()
			for _, s := range endpoint.Snapshots(time.Now()) {
				if s.Target == cl.Conn.Target() && (!s.Idle || ejectedCount(s) == 0) {
					t.Fatalf("a closed channel's policy is still registered (or idle with nothing ejected):\n%s", s)
				}
			}
		}
		time.Sleep(31 * time.Second) // the default baseEjectionTime: every ejection has ended
		for _, s := range endpoint.Snapshots(time.Now()) {
			if targets[s.Target] {
				t.Fatalf("a closed channel's state outlived its ejections:\n%s", s)
			}
		}
	})
}

// TestBusyEndpointIsNeverEjected pins RESOURCE_EXHAUSTED and a server's
// pushback as "busy": a backend answering only that is not ejected, over
// real gRPC.
func TestBusyEndpointIsNeverEjected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryBudget(nil))
		cl := startCluster(t, 3, c, `{"consecutiveFailures": 1}`)
		cl.Backends[0].OnCall(failAlways(codes.ResourceExhausted))
		cl.Backends[1].OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
			return resiliencetest.Step{Code: codes.Unavailable, Trailer: metadata.Pairs("grpc-retry-pushback-ms", "1")}
		})
		client := cl.EchoClient()
		for range 30 {
			_, _ = client.Echo(t.Context(), &echov1.EchoRequest{Message: "x"})
		}
		if s := snapshotOf(t, cl); s.Ejections != 0 || s.Overflow != 0 {
			t.Fatalf("busy backends were ejected (or nearly):\n%s", s)
		}
	})
}

// TestRequestTheClientCannotMarshalEjectsNothing pins that a call failing
// in the client before anything reached the endpoint (a request proto
// refuses to marshal: a string field holding invalid UTF-8, which grpc
// reports as INTERNAL) says nothing of the endpoint: one caller sending
// such requests must not eject healthy backends (REVIEW class 2). Before:
// with consecutiveFailures 2, 30 such calls ejected a backend that never
// received one of them (it saw the headers, then a reset).
func TestRequestTheClientCannotMarshalEjectsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryBudget(nil))
		cl := startCluster(t, 3, c, `{"consecutiveFailures": 2}`)
		client := cl.EchoClient()
		for range 30 {
			_, err := client.Echo(t.Context(), &echov1.EchoRequest{Message: "\xff"})
			if status.Code(err) != codes.Internal {
				t.Fatalf("err = %v, want INTERNAL (the request does not marshal)", err)
			}
		}
		if s := snapshotOf(t, cl); s.Ejections != 0 || s.Endpoints[0].ConsecutiveFailures != 0 {
			t.Fatalf("requests that never left the client count against healthy backends:\n%s", s)
		}
	})
}

// TestEjectionSpreadsTheEjectedShareEvenly pins the rotation while an
// endpoint is ejected: its share of the calls goes to the others evenly,
// not all to the one after it in the rotation. Before: with backend 0 of
// 3 ejected, backend 1 took 2/3 of the calls and backend 2 1/3 (a third
// more load than its peer on the backend the incident leaves busiest).
func TestEjectionSpreadsTheEjectedShareEvenly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
		cl := startCluster(t, 3, c, `{"consecutiveFailures": 2, "baseEjectionTime": "600s"}`)
		cl.Backends[0].OnCall(failAlways(codes.Unavailable))
		client := cl.EchoClient()
		for range 20 {
			echoOK(t, client)
		}
		if s := snapshotOf(t, cl); s.Endpoints[0].EjectedUntil.IsZero() {
			t.Fatalf("backend 0 not ejected:\n%s", s)
		}
		before := cl.Counts(resiliencetest.EchoMethod)
		for range 300 {
			echoOK(t, client)
		}
		after := cl.Counts(resiliencetest.EchoMethod)
		b1, b2 := after[1]-before[1], after[2]-before[2]
		if after[0] != before[0] || b1 < 120 || b2 < 120 {
			t.Fatalf("300 calls with backend 0 ejected went %d/%d/%d, want 0/150/150 give or take 30",
				after[0]-before[0], b1, b2)
		}
	})
}

// TestMaxEjectionPercentWithOneOrTwoEndpoints pins the bound's edges over
// real gRPC, every backend failing: one endpoint is never ejected at 50%,
// and at 100% it is, yet still serves (no other is READY) and succeeds as
// soon as it recovers; of two, 50% ejects one at most and 49% none.
func TestMaxEjectionPercentWithOneOrTwoEndpoints(t *testing.T) {
	tests := []struct {
		n, percent, want int
	}{{1, 50, 0}, {1, 100, 1}, {2, 50, 1}, {2, 49, 0}, {2, 100, 2}}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d endpoints %d%%", tt.n, tt.percent), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newTestClient(t, WithRetryBudget(nil))
				cl := startCluster(t, tt.n, c, fmt.Sprintf(`{"consecutiveFailures": 1, "baseEjectionTime": "600s", "maxEjectionPercent": %d}`, tt.percent))
				for _, b := range cl.Backends {
					b.OnCall(failAlways(codes.Unavailable))
				}
				client := cl.EchoClient()
				most := 0
				for range 20 {
					_, _ = client.Echo(t.Context(), &echov1.EchoRequest{Message: "x"})
					most = max(most, ejectedCount(snapshotOf(t, cl)))
				}
				if most != tt.want {
					t.Fatalf("at most %d ejected, want %d:\n%s", most, tt.want, snapshotOf(t, cl))
				}
				for _, b := range cl.Backends {
					b.OnCall(nil)
				}
				echoOK(t, client) // ejected or not, a recovered cluster serves
			})
		})
	}
}

// TestStreamOnAKilledBackendRetriesElsewhere pins the stream's trail under
// a crash: server streams waiting on a backend that dies before their first
// message (not committed) are retried on the others and deliver their
// message once.
func TestStreamOnAKilledBackendRetriesElsewhere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
		cl := startCluster(t, 3, c, `{"consecutiveFailures": 2}`)
		cl.Backends[0].OnCall(func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Delay: time.Hour} })
		client := cl.EchoClient()
		var wg sync.WaitGroup
		for range 9 {
			wg.Go(func() {
				st, err := client.ServerStream(t.Context(), &echov1.ServerStreamRequest{Message: "x", Count: 1})
				if err != nil {
					t.Error(err)
					return
				}
				n := 0
				for {
					_, err := st.Recv()
					if err != nil {
						if err != io.EOF {
							t.Errorf("stream: %v after %d messages", err, n)
						}
						break
					}
					n++
				}
				if n != 1 {
					t.Errorf("stream delivered %d messages, want 1", n)
				}
			})
		}
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		if n := cl.Counts(resiliencetest.ServerStreamMethod)[0]; n == 0 {
			t.Fatal("no stream reached backend 0")
		}
		cl.StopBackend(0)
		wg.Wait()
	})
}

// TestHedgesWithCancellationsAndACrashHoldNothing runs hedged calls with
// random cancellations over the policy while one backend is slow and
// another crashes mid-run: the calls end, the copies' trails and Done
// callbacks settle, nothing is held (newTestClient's check) and no
// goroutine stays (the bubble, the package's goleak).
func TestHedgesWithCancellationsAndACrashHoldNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryBudget(nil), WithMethodConfig(serviceconfig.MethodConfig{
			Name: []serviceconfig.Name{{Service: echoService}},
			HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 3, HedgingDelay: 5 * time.Millisecond,
				NonFatalStatusCodes: []codes.Code{codes.Unavailable}},
			Bulkhead: &serviceconfig.Bulkhead{MaxConcurrent: 16, MaxQueue: 16, MaxQueueWait: 20 * time.Millisecond},
		}))
		cl := startCluster(t, 3, c, `{"consecutiveFailures": 2, "baseEjectionTime": "0.05s"}`)
		cl.Backends[1].OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
			return resiliencetest.Step{Delay: 30 * time.Millisecond}
		})
		client := cl.EchoClient()
		var wg sync.WaitGroup
		for g := range 12 {
			wg.Go(func() {
				for i := range 15 {
					ctx, cancel := context.WithTimeout(t.Context(), time.Duration(1+(g*5+i*3)%25)*time.Millisecond)
					_, _ = client.Echo(ctx, &echov1.EchoRequest{Message: "x"})
					cancel()
				}
			})
		}
		time.Sleep(40 * time.Millisecond)
		cl.StopBackend(2)
		wg.Wait()
		for range 10 {
			echoOK(t, client)
		}
	})
}
