package interceptor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The hedging stress test: many goroutines make hedged calls through one
// Client while the server fails at random, callers cancel at random, an
// interceptor below ours panics at random and the connection is closed
// under load. Each call carries its own fault plan in its request, one
// step per copy, so the server script stays a function of the attempt it
// is given.

// hedgeStep is what the server, or the interceptor below ours, does with
// one copy of a stress call.
type hedgeStep struct {
	kind  byte // see hedgeStepKinds
	delay time.Duration
}

// hedgeStepKinds are the kinds of hedgeStep: o succeeds, f fails fatally
// (INVALID_ARGUMENT), d fails fatally with DATA_LOSS, the one code the
// stress breaker counts (so that it trips now and then, and recovers:
// callers in a closed loop would starve the probes of a breaker that trips
// often, a known issue of its own), u fails non-fatally (UNAVAILABLE), p fails
// non-fatally with a pushback of delay, n fails non-fatally with a pushback
// that says stop, h sends headers then fails non-fatally (it commits), x
// panics below the interceptor.
const hedgeStepKinds = "ooooofduupnhx"

// hedgeEncodePlan writes a call's id and the steps of its copies into the
// request message: "id|o2,u0,p3".
func hedgeEncodePlan(id string, steps []hedgeStep) string {
	var b strings.Builder
	b.WriteString(id)
	for i, s := range steps {
		if i == 0 {
			b.WriteByte('|')
		} else {
			b.WriteByte(',')
		}
		b.WriteByte(s.kind)
		b.WriteString(strconv.Itoa(int(s.delay / time.Millisecond)))
	}
	return b.String()
}

// hedgePlanStep returns the step of copy n (0 for the first) of the call whose
// request message is msg; copies past the plan succeed.
func hedgePlanStep(msg string, n int) hedgeStep {
	_, plan, _ := strings.Cut(msg, "|")
	steps := strings.Split(plan, ",")
	if n < 0 || n >= len(steps) || len(steps[n]) < 2 {
		return hedgeStep{kind: 'o'}
	}
	ms, _ := strconv.Atoi(steps[n][1:])
	return hedgeStep{kind: steps[n][0], delay: time.Duration(ms) * time.Millisecond}
}

// hedgeStressScript answers each copy as its call's plan says. Every answer
// but a trailers-only failure carries the call's message as header "call",
// so a caller can check that it got its own call's header.
func hedgeStressScript(a testserver.Attempt) testserver.Outcome {
	msg := ""
	if len(a.Messages) > 0 {
		msg = a.Messages[0]
	}
	s := hedgePlanStep(msg, max(a.Previous, 0))
	o := testserver.Outcome{Delay: s.delay}
	call := metadata.Pairs("call", msg)
	switch s.kind {
	case 'o':
		o.Header = call
	case 'f':
		o.Err = status.Error(codes.InvalidArgument, "stress: fatal")
	case 'd':
		o.Err = status.Error(codes.DataLoss, "stress: breaker failure")
	case 'u':
		o.Err = status.Error(codes.Unavailable, "stress: non-fatal")
	case 'p':
		o.Err = status.Error(codes.Unavailable, "stress: pushback")
		o.Trailer = metadata.Pairs(pushbackKey, strconv.Itoa(int(s.delay/time.Millisecond)))
		o.Delay = 0
	case 'n':
		o.Err = status.Error(codes.Unavailable, "stress: stop")
		o.Trailer = metadata.Pairs(pushbackKey, "-1")
	case 'h':
		o.Header = call
		o.Err = status.Error(codes.Unavailable, "stress: committed")
	}
	return o
}

// hedgeStressCodes are the codes a stress call may fail with: the script's,
// the guards' (UNAVAILABLE, RESOURCE_EXHAUSTED) and a closed connection's
// (CANCELED, UNAVAILABLE).
var hedgeStressCodes = rescodes.Of(codes.InvalidArgument, codes.DataLoss, codes.Unavailable, codes.ResourceExhausted, codes.Canceled)

// hedgeStressPanic is what the interceptor below ours panics with.
const hedgeStressPanic = "stress: panic below the interceptor"

// hedgePanicBelow panics in the copies whose plan step says so.
func hedgePanicBelow(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if r, ok := req.(*echov1.EchoRequest); ok && hedgePlanStep(r.GetMessage(), previousAttempts(ctx)).kind == 'x' {
		panic(hedgeStressPanic)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// hedgeRandomPlan draws the steps of a call's copies.
func hedgeRandomPlan(rng *rand.Rand, copies int) []hedgeStep {
	steps := make([]hedgeStep, copies)
	for i := range steps {
		steps[i] = hedgeStep{kind: hedgeStepKinds[rng.IntN(len(hedgeStepKinds))], delay: time.Duration(rng.IntN(4)) * time.Millisecond}
	}
	return steps
}

// hedgeStressConn is the connection the callers share; one of them replaces it
// under load, closing the old one with calls in flight.
type hedgeStressConn struct {
	cur   atomic.Pointer[grpc.ClientConn]
	start func() *grpc.ClientConn
}

// replace dials a new connection for the callers and closes the old one.
func (s *hedgeStressConn) replace() {
	old := s.cur.Swap(s.start())
	_ = old.Close()
}

// hedgeStressCounts tallies how calls ended, for the log.
type hedgeStressCounts struct {
	ok, failed, panicked, cancelled atomic.Int64
	refused                         atomic.Int64 // failed with no copy sent
	trips                           atomic.Int64 // the breaker opened
}

func TestHedgingStress(t *testing.T) {
	const goroutines, copies = 16, 4
	calls := 50 // per goroutine and round
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	var counts hedgeStressCounts
	c := newTestClient(t, WithOnStateChange(func(_ string, _, to BreakerState) {
		if to == BreakerOpen {
			counts.trips.Add(1)
		}
	}), WithServiceConfig(&serviceconfig.Config{
		MethodConfig: []serviceconfig.MethodConfig{{
			Name: []serviceconfig.Name{{Service: echoService}},
			HedgingPolicy: &serviceconfig.HedgingPolicy{
				MaxAttempts: copies, HedgingDelay: time.Millisecond, NonFatalStatusCodes: []codes.Code{codes.Unavailable},
			},
			CircuitBreaker: &serviceconfig.CircuitBreaker{
				ConsecutiveFailures: 3, OpenDuration: time.Millisecond, MaxOpenDuration: 4 * time.Millisecond, HalfOpenProbes: 2,
				FailureStatusCodes: []codes.Code{codes.DataLoss},
			},
			Bulkhead: &serviceconfig.Bulkhead{MaxConcurrent: 32, MaxQueue: 16, MaxQueueWait: 2 * time.Millisecond},
		}},
		RetryThrottling: &serviceconfig.RetryThrottling{MaxTokens: 1000, TokenRatio: 1},
		RetryBudget:     &serviceconfig.RetryBudget{Ratio: 1, MinRetriesPerSecond: 1000},
	}))
	start := time.Now()
	rounds := 0
	for ; rounds < 3 || time.Since(start) < *stressFor; rounds++ {
		t.Run("round"+strconv.Itoa(rounds), func(t *testing.T) {
			hedgeStressRound(t, c, rand.New(rand.NewPCG(seed, uint64(rounds))), goroutines, calls, copies, &counts)
		})
		if t.Failed() {
			break
		}
	}
	t.Logf("%d rounds in %v: %d calls ok, %d failed (%d refused at once), %d panicked, %d cancelled; %d breaker trips", rounds, time.Since(start).Round(time.Millisecond),
		counts.ok.Load(), counts.failed.Load(), counts.refused.Load(), counts.panicked.Load(), counts.cancelled.Load(), counts.trips.Load())
}

// hedgeStressRound runs goroutines × calls hedged calls against a fresh server,
// and replaces the connection once, half-way through.
func hedgeStressRound(t *testing.T, c *Client, rng *rand.Rand, goroutines, calls, copies int, counts *hedgeStressCounts) {
	srv := &testserver.Server{}
	srv.SetScript(hedgeStressScript)
	dial := append(c.DialOptions(), grpc.WithChainUnaryInterceptor(hedgePanicBelow))
	conn := &hedgeStressConn{start: func() *grpc.ClientConn { return testserver.Start(t, srv, dial...) }}
	conn.cur.Store(conn.start())
	var done atomic.Int64
	half := int64(goroutines * calls / 2)
	var wg sync.WaitGroup
	for g := range goroutines {
		grng := rand.New(rand.NewPCG(rng.Uint64(), uint64(g)))
		wg.Go(func() {
			for i, sent := 0, 0; sent < calls && i < 20*calls; i++ {
				if done.Add(1) == half {
					conn.replace()
				}
				stub := echov1.NewEchoServiceClient(conn.cur.Load())
				wait := hedgeStressCall(t, stub, grng, fmt.Sprintf("%d/%d", g, i), copies, counts)
				if wait == 0 {
					sent++
					continue
				}
				// Refused at once: back off as the rejection says, as a
				// well-behaved caller does. Callers spinning on refusals
				// starve the breaker's probes (issue 9's storm part).
				timer := time.NewTimer(wait)
				<-timer.C
			}
		})
	}
	wg.Wait()
}

// hedgeStressCall makes one hedged call with a random plan and, at random, a
// deadline that cancels it, and checks what it got: its own reply and
// header on success, the panic from below when it panicked. When the call
// was refused with no copy sent, it returns how long to back off.
func hedgeStressCall(t *testing.T, stub echov1.EchoServiceClient, rng *rand.Rand, id string, copies int, counts *hedgeStressCounts) (backoff time.Duration) {
	msg := hedgeEncodePlan(id, hedgeRandomPlan(rng, copies))
	ctx := t.Context()
	if rng.IntN(4) == 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(3000))*time.Microsecond)
		defer cancel()
	}
	var header metadata.MD
	resp, err, recovered := func() (resp *echov1.EchoResponse, err error, recovered any) {
		defer func() { recovered = recover() }()
		resp, err = stub.Echo(ctx, &echov1.EchoRequest{Message: msg}, grpc.Header(&header))
		return resp, err, nil
	}()
	switch {
	case recovered != nil:
		var cp *copyPanic
		if e, ok := recovered.(error); !ok || !errors.As(e, &cp) || cp.value != hedgeStressPanic {
			t.Errorf("call %s panicked with %v, want the panic from below", id, recovered)
		}
		counts.panicked.Add(1)
	case err == nil:
		if resp.GetMessage() != msg || strings.Join(header.Get("call"), ",") != msg {
			t.Errorf("call %s got reply %q and header %v, want its own: %q", id, resp.GetMessage(), header, msg)
		}
		counts.ok.Add(1)
	case ctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded && hedgeHasDeadline(ctx):
		// The server may see the deadline pass, and reset the stream,
		// a moment before the caller's context ends.
		counts.cancelled.Add(1)
	default:
		if code := status.Code(err); !hedgeStressCodes.Has(code) {
			t.Errorf("call %s failed with %v, want a code the script, the guards or the closed connection give", id, err)
		}
		counts.failed.Add(1)
		if re := (*RejectedError)(nil); errors.As(err, &re) {
			counts.refused.Add(1)
			return max(re.RetryAfter, 200*time.Microsecond)
		}
	}
	return 0
}

// hedgeHasDeadline reports whether ctx has a deadline.
func hedgeHasDeadline(ctx context.Context) bool {
	_, ok := ctx.Deadline()
	return ok
}
