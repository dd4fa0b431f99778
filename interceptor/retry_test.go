package interceptor

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/internal/backoff"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

func unavailableWithTrailer(n int, vals ...string) testserver.Script {
	return func(a testserver.Attempt) testserver.Outcome {
		if a.N > n {
			return testserver.Outcome{}
		}
		md := metadata.MD{}
		for _, v := range vals {
			md.Append(pushbackKey, v)
		}
		return testserver.Outcome{Err: status.Error(codes.Unavailable, "busy"), Trailer: md}
	}
}

func TestPushback(t *testing.T) {
	tests := []struct {
		name         string
		trailer      []string
		maxPushback  time.Duration
		wantAttempts int
		wantElapsed  time.Duration
		wantErr      bool
		wantReason   StopReason
	}{
		{name: "waits exactly the hint", trailer: []string{"700"}, wantAttempts: 2, wantElapsed: 700 * time.Millisecond},
		{name: "zero retries at once", trailer: []string{"0"}, wantAttempts: 2, wantElapsed: 0},
		{name: "capped by the client", trailer: []string{"60000"}, maxPushback: 2 * time.Second, wantAttempts: 2, wantElapsed: 2 * time.Second},
		{name: "negative stops", trailer: []string{"-1"}, wantAttempts: 1, wantErr: true, wantReason: StopPushback},
		{name: "unparseable stops", trailer: []string{"soon"}, wantAttempts: 1, wantErr: true, wantReason: StopPushback},
		{name: "repeated stops", trailer: []string{"10", "20"}, wantAttempts: 1, wantErr: true, wantReason: StopPushback},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(unavailableWithTrailer(1, tt.trailer...))
				// A backoff far from every hint, so the delay tells which applied.
				p := fastPolicy(3)
				p.InitialBackoff, p.Jitter = 5*time.Second, serviceconfig.JitterNone
				opts := []ClientOption{WithRetryPolicy(p)}
				if tt.maxPushback > 0 {
					opts = append(opts, WithMaxServerPushback(tt.maxPushback))
				}
				stub, _ := newEcho(t, srv, opts...)
				start := time.Now()
				_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
				elapsed := time.Since(start)
				if (err != nil) != tt.wantErr {
					t.Fatalf("Echo() error = %v, want error %v", err, tt.wantErr)
				}
				if got := srv.Count("Echo"); got != tt.wantAttempts {
					t.Errorf("server saw %d attempts, want %d", got, tt.wantAttempts)
				}
				if !tt.wantErr && elapsed != tt.wantElapsed {
					t.Errorf("call took %v, want %v", elapsed, tt.wantElapsed)
				}
				var re *RetryError
				if tt.wantErr && (!errors.As(err, &re) || re.Reason != tt.wantReason) {
					t.Errorf("Echo() error = %#v, want reason %v", err, tt.wantReason)
				}
			})
		})
	}
}

func retryInfoError(delay *durationpb.Duration) error {
	st, err := status.New(codes.ResourceExhausted, "slow down").WithDetails(&errdetails.RetryInfo{RetryDelay: delay})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

func TestRetryInfoDetailIsHonouredAndCapped(t *testing.T) {
	tests := []struct {
		name         string
		delay        *durationpb.Duration
		wantElapsed  time.Duration
		wantAttempts int
	}{
		{"hint", durationpb.New(1500 * time.Millisecond), 1500 * time.Millisecond, 2},
		{"capped", durationpb.New(time.Hour), 3 * time.Second, 2},
		{"negative stops", durationpb.New(-time.Second), 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
					if a.N == 1 {
						return testserver.Outcome{Err: retryInfoError(tt.delay)}
					}
					return testserver.Outcome{}
				})
				p := fastPolicy(3)
				p.InitialBackoff = 10 * time.Second
				stub, _ := newEcho(t, srv, WithRetryPolicy(p), WithMaxServerPushback(3*time.Second))
				start := time.Now()
				_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
				if got := srv.Count("Echo"); got != tt.wantAttempts {
					t.Fatalf("server saw %d attempts (err %v), want %d", got, err, tt.wantAttempts)
				}
				if tt.wantAttempts == 2 && time.Since(start) != tt.wantElapsed {
					t.Errorf("call took %v, want %v", time.Since(start), tt.wantElapsed)
				}
			})
		})
	}
}

func TestPushbackResetsBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		// Attempts 1 and 2 fail plainly, 3 with a pushback, 4 plainly.
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			switch a.N {
			case 1, 2, 4:
				return testserver.Outcome{Err: status.Error(codes.Unavailable, "x")}
			case 3:
				return testserver.Outcome{Err: status.Error(codes.Unavailable, "x"), Trailer: metadata.Pairs(pushbackKey, "50")}
			}
			return testserver.Outcome{}
		})
		p := &serviceconfig.RetryPolicy{MaxAttempts: 5, InitialBackoff: 100 * time.Millisecond,
			MaxBackoff: 10 * time.Second, BackoffMultiplier: 3, Jitter: serviceconfig.JitterNone}
		var delays []time.Duration
		stub, _ := newEcho(t, srv, WithRetryPolicy(p), WithOnRetry(func(_ context.Context, e RetryEvent) {
			delays = append(delays, e.Delay)
		}))
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatalf("Echo() error = %v", err)
		}
		want := []time.Duration{100 * time.Millisecond, 300 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond}
		if len(delays) != len(want) {
			t.Fatalf("delays = %v, want %v", delays, want)
		}
		for i := range want {
			if delays[i] != want[i] {
				t.Errorf("delays = %v, want %v (backoff restarts after a pushback)", delays, want)
				break
			}
		}
	})
}

func TestDeadlineStopsInsteadOfIdling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(100, codes.Unavailable))
		p := &serviceconfig.RetryPolicy{MaxAttempts: 5, InitialBackoff: 400 * time.Millisecond,
			MaxBackoff: 10 * time.Second, BackoffMultiplier: 2, Jitter: serviceconfig.JitterNone}
		stub, _ := newEcho(t, srv, WithRetryPolicy(p))
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		_, err := stub.Echo(ctx, &echov1.EchoRequest{})
		// Attempt 1 at 0, wait 400ms, attempt 2 at 400ms; the next wait of
		// 800ms would end past the deadline at 1s: stop at 400ms.
		if elapsed := time.Since(start); elapsed != 400*time.Millisecond {
			t.Errorf("call took %v, want 400ms (no idling to the deadline)", elapsed)
		}
		var re *RetryError
		if !errors.As(err, &re) || re.Reason != StopDeadline || re.Attempts != 2 {
			t.Fatalf("Echo() error = %#v, want 2 attempts stopped by the deadline", err)
		}
		if status.Code(err) != codes.Unavailable {
			t.Errorf("status.Code(err) = %v, want the last attempt's UNAVAILABLE", status.Code(err))
		}
	})
}

func TestCancelDuringBackoffReturnsPromptly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(100, codes.Unavailable))
		p := fastPolicy(5)
		p.InitialBackoff, p.MaxBackoff, p.Jitter = 10*time.Second, 10*time.Second, serviceconfig.JitterNone
		ctx, cancel := context.WithCancel(t.Context())
		stub, _ := newEcho(t, srv, WithRetryPolicy(p), WithOnRetry(func(context.Context, RetryEvent) {
			time.AfterFunc(time.Second, cancel)
		}))
		start := time.Now()
		_, err := stub.Echo(ctx, &echov1.EchoRequest{})
		if elapsed := time.Since(start); elapsed != time.Second {
			t.Errorf("call took %v, want 1s: cancellation ends the backoff", elapsed)
		}
		if status.Code(err) != codes.Canceled {
			t.Errorf("status.Code(err) = %v, want Canceled", status.Code(err))
		}
		var re *RetryError
		if !errors.As(err, &re) || re.Reason != StopCancelled || status.Code(re.LastAttemptErr) != codes.Unavailable {
			t.Errorf("Echo() error = %#v, want reason cancelled with the last attempt's UNAVAILABLE", err)
		}
		if got := srv.Count("Echo"); got != 1 {
			t.Errorf("server saw %d attempts, want 1", got)
		}
	})
}

func TestPerAttemptTimeoutIsRetriedButCallerDeadlineIsNot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(stallFirst())
		p := fastPolicy(3)
		p.PerAttemptRecvTimeout = 200 * time.Millisecond
		stub, _ := newEcho(t, srv, WithRetryPolicy(p))
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatalf("Echo() error = %v, want success on the second attempt", err)
		}
		if got := srv.Count("Echo"); got != 2 {
			t.Errorf("server saw %d attempts, want 2", got)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: time.Hour} })
		stub, _ := newEcho(t, srv, WithRetryPolicy(fastPolicy(3)))
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		_, err := stub.Echo(ctx, &echov1.EchoRequest{})
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("Echo() error = %v, want DeadlineExceeded", err)
		}
		if got := srv.Count("Echo"); got != 1 {
			t.Errorf("server saw %d attempts, want 1: the caller's deadline is never retried", got)
		}
	})
}

func TestAbortedIsRetriedOnlyForIdempotentMethods(t *testing.T) {
	tests := []struct {
		name  string
		opts  []ClientOption
		call  func(echov1.EchoServiceClient, context.Context) error
		wantN int
	}{
		{"Echo has side effects", nil, callEcho, 1},
		{"Lookup is NO_SIDE_EFFECTS in its proto", nil, callLookup, 2},
		{"Echo declared idempotent", []ClientOption{WithIdempotentMethods(echoMethod)}, callEcho, 2},
		{"service declared idempotent", []ClientOption{WithIdempotentMethods("resilience.echo.v1.EchoService")}, callEcho, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(failFirst(1, codes.Aborted))
				stub, _ := newEcho(t, srv, append(tt.opts, WithRetryPolicy(fastPolicy(3)))...)
				_ = tt.call(stub, t.Context())
				if got := srv.Count(""); got != tt.wantN {
					t.Errorf("server saw %d attempts, want %d", got, tt.wantN)
				}
			})
		})
	}
}

func callEcho(s echov1.EchoServiceClient, ctx context.Context) error {
	_, err := s.Echo(ctx, &echov1.EchoRequest{})
	return err
}

func callLookup(s echov1.EchoServiceClient, ctx context.Context) error {
	_, err := s.Lookup(ctx, &echov1.LookupRequest{})
	return err
}

func TestExplicitRetryableCodesAreHonouredAsWritten(t *testing.T) {
	tests := []struct {
		code  codes.Code
		wantN int
	}{
		{codes.Internal, 3},
		{codes.NotFound, 3},
		{codes.Unavailable, 1},
	}
	for _, tt := range tests {
		t.Run(tt.code.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(failFirst(100, tt.code))
				p := fastPolicy(3)
				p.RetryableStatusCodes = []codes.Code{codes.Internal, codes.NotFound}
				stub, _ := newEcho(t, srv, WithRetryPolicy(p))
				_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
				if got := srv.Count("Echo"); got != tt.wantN || status.Code(err) != tt.code {
					t.Errorf("server saw %d attempts, error %v; want %d attempts and %v", got, err, tt.wantN, tt.code)
				}
			})
		})
	}
}

func TestCallOptionsOverrideThePolicy(t *testing.T) {
	tests := []struct {
		name       string
		opts       []ClientOption
		callOpts   []grpc.CallOption
		wantN      int
		wantReason StopReason
	}{
		{"policy", []ClientOption{WithRetryPolicy(fastPolicy(4))}, nil, 4, StopExhausted},
		{"NoRetry", []ClientOption{WithRetryPolicy(fastPolicy(4))}, []grpc.CallOption{NoRetry()}, 1, StopNoRetry},
		{"MaxAttempts(2)", []ClientOption{WithRetryPolicy(fastPolicy(4))}, []grpc.CallOption{MaxAttempts(2)}, 2, StopExhausted},
		{"MaxAttempts(1)", []ClientOption{WithRetryPolicy(fastPolicy(4))}, []grpc.CallOption{MaxAttempts(1)}, 1, StopNoRetry},
		{"MaxAttempts without a policy", nil, []grpc.CallOption{MaxAttempts(3)}, 3, StopExhausted},
		{"call capped at 5", nil, []grpc.CallOption{MaxAttempts(9)}, 5, StopExhausted},
		{"cap raised", []ClientOption{WithRetryPolicy(fastPolicy(7)), WithMaxAttemptsCap(7)}, nil, 7, StopExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(failFirst(100, codes.Unavailable))
				stub, _ := newEcho(t, srv, tt.opts...)
				_, err := stub.Echo(t.Context(), &echov1.EchoRequest{}, tt.callOpts...)
				if got := srv.Count("Echo"); got != tt.wantN {
					t.Errorf("server saw %d attempts, want %d", got, tt.wantN)
				}
				var re *RetryError
				if !errors.As(err, &re) || re.Reason != tt.wantReason || re.Attempts != tt.wantN {
					t.Errorf("Echo() error = %#v, want %d attempts, reason %v", err, tt.wantN, tt.wantReason)
				}
			})
		})
	}
}

func TestSeededJitterGivesARepeatableSchedule(t *testing.T) {
	schedule := func(t *testing.T, j serviceconfig.Jitter) []time.Duration {
		var delays []time.Duration
		synctest.Test(t, func(t *testing.T) {
			srv := &testserver.Server{}
			srv.SetScript(failFirst(100, codes.Unavailable))
			p := &serviceconfig.RetryPolicy{MaxAttempts: 5, InitialBackoff: 100 * time.Millisecond,
				MaxBackoff: time.Second, BackoffMultiplier: 2, Jitter: j}
			stub, _ := newEcho(t, srv, WithRetryPolicy(p), WithRandSource(rand.NewPCG(1, 2)),
				WithOnRetry(func(_ context.Context, e RetryEvent) { delays = append(delays, e.Delay) }))
			_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{})
		})
		return delays
	}
	for _, j := range []serviceconfig.Jitter{serviceconfig.JitterA6, serviceconfig.JitterFull,
		serviceconfig.JitterEqual, serviceconfig.JitterDecorrelated} {
		t.Run(string(j), func(t *testing.T) {
			got := schedule(t, j)
			r := rand.New(rand.NewPCG(1, 2))
			cfg := backoff.Config{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2, Jitter: jitterOf(j)}
			var prev time.Duration
			for n := range 4 {
				want := cfg.Delay(n, prev, r.Float64())
				prev = want
				if n >= len(got) || got[n] != want {
					t.Fatalf("schedule = %v, want retry %d after %v", got, n+1, want)
				}
			}
		})
	}
}

func TestServiceConfigTimeoutBoundsAllAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome {
			return testserver.Outcome{Err: status.Error(codes.Unavailable, "x"), Delay: 300 * time.Millisecond}
		})
		p := fastPolicy(5)
		p.Jitter = serviceconfig.JitterNone
		stub, _ := newEcho(t, srv, WithMethodConfig(serviceconfig.MethodConfig{
			Name:        []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService"}},
			Timeout:     time.Second,
			RetryPolicy: p,
		}))
		start := time.Now()
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
		// Attempts of 300ms start at 0, 310ms and 630ms; a fourth, at 970ms,
		// could not finish within the 1s timeout, so the call ends at 930ms
		// with the third attempt's error instead of idling.
		if elapsed := time.Since(start); elapsed != 930*time.Millisecond {
			t.Errorf("call took %v, want 930ms", elapsed)
		}
		if got := srv.Count("Echo"); got != 3 {
			t.Errorf("server saw %d attempts, want 3", got)
		}
		var re *RetryError
		if status.Code(err) != codes.Unavailable || !errors.As(err, &re) || re.Reason != StopDeadline {
			t.Errorf("Echo() error = %#v, want the last UNAVAILABLE, stopped by the deadline", err)
		}
	})
}
