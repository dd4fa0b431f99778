package interceptor

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// lockedRand is a seeded source shared by goroutines.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newLockedRand(t testing.TB) *lockedRand {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return &lockedRand{r: rand.New(rand.NewPCG(seed, seed>>1))}
}

// float returns a number in [0, 1).
func (l *lockedRand) float() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64()
}

// randomFaults is a server script of the faults an incident brings:
// UNAVAILABLE, with and without pushback, failures after the headers,
// non-retryable codes, and latency.
func randomFaults(rnd *lockedRand) testserver.Script {
	return func(testserver.Attempt) testserver.Outcome {
		var o testserver.Outcome
		if rnd.float() < 0.3 {
			o.Delay = time.Duration(rnd.float() * float64(2*time.Millisecond))
		}
		switch p := rnd.float(); {
		case p < 0.12:
			o.Err = status.Error(codes.Unavailable, "down")
		case p < 0.15:
			o.Err = status.Error(codes.Unavailable, "down, wait")
			o.Trailer = metadata.Pairs(pushbackKey, "1")
		case p < 0.17:
			o.Err = status.Error(codes.Unavailable, "overloaded, stop")
			o.Trailer = metadata.Pairs(pushbackKey, "-1")
		case p < 0.20:
			o.Header = metadata.Pairs("sent", "yes")
			o.Err = status.Error(codes.Unavailable, "after headers")
		case p < 0.23:
			o.Err = status.Error(codes.InvalidArgument, "bad")
		}
		return o
	}
}

// stressConfig is a method config with every guard on and tight bounds, so
// that a stress test crosses every state: retries, an open and half-open
// breaker, a full bulkhead with a queue.
func stressConfig(p *serviceconfig.RetryPolicy) ClientOption {
	return WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: echoService}},
		RetryPolicy:    p,
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 8, OpenDuration: 5 * time.Millisecond},
		Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 10, MaxQueue: 4, MaxQueueWait: 5 * time.Millisecond},
	})
}

// randomPanicBelow is a unary interceptor installed after the client's that
// panics on a share of the attempts, as a broken interceptor, codec or stats
// handler would.
func randomPanicBelow(rnd *lockedRand, share float64) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if rnd.float() < share {
			panic("injected below the interceptor")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// stressCall makes one call with a random deadline or cancellation, and
// recovers an injected panic.
func stressCall(ctx context.Context, rnd *lockedRand, call func(context.Context) error) (err error, panicked bool) {
	defer func() {
		if v := recover(); v != nil {
			panicked = true
		}
	}()
	switch p := rnd.float(); {
	case p < 0.2:
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(rnd.float()*float64(3*time.Millisecond)))
		defer cancel()
	case p < 0.3:
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		t := time.AfterFunc(time.Duration(rnd.float()*float64(time.Millisecond)), cancel)
		defer t.Stop()
	}
	return call(ctx), false
}

// stressDuration is how long a stress test runs: short in CI, -stress long.
func stressDuration() time.Duration {
	if *stressFor > 0 {
		return *stressFor
	}
	return 700 * time.Millisecond
}

// TestStressUnaryRetry runs 16 goroutines of retried unary calls through
// one client on two connections, against random faults, with random
// deadlines and cancellations, panics below the interceptor, and the second
// connection closed under load. Every call must end with a status, and the
// test with nothing held (checkNothingHeld), no goroutine left and no race.
//
// It runs for stressDuration and until a panic was injected below the
// interceptor (regression: it ran for 700ms of real time only, and on a
// busy machine, where few attempts got that far, it sometimes injected
// none and failed for want of coverage).
func TestStressUnaryRetry(t *testing.T) {
	rnd := newLockedRand(t)
	srv := &testserver.Server{}
	srv.SetScript(randomFaults(rnd))
	p := &serviceconfig.RetryPolicy{MaxAttempts: 4, InitialBackoff: 100 * time.Microsecond, MaxBackoff: time.Millisecond, BackoffMultiplier: 2}
	c := newTestClient(t, stressConfig(p), WithRetryBudget(nil))
	dial := append(c.DialOptions(), grpc.WithChainUnaryInterceptor(randomPanicBelow(rnd, 0.02)))
	stubs := []echov1.EchoServiceClient{
		echov1.NewEchoServiceClient(testserver.Start(t, srv, dial...)),
	}
	doomed := testserver.Start(t, srv, dial...)
	stubs = append(stubs, echov1.NewEchoServiceClient(doomed))

	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	start := time.Now()
	var calls, panics, unknown atomic.Int64
	// covered ends the run: stressDuration passed and a panic was injected,
	// or a minute passed without one (then the path is unreachable).
	covered := func() {
		if d := time.Since(start); d >= stressDuration() && panics.Load() > 0 || d >= time.Minute+stressDuration() {
			stop()
		}
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			stub := stubs[g%len(stubs)]
			for ctx.Err() == nil {
				err, panicked := stressCall(ctx, rnd, func(ctx context.Context) error {
					_, err := stub.Echo(ctx, &echov1.EchoRequest{Message: "stress"})
					return err
				})
				calls.Add(1)
				switch {
				case panicked:
					panics.Add(1)
				case err != nil && status.Code(err) == codes.Unknown:
					unknown.Add(1)
					t.Errorf("Echo() = %v: every call must end with a status", err)
				}
				covered()
			}
		})
	}
	time.AfterFunc(stressDuration()/2, func() { _ = doomed.Close() })
	wg.Wait()
	t.Logf("%d calls, %d attempts reached the server, %d panics below recovered", calls.Load(), srv.Count(""), panics.Load())
	if panics.Load() == 0 {
		t.Errorf("no panic was injected in %v: the test did not cover that path", time.Since(start))
	}
}
