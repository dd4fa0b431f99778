package interceptor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Regression tests for hedged unary calls (issue 9), each named after what
// it pins.

// guardedHedging is hedging with the method's breaker and bulkhead.
func guardedHedging(hp serviceconfig.HedgingPolicy, cb *serviceconfig.CircuitBreaker, bh *serviceconfig.Bulkhead) ClientOption {
	return WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: echoService}},
		HedgingPolicy:  &hp,
		CircuitBreaker: cb,
		Bulkhead:       bh,
	})
}

// newEchoBelow is newEcho with unary interceptors installed after the
// client's, closer to the transport: what a later interceptor, a codec or
// a stats handler sees of the calls the client makes.
func newEchoBelow(t *testing.T, srv *testserver.Server, below []grpc.UnaryClientInterceptor, opts ...ClientOption) (echov1.EchoServiceClient, *Client) {
	t.Helper()
	c := newTestClient(t, opts...)
	dial := append(c.DialOptions(), grpc.WithChainUnaryInterceptor(below...))
	cc := testserver.Start(t, srv, dial...)
	return echov1.NewEchoServiceClient(cc), c
}

// callTag is a call option naming the call that passed it, so an
// interceptor below can tell whose options a copy runs with.
type callTag struct {
	grpc.EmptyCallOption
	id string
}

// previousAttempts returns grpc-previous-rpc-attempts of an outgoing
// context: 0 for the first copy.
func previousAttempts(ctx context.Context) int {
	md, _ := metadata.FromOutgoingContext(ctx)
	if v := md.Get(previousAttemptsKey); len(v) > 0 {
		n, _ := strconv.Atoi(v[len(v)-1])
		return n
	}
	return 0
}

// Item 1: copies read the caller's pooled call-option slice after the call
// returned; it was cleared (nil options: a panic in grpc) or reused by
// another call. Under -race the read of a cleared slice is a data race.
func TestHedgingCopiesOwnTheirCallOptionsUnderConcurrentCalls(t *testing.T) {
	const goroutines, calls = 16, 40
	srv := &testserver.Server{}
	srv.SetScript(func(testserver.Attempt) testserver.Outcome {
		return testserver.Outcome{Delay: time.Millisecond}
	})
	var nilOpts, foreign atomic.Int64
	check := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		md, _ := metadata.FromOutgoingContext(ctx)
		want := md.Get("call-id")
		for _, o := range opts {
			switch o := o.(type) {
			case nil:
				nilOpts.Add(1)
				return status.Error(codes.Internal, "nil call option")
			case callTag:
				if len(want) != 1 || o.id != want[0] {
					foreign.Add(1)
				}
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	stub, _ := newEchoBelow(t, srv, []grpc.UnaryClientInterceptor{check},
		hedging(3, time.Millisecond, codes.Unavailable))
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range calls {
				id := fmt.Sprintf("%d/%d", g, i)
				ctx := metadata.AppendToOutgoingContext(t.Context(), "call-id", id)
				if _, err := stub.Echo(ctx, &echov1.EchoRequest{Message: id}, callTag{id: id}); err != nil {
					t.Errorf("Echo(%s) = %v, want success", id, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n, f := nilOpts.Load(), foreign.Load(); n != 0 || f != 0 {
		t.Errorf("copies ran with %d nil call options and %d options of another call, want none", n, f)
	}
}

// Item 3: after a pushback re-armed the timer with no copy running, the
// breaker refused the next copy and the call waited for its deadline, or
// forever without one.
func TestHedgingEndsWhenNothingRunsAndTheNextCopyIsRefused(t *testing.T) {
	for _, withDeadline := range []bool{true, false} {
		t.Run("deadline="+strconv.FormatBool(withDeadline), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(func(testserver.Attempt) testserver.Outcome {
					return testserver.Outcome{Err: status.Error(codes.Unavailable, "down"), Trailer: metadata.Pairs(pushbackKey, "10")}
				})
				stub, _ := newEcho(t, srv, guardedHedging(
					serviceconfig.HedgingPolicy{MaxAttempts: 3, HedgingDelay: time.Second, NonFatalStatusCodes: []codes.Code{codes.Unavailable}},
					&serviceconfig.CircuitBreaker{ConsecutiveFailures: 1, OpenDuration: time.Minute}, nil))
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				if withDeadline {
					ctx, cancel = context.WithTimeout(ctx, 3*time.Second)
					defer cancel()
				} else {
					time.AfterFunc(time.Hour, cancel) // ends a hang, to report it
				}
				start := time.Now()
				_, err := stub.Echo(ctx, &echov1.EchoRequest{})
				var re *RetryError
				if !errors.As(err, &re) || status.Code(err) != codes.Unavailable || re.Reason != StopCircuitOpen {
					t.Errorf("Echo() = %#v, want the copy's UNAVAILABLE, stopped by the open circuit", err)
				}
				if elapsed := time.Since(start); elapsed != 10*time.Millisecond || srv.Count("Echo") != 1 {
					t.Errorf("call took %v over %d copies, want 10ms (the pushback) and 1 copy", elapsed, srv.Count("Echo"))
				}
			})
		})
	}
}

// Item 4: the caller's Header, Trailer and Peer options went to every copy,
// so a losing copy wrote the caller's variables after the call returned (a
// data race under -race), and the caller could read the loser's.
func TestHedgingCallerGetsTheWinnersHeaderTrailerAndPeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			n := strconv.Itoa(a.N)
			o := testserver.Outcome{Header: metadata.Pairs("copy", n), Trailer: metadata.Pairs("copy-t", n)}
			if a.N == 1 {
				o.Delay = time.Hour // the loser, cancelled when the call returns
			}
			return o
		})
		stub, _ := newEcho(t, srv, hedging(2, 10*time.Millisecond, codes.Unavailable))
		var header, trailer metadata.MD
		var p peer.Peer
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}, grpc.Header(&header), grpc.Trailer(&trailer), grpc.Peer(&p)); err != nil {
			t.Fatalf("Echo() = %v, want success", err)
		}
		read := func() (string, string, bool) {
			return strings.Join(header.Get("copy"), ","), strings.Join(trailer.Get("copy-t"), ","), p.Addr != nil
		}
		h, tr, hasPeer := read() // races with a loser writing them
		if h != "2" || tr != "2" || !hasPeer {
			t.Errorf("after the call: header copy=%q, trailer copy-t=%q, peer set %v; want the winner's: 2, 2, true", h, tr, hasPeer)
		}
		synctest.Wait() // the loser has ended: it must not have written them
		if h, tr, hasPeer = read(); h != "2" || tr != "2" || !hasPeer {
			t.Errorf("after the loser ended: header copy=%q, trailer copy-t=%q, peer set %v; want the winner's: 2, 2, true", h, tr, hasPeer)
		}
	})
}

// Item 4, failed calls: the caller gets the trailer of the copy whose
// error the call returns, not that of a copy cancelled after it.
func TestHedgingFailedCallGetsTheReturnedCopysTrailer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.N == 1 { // fatal, while copy 2 runs
				return testserver.Outcome{Delay: 5 * time.Millisecond, Err: status.Error(codes.InvalidArgument, "1"), Trailer: metadata.Pairs("copy-t", "1")}
			}
			return testserver.Outcome{Delay: time.Hour, Trailer: metadata.Pairs("copy-t", "2")}
		})
		stub, _ := newEcho(t, srv, hedging(2, time.Millisecond, codes.Unavailable))
		var trailer metadata.MD
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{}, grpc.Trailer(&trailer))
		synctest.Wait() // copy 2 has been cancelled and ended
		if status.Convert(err).Message() != "1" || strings.Join(trailer.Get("copy-t"), ",") != "1" {
			t.Errorf("Echo() = %v with trailer %v, want copy 1's error and trailer", err, trailer)
		}
	})
}

// Item 6 (hedging): a panic below the interceptor in a copy's goroutine
// killed the process and left the copy's bulkhead slot and breaker token
// held. It must reach the caller's goroutine, and release them.
func TestHedgingPanicInACopyReachesTheCallerAndReleasesItsGuards(t *testing.T) {
	for _, panicking := range []int{0, 1} { // the first copy, or the second
		t.Run("copy="+strconv.Itoa(panicking+1), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: time.Hour} })
				boom := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
					if previousAttempts(ctx) == panicking {
						panic("boom in copy " + strconv.Itoa(panicking+1))
					}
					return invoker(ctx, method, req, reply, cc, opts...)
				}
				stub, c := newEchoBelow(t, srv, []grpc.UnaryClientInterceptor{boom}, guardedHedging(
					serviceconfig.HedgingPolicy{MaxAttempts: 3, HedgingDelay: 10 * time.Millisecond, NonFatalStatusCodes: []codes.Code{codes.Unavailable}},
					&serviceconfig.CircuitBreaker{ConsecutiveFailures: 1, OpenDuration: time.Minute, HalfOpenProbes: 1},
					&serviceconfig.Bulkhead{MaxConcurrent: 3}))
				start := time.Now()
				recovered := func() (r any) {
					defer func() { r = recover() }()
					_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{})
					return nil
				}()
				if msg := fmt.Sprint(recovered); !strings.Contains(msg, "boom in copy") {
					t.Errorf("the caller recovered %q, want the copy's panic", msg)
				}
				if elapsed := time.Since(start); elapsed != time.Duration(panicking)*10*time.Millisecond {
					t.Errorf("the panic reached the caller after %v, want %v", elapsed, time.Duration(panicking)*10*time.Millisecond)
				}
				synctest.Wait() // the other copies are cancelled and settle
				if s := c.Status(echoMethod); s.Bulkhead.InFlight != 0 || s.Breaker.State != BreakerClosed {
					t.Errorf("after the panic: bulkhead in flight %d, breaker %v; want 0, closed", s.Bulkhead.InFlight, s.Breaker.State)
				}
			})
		})
	}
}

// gRFC A6: a copy that received response headers commits the call: its
// outcome is final, even a non-fatal failure, and no other copy starts.
func TestHedgingCopyWithResponseHeadersCommitsTheCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.N == 1 { // headers, then a non-fatal failure
				return testserver.Outcome{Header: metadata.Pairs("k", "v"), Delay: 15 * time.Millisecond, Err: status.Error(codes.Unavailable, "committed")}
			}
			return testserver.Outcome{Delay: time.Hour}
		})
		stub, _ := newEcho(t, srv, hedging(3, 10*time.Millisecond, codes.Unavailable))
		start := time.Now()
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
		var re *RetryError
		if !errors.As(err, &re) || status.Convert(err).Message() != "committed" || re.Reason != StopCommitted {
			t.Errorf("Echo() = %#v, want the committed copy's UNAVAILABLE, stopped as committed", err)
		}
		// Copy 2 left at 10ms; copy 1's answer at 15ms is final, so copy 3
		// (due at 20ms, or at once after a non-fatal failure) never leaves.
		if elapsed := time.Since(start); elapsed != 15*time.Millisecond || srv.Count("Echo") != 2 {
			t.Errorf("call took %v over %d copies, want 15ms and 2", elapsed, srv.Count("Echo"))
		}
	})
}

// gRFC A6: a trailers-only failure does not commit; hedging goes on.
func TestHedgingTrailersOnlyFailureDoesNotCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(1, codes.Unavailable))
		stub, _ := newEcho(t, srv, hedging(3, time.Hour, codes.Unavailable))
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil || srv.Count("Echo") != 2 {
			t.Errorf("Echo() = %v over %d copies, want the second copy's success", err, srv.Count("Echo"))
		}
	})
}

// Copies still running when the call returns are cancelled at once, and
// each settles its own accounts: its bulkhead slot, its breaker token and
// its budget token (spent: a copy that reached the server was extra load,
// whether it won or was cancelled).
func TestHedgingLosingCopiesAreCancelledAndSettleTheirAccounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.N < 3 {
				return testserver.Outcome{Delay: time.Hour}
			}
			return testserver.Outcome{Delay: 5 * time.Millisecond}
		})
		stub, c := newEcho(t, srv, WithServiceConfig(&serviceconfig.Config{
			MethodConfig: []serviceconfig.MethodConfig{{
				Name:           []serviceconfig.Name{{Service: echoService}},
				HedgingPolicy:  &serviceconfig.HedgingPolicy{MaxAttempts: 3, HedgingDelay: 10 * time.Millisecond, NonFatalStatusCodes: []codes.Code{codes.Unavailable}},
				CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 1},
				Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 3},
			}},
			RetryBudget: &serviceconfig.RetryBudget{Ratio: 0.5},
		}))
		b := c.state.Load().storm.budget
		before := b.Available(time.Now())
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatalf("Echo() = %v, want copy 3's success", err)
		}
		synctest.Wait() // the two losers end: cancelled, not after their hour
		s := c.Status(echoMethod)
		if s.Bulkhead.InFlight != 0 || s.Breaker.State != BreakerClosed {
			t.Errorf("after the call: bulkhead in flight %d, breaker %v; want 0, closed", s.Bulkhead.InFlight, s.Breaker.State)
		}
		// The call deposited Ratio; copies 2 and 3 withdrew one retry each
		// and keep it spent: the winner and the cancelled loser were both
		// sent.
		if after := b.Available(time.Now()); after != before+0.5-2 {
			t.Errorf("budget: %v retries available after the call, want %v", after, before+0.5-2)
		}
	})
}

// grpc.OnFinish promises one call of its callback; every copy called it,
// losers after the call returned, from their own goroutines.
func TestHedgingOnFinishRunsOnceWithTheCallsError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.N == 1 {
				return testserver.Outcome{Delay: time.Hour}
			}
			return testserver.Outcome{}
		})
		stub, _ := newEcho(t, srv, hedging(3, 10*time.Millisecond, codes.Unavailable))
		var calls []error // appended on the caller's goroutine only, or it races
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{}, grpc.OnFinish(func(err error) { calls = append(calls, err) }))
		synctest.Wait() // the loser has ended
		if err != nil || len(calls) != 1 || calls[0] != nil {
			t.Errorf("Echo() = %v with OnFinish called with %v, want success and one call with nil", err, calls)
		}
	})
}

// Item 6 (hedging), the probe: a half-open breaker's probe that panicked
// below the interceptor must give its probe slot back, so the next call can
// probe and close the breaker.
func TestHedgingPanicInAProbeCopyFreesTheProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.N == 1 {
				return testserver.Outcome{Err: status.Error(codes.Unavailable, "down")}
			}
			return testserver.Outcome{}
		})
		boom := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get("panic")) > 0 {
				panic("boom in the probe")
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		stub, c := newEchoBelow(t, srv, []grpc.UnaryClientInterceptor{boom}, guardedHedging(
			serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: time.Hour, NonFatalStatusCodes: []codes.Code{codes.Unavailable}},
			&serviceconfig.CircuitBreaker{ConsecutiveFailures: 1, OpenDuration: 10 * time.Millisecond, HalfOpenProbes: 1}, nil))
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); status.Code(err) != codes.Unavailable {
			t.Fatalf("first Echo() = %v, want UNAVAILABLE, tripping the breaker", err)
		}
		time.Sleep(10 * time.Millisecond) // the breaker's open time (fake time)
		func() {
			defer func() { _ = recover() }()
			ctx := metadata.AppendToOutgoingContext(t.Context(), "panic", "yes")
			_, _ = stub.Echo(ctx, &echov1.EchoRequest{})
			t.Errorf("the probe's Echo() returned, want its panic")
		}()
		if s := c.Status(echoMethod).Breaker; s.Probes != 0 {
			t.Errorf("after the probe panicked: breaker %v with %d probes out, want none", s.State, s.Probes)
		}
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil || c.Status(echoMethod).Breaker.State != BreakerClosed {
			t.Errorf("next Echo() = %v with breaker %v, want a probe that succeeds and closes it", err, c.Status(echoMethod).Breaker.State)
		}
	})
}

// TestHedgingMessageErrorIsFatal pins that a copy failing with one of
// grpc-go's message errors (here a request larger than the client's
// MaxCallSendMsgSize, RESOURCE_EXHAUSTED made on the client) ends the call,
// even with RESOURCE_EXHAUSTED listed as non-fatal: every copy would meet
// it again. (A reply too large comes after the headers: that copy commits.)
func TestHedgingMessageErrorIsFatal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		hedges := 0
		stub, _ := newEcho(t, srv, hedging(3, 100*time.Millisecond, codes.ResourceExhausted),
			WithOnRetry(func(context.Context, RetryEvent) { hedges++ }))
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{Payload: make([]byte, 1024)}, grpc.MaxCallSendMsgSize(64))
		var re *RetryError
		if status.Code(err) != codes.ResourceExhausted || !errors.As(err, &re) || re.Reason != StopNonRetryable {
			t.Fatalf("Echo() = %#v, want RESOURCE_EXHAUSTED, stopped as non-retryable", err)
		}
		if hedges != 0 || re.Attempts != 1 {
			t.Errorf("%d copies sent after the first (%d attempts), want none: a message error is fatal", hedges, re.Attempts)
		}
	})
}
