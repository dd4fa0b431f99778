package interceptor

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

func hedging(maxAttempts int, delay time.Duration, nonFatal ...codes.Code) ClientOption {
	return WithMethodConfig(serviceconfig.MethodConfig{
		Name: []serviceconfig.Name{{Service: echoService}},
		HedgingPolicy: &serviceconfig.HedgingPolicy{
			MaxAttempts: maxAttempts, HedgingDelay: delay, NonFatalStatusCodes: nonFatal,
		},
	})
}

func TestHedgingSendsACopyAfterTheDelayAndTakesTheFirstAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.N == 1 {
				return testserver.Outcome{Delay: time.Second} // a slow replica
			}
			return testserver.Outcome{Delay: 20 * time.Millisecond}
		})
		var events []RetryEvent
		stub, _ := newEcho(t, srv, hedging(3, 100*time.Millisecond, codes.Unavailable),
			WithOnRetry(func(_ context.Context, e RetryEvent) { events = append(events, e) }))
		start := time.Now()
		resp, err := stub.Echo(t.Context(), &echov1.EchoRequest{Message: "fast"})
		if err != nil || resp.GetMessage() != "fast" {
			t.Fatalf("Echo() = %v, %v, want fast", resp, err)
		}
		if elapsed := time.Since(start); elapsed != 120*time.Millisecond {
			t.Errorf("call took %v, want 120ms: the second copy at 100ms answers in 20ms", elapsed)
		}
		a := srv.Attempts()
		if len(a) != 2 || a[0].Previous != -1 || a[1].Previous != 1 {
			t.Errorf("server saw %+v, want 2 copies, the second with grpc-previous-rpc-attempts 1", a)
		}
		if len(events) != 1 || !events[0].Hedge || events[0].Delay != 100*time.Millisecond {
			t.Errorf("OnRetry events = %+v, want one hedge after 100ms", events)
		}
	})
}

func TestHedgingNonFatalFailureSendsTheNextCopyAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(2, codes.Unavailable))
		stub, _ := newEcho(t, srv, hedging(3, time.Hour, codes.Unavailable))
		start := time.Now()
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatalf("Echo() = %v, want the third copy's success", err)
		}
		if time.Since(start) != 0 || srv.Count("Echo") != 3 {
			t.Errorf("took %v over %d copies, want 3 copies at once", time.Since(start), srv.Count("Echo"))
		}
	})
}

func TestHedgingFatalStatusEndsTheCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.N == 1 {
				return testserver.Outcome{Delay: 50 * time.Millisecond, Err: status.Error(codes.InvalidArgument, "bad")}
			}
			return testserver.Outcome{Delay: time.Hour}
		})
		stub, _ := newEcho(t, srv, hedging(3, 10*time.Millisecond, codes.Unavailable))
		start := time.Now()
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
		var re *RetryError
		if status.Code(err) != codes.InvalidArgument || !errors.As(err, &re) || re.Reason != StopNonRetryable {
			t.Fatalf("Echo() = %#v, want the fatal INVALID_ARGUMENT", err)
		}
		// Copies at 0, 10 and 20ms; the first's fatal answer at 50ms ends
		// the call and cancels the two still running.
		if time.Since(start) != 50*time.Millisecond || re.Attempts != 3 {
			t.Errorf("call took %v with %d copies, want 50ms with 3", time.Since(start), re.Attempts)
		}
	})
}

func TestHedgingExhaustedAndPushback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(100, codes.Unavailable))
		stub, _ := newEcho(t, srv, hedging(4, time.Millisecond, codes.Unavailable))
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
		var re *RetryError
		if !errors.As(err, &re) || re.Reason != StopExhausted || re.Attempts != 4 || srv.Count("Echo") != 4 {
			t.Errorf("Echo() = %#v with %d copies, want 4 copies, exhausted", err, srv.Count("Echo"))
		}
	})
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome {
			return testserver.Outcome{Err: status.Error(codes.Unavailable, "x"), Trailer: metadata.Pairs(pushbackKey, "-1")}
		})
		stub, _ := newEcho(t, srv, hedging(4, time.Hour, codes.Unavailable))
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
		var re *RetryError
		if !errors.As(err, &re) || re.Reason != StopPushback || srv.Count("Echo") != 1 {
			t.Errorf("Echo() = %#v with %d copies, want 1 copy, stopped by pushback", err, srv.Count("Echo"))
		}
	})
}

func TestHedgingCancelledCallEndsPromptly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: time.Hour} })
		stub, _ := newEcho(t, srv, hedging(3, 10*time.Millisecond, codes.Unavailable))
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(25*time.Millisecond, cancel)
		start := time.Now()
		_, err := stub.Echo(ctx, &echov1.EchoRequest{})
		if status.Code(err) != codes.Canceled || time.Since(start) != 25*time.Millisecond {
			t.Errorf("Echo() = %v after %v, want CANCELLED at 25ms", err, time.Since(start))
		}
		synctest.Wait() // the three copies end with the call
	})
}

func TestHedgingNoRetryAndStreamsRunOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(100, codes.Unavailable))
		stub, _ := newEcho(t, srv, hedging(3, 0, codes.Unavailable))
		_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{}, NoRetry())
		stream, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Count: 1})
		if err == nil {
			_, _ = stream.Recv()
		}
		if got, want := srv.Count("Echo")+srv.Count("ServerStream"), 2; got != want {
			t.Errorf("server saw %d attempts, want %d: NoRetry and streams are not hedged", got, want)
		}
	})
}
