package interceptor

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/endpoint"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The endpoint policy's round-2 regression tests (issue 30), one per
// finding, over real gRPC with several backends (the rig of
// endpoint_rig_test.go), each waiting for READY itself.

// callN makes n Echo calls from callers goroutines at once and returns the
// errors.
func callN(client echov1.EchoServiceClient, callers, n int, opts ...grpc.CallOption) []error {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range n {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := client.Echo(ctx, &echov1.EchoRequest{Message: "x"}, opts...)
				cancel()
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return errs
}

// TestRetryAvoidsTheFirstAttemptsEndpointWithHostNames pins finding 1: the
// first attempt's endpoint is recorded by the picker, not guessed from the
// peer address, so with host names in the resolver (the connection reports
// an IP) a retry never returns to it, under pick_first and round_robin.
// Before: with ejection off, pick_first failed 787–800 of 800 calls and
// round_robin 89 of 800.
func TestRetryAvoidsTheFirstAttemptsEndpointWithHostNames(t *testing.T) {
	for _, child := range []string{"pick_first", "round_robin", "peak_ewma"} {
		t.Run(child, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
				rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"childPolicy": [{"`+child+`": {}}], `+noEjection[1:]))...)
				rg.waitReady(3)
				rg.backends[0].OnCall(failAlways(codes.Unavailable))
				if errs := callN(rg.echo(), 16, 25); len(errs) > 0 {
					t.Fatalf("%d of 400 calls failed, first: %v", len(errs), errs[0])
				}
				if n := rg.retriesTo(0); n != 0 {
					t.Fatalf("the failing backend got %d retries: the first attempt's endpoint was not recognized", n)
				}
				if n := rg.counts()[0]; n < 20 {
					t.Fatalf("the failing backend saw %d first attempts, want a share", n)
				}
			})
		})
	}
}

// TestRetryAvoidsTheFirstAttemptsEndpointOverLoopback pins finding 1 over
// real sockets: resolver addresses "localhost:port" (the peer is
// 127.0.0.1:port) and, as a control, "127.0.0.1:port".
func TestRetryAvoidsTheFirstAttemptsEndpointOverLoopback(t *testing.T) {
	for _, host := range []string{"localhost", "127.0.0.1"} {
		for _, child := range []string{"pick_first", "round_robin"} {
			t.Run(host+"/"+child, func(t *testing.T) {
				var addrs []string
				var srvs []*resiliencetest.Server
				for range 3 {
					srv := resiliencetest.NewServer()
					gs := grpc.NewServer()
					echov1.RegisterEchoServiceServer(gs, srv)
					l, err := net.Listen("tcp", "127.0.0.1:0")
					if err != nil {
						t.Fatal(err)
					}
					go func() { _ = gs.Serve(l) }()
					t.Cleanup(gs.Stop)
					_, port, _ := net.SplitHostPort(l.Addr().String())
					addrs = append(addrs, net.JoinHostPort(host, port))
					srvs = append(srvs, srv)
				}
				r := manual.NewBuilderWithScheme("loopback" + fmt.Sprint(time.Now().UnixNano()))
				var st resolver.State
				for _, a := range addrs {
					st.Endpoints = append(st.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
				}
				r.InitialState(st)
				c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
				cc, err := grpc.NewClient(r.Scheme()+":///db", append(c.DialOptions(), grpc.WithResolvers(r),
					grpc.WithTransportCredentials(insecure.NewCredentials()),
					lbDial(`{"childPolicy": [{"`+child+`": {}}], `+noEjection[1:]))...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = cc.Close() })
				rg := &rig{t: t, Conn: cc}
				rg.waitReady(3)
				srvs[0].OnCall(failAlways(codes.Unavailable))
				if errs := callN(echov1.NewEchoServiceClient(cc), 4, 25); len(errs) > 0 {
					t.Fatalf("%d of 100 calls failed, first: %v", len(errs), errs[0])
				}
				for _, a := range srvs[0].Attempts(resiliencetest.EchoMethod) {
					if a.Previous > 0 {
						t.Fatal("the failing backend got a retry")
					}
				}
			})
		}
	}
}

// failingCreds fails the per-RPC credentials of calls whose outgoing
// metadata asks it to, on the client, before anything is sent.
type failingCreds struct{}

func (failingCreds) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get("fail-creds")) > 0 {
		return nil, status.Error(codes.Unavailable, "credentials unavailable")
	}
	return nil, nil
}

func (failingCreds) RequireTransportSecurity() bool { return false }

// TestUnavailableWithNothingSentEjectsNothing pins finding 2: an
// UNAVAILABLE raised on the client before anything was sent (per-RPC
// credentials failing) says nothing of the endpoint. Before: one backend,
// which received no call, was ejected for 60 s.
func TestUnavailableWithNothingSentEjectsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryBudget(nil))
		rg := newRig(t, 3, append(c.DialOptions(), grpc.WithPerRPCCredentials(failingCreds{}),
			lbDial(`{"consecutiveFailures": 1, "consecutiveLocalOriginFailures": 1}`))...)
		rg.waitReady(3)
		ctx := metadata.AppendToOutgoingContext(t.Context(), "fail-creds", "1")
		for range 30 {
			_, err := rg.echo().Echo(ctx, &echov1.EchoRequest{Message: "x"})
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("err = %v, want the credentials' UNAVAILABLE", err)
			}
		}
		if got := rg.counts(); fmt.Sprint(got) != "[0 0 0]" {
			t.Fatalf("backends saw %v, want nothing", got)
		}
		if s := rg.snapshot(); s.Ejections != 0 || s.Overflow != 0 {
			t.Fatalf("failures of the client's own credentials counted against backends:\n%s", s)
		}
	})
}

// TestBackendRestartedInPlaceIsBackWhenReady pins finding 2's resets: the
// calls a backend is serving when it restarts fail with nothing received
// (local-origin failures); they eject it, and the ejection ends as soon as
// it is READY on a new connection, not after baseEjectionTime. Before: it
// stayed out ~30 s.
func TestBackendRestartedInPlaceIsBackWhenReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
		rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"consecutiveLocalOriginFailures": 3, "baseEjectionTime": "30s"}`))...)
		rg.waitReady(3)
		rg.backends[0].OnCall(func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Delay: time.Hour} })
		var wg sync.WaitGroup
		for range 12 {
			wg.Go(func() { echoOK(t, rg.echo()) }) // the ones on backend 0 retry elsewhere
		}
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		if n := rg.counts()[0]; n < 3 {
			t.Fatalf("backend 0 holds %d calls, want at least 3", n)
		}
		rg.backends[0].OnCall(nil)
		rg.stop(0)
		wg.Wait()
		s := rg.snapshot()
		if s.Endpoints[0].EjectedUntil.IsZero() || s.Endpoints[0].Cause != "local_origin" {
			t.Fatalf("the resets did not eject backend 0 for local_origin:\n%s", s)
		}
		rg.serve(0) // back on the same name
		rg.waitReady(3)
		s = rg.snapshot()
		if !s.Endpoints[0].EjectedUntil.IsZero() {
			t.Fatalf("READY again, backend 0 is still ejected:\n%s", s)
		}
		before := rg.counts()[0]
		for range 30 {
			echoOK(t, rg.echo())
		}
		if got := rg.counts()[0] - before; got < 5 {
			t.Fatalf("backend 0 got %d of 30 calls once READY again, want about 10", got)
		}
	})
}

// TestPerAttemptTimeoutCountsAgainstASilentBackend pins finding 2's
// timeouts: an attempt cut by the policy's perAttemptRecvTimeout counts as
// its endpoint's failure, so a backend that never answers is ejected; the
// caller's own deadline, and a caller's PerAttemptTimeout call option,
// never count. Before: a 500 ms backend kept its share of first attempts,
// each paying the timeout.
func TestPerAttemptTimeoutCountsAgainstASilentBackend(t *testing.T) {
	policy := func(perAttempt time.Duration) *serviceconfig.RetryPolicy {
		p := fastPolicy(2)
		p.PerAttemptRecvTimeout = perAttempt
		p.RetryableStatusCodes = []codes.Code{codes.Unavailable, codes.DeadlineExceeded}
		return p
	}
	tests := []struct {
		name    string
		policy  *serviceconfig.RetryPolicy
		ctx     func(context.Context) (context.Context, context.CancelFunc)
		opts    []grpc.CallOption
		ejected bool
	}{
		{"policy's per-attempt timeout", policy(50 * time.Millisecond), nil, nil, true},
		{"caller's deadline", fastPolicy(2), func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 50*time.Millisecond)
		}, nil, false},
		{"caller's PerAttemptTimeout call option", fastPolicy(2), nil, []grpc.CallOption{PerAttemptTimeout(50 * time.Millisecond)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newTestClient(t, WithRetryPolicy(tt.policy), WithRetryBudget(nil))
				rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"consecutiveFailures": 3, "baseEjectionTime": "600s"}`))...)
				rg.waitReady(3)
				rg.backends[1].OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
					return resiliencetest.Step{Delay: 500 * time.Millisecond}
				})
				for range 30 {
					ctx, cancel := t.Context(), context.CancelFunc(func() {})
					if tt.ctx != nil {
						ctx, cancel = tt.ctx(ctx)
					}
					_, _ = rg.echo().Echo(ctx, &echov1.EchoRequest{Message: "x"}, tt.opts...)
					cancel()
				}
				s := rg.snapshot()
				if got := !s.Endpoints[1].EjectedUntil.IsZero(); got != tt.ejected {
					t.Fatalf("silent backend ejected = %v, want %v:\n%s", got, tt.ejected, s)
				}
				if ejectedCount(s) > 1 || !s.Endpoints[0].EjectedUntil.IsZero() || !s.Endpoints[2].EjectedUntil.IsZero() {
					t.Fatalf("a healthy backend was ejected:\n%s", s)
				}
				if tt.ejected {
					before := rg.counts()[1]
					for range 30 {
						echoOK(t, rg.echo())
					}
					if got := rg.counts()[1] - before; got != 0 {
						t.Fatalf("the ejected silent backend got %d more first attempts", got)
					}
				}
			})
		})
	}
}

// TestStreamPerAttemptTimeoutCountsAgainstASilentBackend is the same for a
// server stream whose first message never comes: the stream's per-attempt
// timer (a cancel, not a deadline) marks the attempt, and it counts.
func TestStreamPerAttemptTimeoutCountsAgainstASilentBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := fastPolicy(2)
		p.PerAttemptRecvTimeout = 50 * time.Millisecond
		c := newTestClient(t, WithRetryPolicy(p), WithRetryBudget(nil))
		rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"consecutiveFailures": 2, "baseEjectionTime": "600s"}`))...)
		rg.waitReady(3)
		rg.backends[2].OnCall(func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Delay: time.Hour} })
		for range 12 {
			st, err := rg.echo().ServerStream(t.Context(), &echov1.ServerStreamRequest{Message: "x", Count: 1})
			if err == nil {
				_, err = st.Recv()
			}
			if err != nil {
				t.Fatalf("stream: %v", err)
			}
		}
		if s := rg.snapshot(); s.Endpoints[2].EjectedUntil.IsZero() || s.Endpoints[2].Cause != "consecutive_failures" {
			t.Fatalf("the silent backend was not ejected by the streams' timeouts:\n%s", s)
		}
	})
}

// TestScaleDownReturnsTheLongestEjectedFirst pins finding 3's bound at
// every moment: with 4 endpoints and 2 ejected at 50%, the resolver
// dropping a healthy one leaves 2 of 3 out; the longest-ejected returns.
// Before: 2 of 3 stayed out and all traffic went to one backend.
func TestScaleDownReturnsTheLongestEjectedFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
		rg := newRig(t, 4, append(c.DialOptions(), lbDial(`{"childPolicy": [{"pick_first": {}}], "consecutiveFailures": 2, "baseEjectionTime": "600s", "maxEjectionPercent": 50}`))...)
		rg.waitReady(4)
		rg.backends[0].OnCall(failAlways(codes.Unavailable))
		for range 5 {
			echoOK(t, rg.echo())
		}
		time.Sleep(time.Second)
		rg.backends[1].OnCall(failAlways(codes.Unavailable))
		for range 5 {
			echoOK(t, rg.echo())
		}
		if s := rg.snapshot(); ejectedCount(s) != 2 {
			t.Fatalf("want backends 0 and 1 ejected:\n%s", s)
		}
		rg.backends[0].OnCall(nil)
		rg.backends[1].OnCall(nil)
		rg.setEndpoints(rg.names[:3]...)
		rg.waitReady(3)
		s := rg.snapshot()
		if ejectedCount(s) != 1 || !s.Endpoints[0].EjectedUntil.IsZero() || s.Endpoints[1].EjectedUntil.IsZero() {
			t.Fatalf("after scaling to 3, want only backend 1 ejected (0 was ejected first):\n%s", s)
		}
		before := rg.counts()
		for range 20 {
			echoOK(t, rg.echo())
		}
		if after := rg.counts(); after[0]-before[0] != 20 {
			t.Fatalf("pick_first after the scale-down: attempts %v → %v, want all 20 on backend 0", before, after)
		}
	})
}

// TestLastResortAnswersReturnEndpointsAtOnce pins finding 3: with every
// endpoint ejected, attempts still go to them, and an endpoint that
// answers such an attempt returns at once. Before: the outcomes were
// dropped, so after 2 of 3 recovered pick_first failed 100 of 100 calls and
// round_robin 34 of 100, for the whole ejection time.
func TestLastResortAnswersReturnEndpointsAtOnce(t *testing.T) {
	for _, child := range []string{"pick_first", "round_robin", "peak_ewma"} {
		t.Run(child, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
				rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"childPolicy": [{"`+child+`": {}}], "consecutiveFailures": 1, "baseEjectionTime": "600s", "maxEjectionPercent": 100}`))...)
				rg.waitReady(3)
				for _, b := range rg.backends {
					b.OnCall(failAlways(codes.Unavailable))
				}
				for range 10 {
					_, _ = rg.echo().Echo(t.Context(), &echov1.EchoRequest{Message: "x"})
				}
				if s := rg.snapshot(); ejectedCount(s) != 3 {
					t.Fatalf("want every backend ejected:\n%s", s)
				}
				rg.backends[1].OnCall(nil)
				rg.backends[2].OnCall(nil)
				failed := 0
				for range 100 {
					if _, err := rg.echo().Echo(t.Context(), &echov1.EchoRequest{Message: "x"}); err != nil {
						failed++
					}
				}
				if failed > 1 {
					t.Fatalf("%d of 100 calls failed after 2 of 3 backends recovered", failed)
				}
				s := rg.snapshot()
				// The first recovered backend to answer is back; then it takes
				// every call (the only one in rotation), and the others wait
				// out their ejections.
				back1, back2 := s.Endpoints[1].EjectedUntil.IsZero(), s.Endpoints[2].EjectedUntil.IsZero()
				if s.Endpoints[0].EjectedUntil.IsZero() || !back1 && !back2 || child == "pick_first" && !back1 {
					t.Fatalf("want backend 0 still ejected and a recovered one back (pick_first: backend 1):\n%s", s)
				}
			})
		})
	}
}

// TestDuplicateEndpointIsOneEndpoint pins finding 3: an endpoint the
// resolver lists twice is one endpoint, in the snapshot and in the share
// maxEjectionPercent allows. Before: the duplicate left a hidden entry that
// counted in the percentage for ever (4 members: 2 ejections allowed at
// 50% of what were 3 endpoints).
func TestDuplicateEndpointIsOneEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
		rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"consecutiveFailures": 1, "baseEjectionTime": "600s", "maxEjectionPercent": 50}`))...)
		rg.setEndpoints(rg.names[0], rg.names[1], rg.names[0], rg.names[2])
		rg.waitReady(3)
		if s := rg.snapshot(); len(s.Endpoints) != 3 {
			t.Fatalf("want 3 endpoints:\n%s", s)
		}
		rg.backends[0].OnCall(failAlways(codes.Unavailable))
		rg.backends[1].OnCall(failAlways(codes.Unavailable))
		for range 30 {
			_, _ = rg.echo().Echo(t.Context(), &echov1.EchoRequest{Message: "x"})
		}
		if s := rg.snapshot(); ejectedCount(s) != 1 || s.Overflow == 0 {
			t.Fatalf("50%% of 3 endpoints: want 1 ejected and the other held back:\n%s", s)
		}
	})
}

// TestMaxEjectionPercentZeroEjectsNothing pins finding 3: an explicit
// "maxEjectionPercent": 0 ejects nothing (gRFC A50), and the refusal is
// counted. Before: 0 meant the default 50.
func TestMaxEjectionPercentZeroEjectsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
		rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"consecutiveFailures": 1, "maxEjectionPercent": 0}`))...)
		rg.waitReady(3)
		rg.backends[0].OnCall(failAlways(codes.Unavailable))
		for range 30 {
			echoOK(t, rg.echo())
		}
		if s := rg.snapshot(); s.Ejections != 0 || s.Overflow == 0 {
			t.Fatalf("maxEjectionPercent 0: want no ejection, refusals counted:\n%s", s)
		}
	})
}

// TestIdleChannelKeepsItsEjections pins that an idle channel (grpc closes
// its policy) keeps its ejections: the snapshot lists it as idle with the
// ejection, and the policy grpc builds when it wakes takes them over, so
// its first calls avoid the bad backend. Before: Snapshots dropped the
// channel and the new policy started every endpoint afresh.
func TestIdleChannelKeepsItsEjections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(2)), WithRetryBudget(nil))
		rg := newRig(t, 3, append(c.DialOptions(), grpc.WithIdleTimeout(time.Second),
			lbDial(`{"consecutiveFailures": 2, "baseEjectionTime": "600s"}`))...)
		rg.waitReady(3)
		rg.backends[0].OnCall(failAlways(codes.Unavailable))
		for range 10 {
			echoOK(t, rg.echo())
		}
		if s := rg.snapshot(); s.Endpoints[0].EjectedUntil.IsZero() {
			t.Fatalf("backend 0 not ejected:\n%s", s)
		}
		time.Sleep(3 * time.Second) // idle
		var idle *endpoint.Snapshot
		for _, s := range endpoint.Snapshots(time.Now()) {
			if s.Target == rg.Conn.Target() {
				if !s.Idle {
					t.Fatalf("the channel is not idle:\n%s", s)
				}
				idle = &s
			}
		}
		if idle == nil || idle.Endpoints[0].EjectedUntil.IsZero() {
			t.Fatalf("the idle channel's snapshot is gone or lost the ejection: %v", idle)
		}
		// Wake it, and wait for every endpoint: until the others are READY,
		// an ejected one READY first serves as the last resort.
		rg.waitReady(3)
		before := rg.counts()[0]
		for range 20 {
			echoOK(t, rg.echo())
		}
		if got := rg.counts()[0] - before; got != 0 {
			t.Fatalf("after waking, the ejected backend got %d calls", got)
		}
		if s := rg.snapshot(); s.Endpoints[0].EjectedUntil.IsZero() || s.Endpoints[0].Ejections != 1 {
			t.Fatalf("the woken channel's policy lost the ejection:\n%s", s)
		}
	})
}

// TestPeakEWMAMovesCallsAwayFromASlowBackend pins the latency-aware child
// over real gRPC: with one backend of three 20× slower and no retry or
// hedge, peak_ewma sends it a small share of the calls where round_robin
// sends a third.
func TestPeakEWMAMovesCallsAwayFromASlowBackend(t *testing.T) {
	for _, tt := range []struct {
		child    string
		min, max int // the slow backend's share of 480 calls
	}{{"peak_ewma", 0, 48}, {"round_robin", 140, 180}} {
		t.Run(tt.child, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newTestClient(t, WithRetryBudget(nil))
				rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"childPolicy": [{"`+tt.child+`": {}}]}`))...)
				rg.waitReady(3)
				rg.slowBackend(1, time.Millisecond, 20*time.Millisecond)
				if errs := callN(rg.echo(), 16, 30); len(errs) > 0 {
					t.Fatal(errs[0])
				}
				if got := rg.counts()[1]; got < tt.min || got > tt.max {
					t.Fatalf("%s: the slow backend got %d of 480 calls (%v), want [%d, %d]", tt.child, got, rg.counts(), tt.min, tt.max)
				}
				if tt.child == "peak_ewma" {
					s := rg.snapshot()
					if s.Endpoints[1].Latency < 10*time.Millisecond || s.Endpoints[0].Latency > 5*time.Millisecond {
						t.Fatalf("latency estimates do not tell the slow backend:\n%s", s)
					}
				}
			})
		})
	}
}

// TestCrashLoopingBackendIsEjected pins finding 2's abandoned picks: a
// backend that crashes on every call it gets (its connection resets, then
// it is back at once on the same name) is ejected for local-origin
// failures, though grpc abandons picks of it while its connection closes
// (Done with an empty DoneInfo); back when READY, it fails on probation and
// is held out (a repeat is not ended by a reconnection). Before: every
// abandoned pick counted as a success, so the run of failures never
// reached the threshold (282 outcomes, 281 failures, never 5 in a row).
func TestCrashLoopingBackendIsEjected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTestClient(t, WithRetryPolicy(fastPolicy(3)), WithRetryBudget(nil))
		rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"consecutiveLocalOriginFailures": 3, "baseEjectionTime": "600s"}`))...)
		rg.waitReady(3)
		crash := make(chan struct{}, 1)
		rg.backends[0].OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
			select {
			case crash <- struct{}{}:
			default:
			}
			return resiliencetest.Step{Delay: time.Hour} // until the crash resets it
		})
		done := make(chan struct{})
		var crashes sync.WaitGroup
		crashes.Go(func() {
			for {
				select {
				case <-done:
					return
				case <-crash:
					rg.restart(0)
				}
			}
		})
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				// 3 s: grpc reconnects after about 1 s when a dial meets
				// the crash.
				for range 300 {
					echoOK(t, rg.echo()) // every call succeeds: its retry goes elsewhere
					time.Sleep(10 * time.Millisecond)
				}
			})
		}
		wg.Wait()
		close(done)
		crashes.Wait()
		s := rg.snapshot()
		if e := s.Endpoints[0]; s.Ejections == 0 || !e.EjectedUntil.IsZero() && e.Cause != "local_origin" {
			t.Fatalf("a backend crashing on every call (%d attempts) was never ejected for local_origin:\n%s", rg.counts()[0], s)
		}
		if n := rg.counts()[0]; n > 20 {
			t.Fatalf("the crash-looping backend got %d attempts, want a few before its ejection", n)
		}
	})
}
