package interceptor

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// stopLog records the OnStop events of a client.
type stopLog struct {
	mu     sync.Mutex
	events []StopEvent
}

func (l *stopLog) add(_ context.Context, e StopEvent) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *stopLog) take() []StopEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev := l.events
	l.events = nil
	return ev
}

// TestRejectEarlyMatchesTheFullPath: a call its guards refuse at once ends
// in Client.rejectEarly, before any per-call state; a call option of ours
// that changes nothing (MaxAttempts equal to the policy's) sends the same
// call down the full path. Both must end alike: the same error (the same
// prebuilt value), the same OnStop events, and the same refusals that come
// before the guards (an expired deadline, an invalid idempotency key).
func TestRejectEarlyMatchesTheFullPath(t *testing.T) {
	for _, tc := range []struct {
		name     string
		retry    bool
		bulkhead bool
		want     error
		code     codes.Code
	}{
		{"breaker open, no retry policy", false, false, ErrCircuitOpen, codes.Unavailable},
		{"breaker open, retry policy", true, false, ErrCircuitOpen, codes.Unavailable},
		{"bulkhead full, no retry policy", false, true, ErrBulkheadFull, codes.ResourceExhausted},
		{"bulkhead full, retry policy", true, true, ErrBulkheadFull, codes.ResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mc := serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: echoService}}}
			same := MaxAttempts(1) // the full path, as without it
			if tc.retry {
				mc.RetryPolicy = fastPolicy(2)
				same = MaxAttempts(2)
			}
			if tc.bulkhead {
				mc.Bulkhead = &serviceconfig.Bulkhead{MaxConcurrent: 1}
			} else {
				mc.CircuitBreaker = &serviceconfig.CircuitBreaker{ConsecutiveFailures: 1, OpenDuration: time.Hour}
			}
			var log stopLog
			c := newTestClient(t, WithMethodConfig(mc), WithRetryBudget(nil), WithOnStop(log.add))
			ic := c.UnaryClientInterceptor()
			req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
			if tc.bulkhead {
				entered, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
				go func() {
					defer close(done)
					_ = ic(context.Background(), echoMethod, req, reply, nil,
						func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
							close(entered)
							<-release
							return nil
						})
				}()
				<-entered
				defer func() { close(release); <-done }()
			} else {
				_ = ic(context.Background(), echoMethod, req, reply, nil, unavailableInvoker)
				if st := c.Status(echoMethod); st.Breaker.State != BreakerOpen {
					t.Fatalf("breaker %v, want open", st.Breaker.State)
				}
			}
			log.take()
			if mp := policyOf(c, echoMethod); !mp.early {
				t.Fatal("methodPolicy.early = false, want true")
			}
			call := func(ctx context.Context, opts ...grpc.CallOption) (error, []StopEvent) {
				err := ic(ctx, echoMethod, req, reply, nil, func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
					t.Error("a refused call reached the invoker")
					return nil
				}, opts...)
				return err, log.take()
			}
			ctx := context.Background()
			early, earlyEv := call(ctx)
			full, fullEv := call(ctx, same)
			if early != full || !errors.Is(early, tc.want) || status.Code(early) != tc.code {
				t.Errorf("refused call: early path %v, full path %v; want the same error, %v, %v", early, full, tc.want, tc.code)
			}
			if len(earlyEv) != len(fullEv) || len(earlyEv) > 0 && earlyEv[0] != fullEv[0] {
				t.Errorf("OnStop events: early path %+v, full path %+v, want the same", earlyEv, fullEv)
			}
			if tc.retry && len(earlyEv) != 1 {
				t.Errorf("OnStop events under a retry policy: %d, want 1", len(earlyEv))
			}

			// Refusals that come before the guards.
			expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
			defer cancel()
			early, _ = call(expired)
			full, _ = call(expired, same)
			if status.Code(early) != codes.DeadlineExceeded || status.Code(full) != codes.DeadlineExceeded {
				t.Errorf("deadline passed: early path %v, full path %v, want DEADLINE_EXCEEDED", early, full)
			}
			badKey := ContextWithIdempotencyKey(ctx, "")
			early, _ = call(badKey)
			full, _ = call(badKey, same)
			if status.Code(early) != codes.InvalidArgument || status.Code(full) != codes.InvalidArgument {
				t.Errorf("invalid idempotency key: early path %v, full path %v, want INVALID_ARGUMENT", early, full)
			}
		})
	}
}
