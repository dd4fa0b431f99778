package interceptor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// updateStressConfigs are the configs the updater cycles through while
// calls are in flight: hedging and retry for the same method, the method
// removed, the bulkhead's cap raised and lowered, the breaker's block
// changed (a new breaker) and kept (carried over).
func updateStressConfigs() []*serviceconfig.Config {
	breaker := &serviceconfig.CircuitBreaker{
		ConsecutiveFailures: 3, OpenDuration: time.Millisecond, MaxOpenDuration: 4 * time.Millisecond, HalfOpenProbes: 2,
		FailureStatusCodes: []codes.Code{codes.DataLoss},
	}
	other := *breaker
	other.ConsecutiveFailures = 5
	hedging := &serviceconfig.HedgingPolicy{MaxAttempts: 4, HedgingDelay: time.Millisecond, NonFatalStatusCodes: []codes.Code{codes.Unavailable}}
	adaptive := &serviceconfig.HedgingPolicy{MaxAttempts: 3, HedgingDelayQuantile: 0.9, HedgingDelay: 2 * time.Millisecond,
		HedgingDelayMinSamples: 5, NonFatalStatusCodes: []codes.Code{codes.Unavailable}}
	retry := &serviceconfig.RetryPolicy{MaxAttempts: 4, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond,
		BackoffMultiplier: 2, RetryableStatusCodes: []codes.Code{codes.Unavailable}, PerAttemptRecvTimeout: 3 * time.Millisecond}
	bulkhead := func(n, q int) *serviceconfig.Bulkhead {
		return &serviceconfig.Bulkhead{MaxConcurrent: n, MaxQueue: q, MaxQueueWait: 2 * time.Millisecond}
	}
	service := []serviceconfig.Name{{Service: echoService}}
	exact := []serviceconfig.Name{{Service: echoService, Method: "Echo"}}
	storm := func(mcs ...serviceconfig.MethodConfig) *serviceconfig.Config {
		return &serviceconfig.Config{MethodConfig: mcs,
			RetryThrottling: &serviceconfig.RetryThrottling{MaxTokens: 1000, TokenRatio: 1},
			RetryBudget:     &serviceconfig.RetryBudget{Ratio: 1, MinRetriesPerSecond: 1000}}
	}
	return []*serviceconfig.Config{
		storm(serviceconfig.MethodConfig{Name: service, HedgingPolicy: hedging, CircuitBreaker: breaker, Bulkhead: bulkhead(32, 16)}),
		storm(serviceconfig.MethodConfig{Name: service, RetryPolicy: retry, CircuitBreaker: breaker, Bulkhead: bulkhead(32, 16)}),
		storm(serviceconfig.MethodConfig{Name: exact, HedgingPolicy: adaptive, CircuitBreaker: breaker, Bulkhead: bulkhead(2, 1)}),
		storm(), // every method removed
		storm(serviceconfig.MethodConfig{Name: exact, RetryPolicy: retry, CircuitBreaker: &other, Bulkhead: bulkhead(64, 0)}),
		storm(serviceconfig.MethodConfig{Name: service, HedgingPolicy: hedging, CircuitBreaker: &other, Bulkhead: bulkhead(1, 4)}),
		{}, // no storm control either
	}
}

// stateTracker keeps every guards value the client's states held, so that
// the end of the test can check that none of them, whether still in force
// or replaced by an update, holds a slot, a queue place or a probe.
type stateTracker struct {
	mu     sync.Mutex
	guards map[*methodPolicy]struct{}
}

func (tr *stateTracker) record(c *Client) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.guards == nil {
		tr.guards = map[*methodPolicy]struct{}{}
	}
	c.state.Load().each(func(p *methodPolicy) { tr.guards[p] = struct{}{} })
}

func (tr *stateTracker) held() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	now := time.Now()
	var held string
	for p := range tr.guards {
		if h := heldBy(p.status(now)); h != "" {
			held += p.fullMethod + ": " + h
		}
	}
	return held
}

// TestUpdateServiceConfigUnderHedgedLoadHoldsNothing: callers make hedged
// and retried calls with random faults (failures, pushbacks, commits,
// panics below the interceptor, cancellations), the connection is replaced
// under load, and meanwhile the config is replaced again and again: a
// method flips between hedging and retry, is removed and comes back, its
// bulkhead's cap is raised and lowered, its breaker is kept or replaced.
// Admin calls (Status, Statuses, HedgingDelay, ForceOpen) with caller-chosen
// names run alongside. At the end no guard of any state the client ever
// had holds anything, and no goroutine is left.
func TestUpdateServiceConfigUnderHedgedLoadHoldsNothing(t *testing.T) {
	noGoroutineLeft(t)
	const goroutines, calls = 12, 60
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	configs := updateStressConfigs()
	c := newTestClient(t, WithServiceConfig(configs[0]))
	var tr stateTracker
	tr.record(c)
	t.Cleanup(func() {
		if held := tr.held(); held != "" {
			deadline := time.Now().Add(nothingHeldWithin)
			for held != "" && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
				held = tr.held()
			}
			if held != "" {
				t.Errorf("after the test, guards of some state still held: %s", held)
			}
		}
	})

	srv := &testserver.Server{}
	srv.SetScript(hedgeStressScript)
	dial := append(c.DialOptions(), grpc.WithChainUnaryInterceptor(hedgePanicBelow))
	conn := &hedgeStressConn{start: func() *grpc.ClientConn { return testserver.Start(t, srv, dial...) }}
	conn.cur.Store(conn.start())

	stop := make(chan struct{})
	var admin sync.WaitGroup
	admin.Go(func() { // the updater
		rng := rand.New(rand.NewPCG(seed, 1))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := c.UpdateServiceConfig(configs[rng.IntN(len(configs))]); err != nil {
				t.Errorf("UpdateServiceConfig: %v", err)
				return
			}
			tr.record(c)
			time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
		}
	})
	admin.Go(func() { // an admin page with names from requests
		rng := rand.New(rand.NewPCG(seed, 2))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := "/" + echoService + "/M" + strconv.Itoa(rng.IntN(5000))
			_ = c.Status(name)
			_, _ = c.HedgingDelay(name)
			_ = c.Statuses()
			if rng.IntN(50) == 0 {
				_ = c.ForceOpen(name) // a breaker no call uses: held open, harmless
			}
			tr.record(c)
		}
	})

	var counts hedgeStressCounts
	var done atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		grng := rand.New(rand.NewPCG(seed, uint64(10+g)))
		wg.Go(func() {
			for i := range calls {
				if done.Add(1) == int64(goroutines*calls/2) {
					conn.replace()
				}
				stub := echov1.NewEchoServiceClient(conn.cur.Load())
				updateStressCall(t, stub, grng, fmt.Sprintf("%d/%d", g, i), &counts)
			}
		})
	}
	wg.Wait()
	close(stop)
	admin.Wait()
	tr.record(c)
	t.Logf("%d calls ok, %d failed, %d panicked, %d cancelled", counts.ok.Load(), counts.failed.Load(), counts.panicked.Load(), counts.cancelled.Load())
}

// noGoroutineLeft checks, once the test and all its cleanups (connections
// and servers closed) are over, that it left no goroutine behind.
func noGoroutineLeft(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// updateStressCall makes one call with a random plan; under retry, a panic
// below comes up as it was, under hedging as a *copyPanic.
func updateStressCall(t *testing.T, stub echov1.EchoServiceClient, rng *rand.Rand, id string, counts *hedgeStressCounts) {
	msg := hedgeEncodePlan(id, hedgeRandomPlan(rng, 4))
	ctx := t.Context()
	if rng.IntN(4) == 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(3000))*time.Microsecond)
		defer cancel()
	}
	resp, err, recovered := func() (resp *echov1.EchoResponse, err error, recovered any) {
		defer func() { recovered = recover() }()
		resp, err = stub.Echo(ctx, &echov1.EchoRequest{Message: msg})
		return resp, err, nil
	}()
	switch {
	case recovered != nil:
		var cp *copyPanic
		if e, ok := recovered.(error); ok && errors.As(e, &cp) {
			recovered = cp.value
		}
		if recovered != hedgeStressPanic {
			t.Errorf("call %s panicked with %v, want the panic from below", id, recovered)
		}
		counts.panicked.Add(1)
	case err == nil:
		if resp.GetMessage() != msg {
			t.Errorf("call %s got reply %q, want its own", id, resp.GetMessage())
		}
		counts.ok.Add(1)
	case ctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded:
		counts.cancelled.Add(1)
	default:
		if code := status.Code(err); !hedgeStressCodes.Has(code) {
			t.Errorf("call %s failed with %v", id, err)
		}
		counts.failed.Add(1)
	}
}
