package interceptor

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// echoBreakerConfig is a config whose only entry guards Echo with cb.
func echoBreakerConfig(cb serviceconfig.CircuitBreaker) *serviceconfig.Config {
	return &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
		Name:           []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
		CircuitBreaker: &cb,
	}}}
}

// An update that changes a breaker's block built a new, closed breaker:
// an operator's ForceOpen during an incident, or a breaker tripped open by
// the outage, was undone by the next config push that touched the block
// (a resolver's or control plane's, which the operator may not control),
// and calls went to the failing backend again. The new breaker now takes
// the old one's state: forced states stay, an open breaker stays open
// until the old one's open time ends (bounded by the new config's
// maxOpenDuration from the update), then probes under the new thresholds.
func TestBreakerStateSurvivesAnUpdateOfItsBlock(t *testing.T) {
	before := serviceconfig.CircuitBreaker{ConsecutiveFailures: 2, OpenDuration: 30 * time.Second}
	after := serviceconfig.CircuitBreaker{ConsecutiveFailures: 5, OpenDuration: 10 * time.Second}
	tests := []struct {
		name  string
		setup func(t *testing.T, c *Client, stub echov1.EchoServiceClient)
		want  BreakerState
		// reopen is when, after the update, the breaker lets a probe
		// through; 0: never by itself.
		reopen time.Duration
	}{
		{"forced open", func(t *testing.T, c *Client, _ echov1.EchoServiceClient) {
			if err := c.ForceOpen(echoMethod); err != nil {
				t.Fatal(err)
			}
		}, BreakerForcedOpen, 0},
		{"tripped open", func(t *testing.T, _ *Client, stub echov1.EchoServiceClient) {
			for range 2 {
				_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{})
			}
			time.Sleep(5 * time.Second) // 25s of the 30s left
		}, BreakerOpen, 10 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(failFirst(2, codes.Unavailable))
				stub, c := newEcho(t, srv, WithServiceConfig(echoBreakerConfig(before)))
				tt.setup(t, c, stub)
				sent := srv.Count("Echo")
				if err := c.UpdateServiceConfig(echoBreakerConfig(after)); err != nil {
					t.Fatal(err)
				}
				if st := c.Status(echoMethod); st.Breaker == nil || st.Breaker.State != tt.want {
					t.Errorf("Status after the update = %+v, want the breaker %v", st.Breaker, tt.want)
				}
				if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); !errors.Is(err, ErrCircuitOpen) || srv.Count("Echo") != sent {
					t.Errorf("Echo after the update = %v, with %d attempts sent, want ErrCircuitOpen and none", err, srv.Count("Echo")-sent)
				}
				if tt.reopen == 0 {
					return
				}
				time.Sleep(tt.reopen)
				if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
					t.Errorf("Echo %v after the update = %v, want the probe to succeed", tt.reopen, err)
				}
			})
		})
	}
}

// echoBulkheadConfig is a config whose only entry guards Echo with bh, or
// with nothing when bh is nil.
func echoBulkheadConfig(bh *serviceconfig.Bulkhead) *serviceconfig.Config {
	return &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
		Name:     []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
		Bulkhead: bh,
	}}}
}

// echoAsync starts n Echo calls, one after the other, each waiting for the
// one before to be admitted or queued, and returns the channel their
// errors arrive on. Call it inside a synctest bubble.
func echoAsync(t *testing.T, stub echov1.EchoServiceClient, n int) <-chan error {
	done := make(chan error, n)
	for range n {
		go func() { _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); done <- err }()
		synctest.Wait()
	}
	return done
}

// wantBulkhead fails t unless Status shows Echo's bulkhead with inFlight
// and queued.
func wantBulkhead(t *testing.T, c *Client, inFlight, queued int) {
	t.Helper()
	st := c.Status(echoMethod).Bulkhead
	if st == nil || st.InFlight != inFlight || st.Queued != queued {
		t.Fatalf("Status(Echo).Bulkhead = %+v, want InFlight %d, Queued %d", st, inFlight, queued)
	}
}

// A lowered bulkhead cap applied to new calls only: an update that changed
// the block built a new, empty bulkhead, while the calls in flight held
// slots of the old one, so an operator who lowered maxConcurrent from 4 to
// 1 to shed load mid-incident got 5 calls in flight at once until the old
// ones drained (and Statuses showed the new bulkhead's 1, not 5). The
// bulkhead now takes the new limits in place (bulkhead.Resize): the calls
// in flight count against the new cap, none is preempted, and no call is
// admitted until fewer than the new cap are in flight.
func TestLoweredBulkheadCapCountsTheCallsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: time.Second} })
		stub, c := newEcho(t, srv, WithServiceConfig(echoBulkheadConfig(&serviceconfig.Bulkhead{MaxConcurrent: 4})))
		done := echoAsync(t, stub, 4)
		if err := c.UpdateServiceConfig(echoBulkheadConfig(&serviceconfig.Bulkhead{MaxConcurrent: 1})); err != nil {
			t.Fatal(err)
		}
		wantBulkhead(t, c, 4, 0)
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
		if !errors.Is(err, ErrBulkheadFull) {
			t.Errorf("Echo with 4 calls in flight after the cap was lowered to 1 = %v, want ErrBulkheadFull", err)
		}
		for range 4 {
			if err := <-done; err != nil {
				t.Errorf("Echo in flight when the cap was lowered = %v, want it to finish", err)
			}
		}
		wantBulkhead(t, c, 0, 0)
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Errorf("Echo once the old calls drained = %v, want nil", err)
		}
		if n := srv.Count("Echo"); n != 5 {
			t.Errorf("server saw %d attempts, want 5", n)
		}
	})
}

// A raised cap lets the queued calls in at once, rather than after the
// calls in flight end.
func TestRaisedBulkheadCapLetsQueuedCallsInAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: time.Second} })
		stub, c := newEcho(t, srv, WithServiceConfig(echoBulkheadConfig(&serviceconfig.Bulkhead{MaxConcurrent: 1, MaxQueue: 4})))
		done := echoAsync(t, stub, 4)
		wantBulkhead(t, c, 1, 3)
		start := time.Now()
		if err := c.UpdateServiceConfig(echoBulkheadConfig(&serviceconfig.Bulkhead{MaxConcurrent: 3, MaxQueue: 4})); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		wantBulkhead(t, c, 3, 1)
		if n := srv.Count("Echo"); n != 3 {
			t.Errorf("server saw %d attempts at once after the cap was raised 1 → 3, want 3", n)
		}
		for range 4 {
			if err := <-done; err != nil {
				t.Errorf("Echo = %v, want nil", err)
			}
		}
		// The first call ends 1s after it began, letting the last in; the
		// two let in by the update end 1s after it.
		if d := time.Since(start); d != 2*time.Second {
			t.Errorf("the 4 calls took %v after the update, want 2s", d)
		}
	})
}

// Under a lowered maxQueue, calls already queued keep their places and get
// their slots in turn; new calls are refused until fewer than the new
// maxQueue wait.
func TestLoweredBulkheadQueueKeepsTheQueuedCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: time.Second} })
		stub, c := newEcho(t, srv, WithServiceConfig(echoBulkheadConfig(&serviceconfig.Bulkhead{MaxConcurrent: 1, MaxQueue: 4})))
		done := echoAsync(t, stub, 4)
		if err := c.UpdateServiceConfig(echoBulkheadConfig(&serviceconfig.Bulkhead{MaxConcurrent: 1, MaxQueue: 1})); err != nil {
			t.Fatal(err)
		}
		wantBulkhead(t, c, 1, 3)
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); !errors.Is(err, ErrBulkheadFull) {
			t.Errorf("Echo with 3 queued under maxQueue 1 = %v, want ErrBulkheadFull", err)
		}
		for i := range 4 {
			if err := <-done; err != nil {
				t.Errorf("Echo #%d, in flight or queued at the update = %v, want nil", i, err)
			}
		}
		if n := srv.Count("Echo"); n != 4 {
			t.Errorf("server saw %d attempts, want 4", n)
		}
	})
}

// A bulkhead block removed leaves the calls in flight to release into the
// bulkhead they took their slots in, each once, and new calls unbounded; a
// block added again takes that bulkhead back, so that its limits count the
// calls in flight since before the removal (and only those, not the calls
// made while there was no block).
func TestBulkheadRemovedAndAddedAgainReleasesEverySlotOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: time.Second} })
		one := &serviceconfig.Bulkhead{MaxConcurrent: 1}
		stub, c := newEcho(t, srv, WithServiceConfig(echoBulkheadConfig(one)))
		first := keptPolicy(c, echoMethod).g.bulkhead
		before := echoAsync(t, stub, 1)
		if err := c.UpdateServiceConfig(echoBulkheadConfig(nil)); err != nil {
			t.Fatal(err)
		}
		if st := c.Status(echoMethod).Bulkhead; st != nil {
			t.Errorf("Status(Echo).Bulkhead with no bulkhead block = %+v, want nil", st)
		}
		unbounded := echoAsync(t, stub, 2)
		if n := srv.Count("Echo"); n != 3 {
			t.Errorf("server saw %d attempts with the block removed, want 3 (none refused)", n)
		}
		if err := c.UpdateServiceConfig(echoBulkheadConfig(one)); err != nil {
			t.Fatal(err)
		}
		wantBulkhead(t, c, 1, 0)
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); !errors.Is(err, ErrBulkheadFull) {
			t.Errorf("Echo with the block added again and its one slot held since before = %v, want ErrBulkheadFull", err)
		}
		for _, ch := range []<-chan error{before, unbounded, unbounded} {
			if err := <-ch; err != nil {
				t.Errorf("Echo = %v, want nil", err)
			}
		}
		wantBulkhead(t, c, 0, 0)
		after := echoAsync(t, stub, 1)
		wantBulkhead(t, c, 1, 0)
		if err := <-after; err != nil {
			t.Errorf("Echo = %v, want nil", err)
		}
		if s := first.Snapshot(); s.InFlight != 0 || s.Queued != 0 {
			t.Errorf("the removed bulkhead holds %+v, want nothing", s)
		}
	})
}

// TestBulkheadUpdatesUnderLoadNeverExceedTheCap flips maxConcurrent between
// 1 and 8 while 32 callers call, some cancelling, in real time: the
// attempts in flight never outnumber the largest cap in force since the
// oldest call began, and nothing is held at the end (checkNothingHeld).
func TestBulkheadUpdatesUnderLoadNeverExceedTheCap(t *testing.T) {
	const callers, calls = 32, 40
	var (
		mu     sync.Mutex
		caps   = []int{8} // caps[e]: the cap from epoch e on
		epoch  atomic.Int64
		starts = map[*int64]bool{} // the epochs at which calls began
		active atomic.Int64
		peak   atomic.Int64
	)
	// bound is the largest cap in force since the oldest call began, or
	// the epoch before it: an update under way may not have resized the
	// bulkhead yet when the epoch moved.
	bound := func() int {
		mu.Lock()
		defer mu.Unlock()
		oldest := epoch.Load()
		for e := range starts {
			oldest = min(oldest, *e)
		}
		m := 0
		for _, c := range caps[max(oldest-1, 0):] {
			m = max(m, c)
		}
		return m
	}
	// Counted below the client, while the attempt holds its slot: a
	// cancelled call's handler may outlive the slot, not the invoker.
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		n := active.Add(1)
		defer active.Add(-1)
		if m := bound(); int(n) > m {
			t.Errorf("%d attempts in flight, want at most %d (the largest cap since the oldest call began)", n, m)
		}
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	srv := &testserver.Server{}
	srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
		return testserver.Outcome{Delay: time.Duration(a.N%5) * 100 * time.Microsecond}
	})
	cfg := func(n int) *serviceconfig.Config {
		return echoBulkheadConfig(&serviceconfig.Bulkhead{MaxConcurrent: n, MaxQueue: 2 * n})
	}
	stub, c := newEchoBelow(t, srv, []grpc.UnaryClientInterceptor{count}, WithServiceConfig(cfg(8)))
	stop := make(chan struct{})
	var updater, wg sync.WaitGroup
	updater.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond):
			}
			n := []int{1, 8}[i%2]
			mu.Lock()
			caps = append(caps, n)
			mu.Unlock()
			epoch.Add(1)
			if err := c.UpdateServiceConfig(cfg(n)); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var ok, full, cancelled atomic.Int64
	for g := range callers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 11))
			for range calls {
				ctx, cancel := context.WithCancel(t.Context())
				if r.IntN(4) == 0 {
					time.AfterFunc(time.Duration(r.IntN(300))*time.Microsecond, cancel)
				}
				start := epoch.Load()
				mu.Lock()
				starts[&start] = true
				mu.Unlock()
				_, err := stub.Echo(ctx, &echov1.EchoRequest{})
				mu.Lock()
				delete(starts, &start)
				mu.Unlock()
				cancel()
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, ErrBulkheadFull):
					full.Add(1)
				case status.Code(err) == codes.Canceled:
					cancelled.Add(1)
				default:
					t.Errorf("Echo = %v, want nil, ErrBulkheadFull or CANCELED", err)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	updater.Wait()
	wantBulkhead(t, c, 0, 0)
	t.Logf("%d updates; %d ok, %d full, %d cancelled; at most %d attempts in flight at once",
		epoch.Load(), ok.Load(), full.Load(), cancelled.Load(), peak.Load())
	if ok.Load() == 0 || epoch.Load() < 2 {
		t.Errorf("%d calls succeeded over %d updates: the test exercised nothing", ok.Load(), epoch.Load())
	}
}

// TestResizedBulkheadAllocatesNothing: a call admitted by, or rejected by,
// a bulkhead that an update resized allocates nothing, as under a new one.
func TestResizedBulkheadAllocatesNothing(t *testing.T) {
	c := newTestClient(t, WithServiceConfig(echoBulkheadConfig(&serviceconfig.Bulkhead{MaxConcurrent: 4})))
	ic := c.UnaryClientInterceptor()
	ctx := context.Background()
	req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
	static := []grpc.CallOption{grpc.StaticMethod()}
	_ = ic(ctx, echoMethod, req, reply, nil, okInvoker, static...) // resolve the method's policy once
	if err := c.UpdateServiceConfig(echoBulkheadConfig(&serviceconfig.Bulkhead{MaxConcurrent: 1})); err != nil {
		t.Fatal(err)
	}
	if allocs := testing.AllocsPerRun(1000, func() {
		if err := ic(ctx, echoMethod, req, reply, nil, okInvoker, static...); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("call admitted by a resized bulkhead: %v allocs, want 0", allocs)
	}
	hold := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		allocs := testing.AllocsPerRun(1000, func() {
			if err := ic(ctx, echoMethod, req, reply, nil, okInvoker, static...); !errors.Is(err, ErrBulkheadFull) {
				t.Fatalf("call with the one slot taken = %v, want ErrBulkheadFull", err)
			}
		})
		if allocs != 0 {
			t.Errorf("call rejected by a resized bulkhead: %v allocs, want 0", allocs)
		}
		return nil
	}
	if err := ic(ctx, echoMethod, req, reply, nil, hold, static...); err != nil {
		t.Fatal(err)
	}
}
