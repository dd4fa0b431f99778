package interceptor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// hookMeterProvider is a meter provider whose counters and gauge
// observations call back into the code under test (onRecord): the user's
// meter implementation is user code, which may call the Client. Its
// collect calls the registered callbacks, as a reader would.
type hookMeterProvider struct {
	noop.MeterProvider
	onRecord func(what string)
	mu       sync.Mutex
	cbs      []metric.Callback
}

type hookMeter struct {
	noop.Meter
	p *hookMeterProvider
}

type hookCounter struct {
	noop.Int64Counter
	p *hookMeterProvider
}

type hookObserver struct {
	noop.Observer
	p *hookMeterProvider
}

type hookRegistration struct {
	noop.Registration
}

func (p *hookMeterProvider) Meter(string, ...metric.MeterOption) metric.Meter { return hookMeter{p: p} }

func (m hookMeter) Int64Counter(string, ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return hookCounter{p: m.p}, nil
}

func (m hookMeter) RegisterCallback(f metric.Callback, _ ...metric.Observable) (metric.Registration, error) {
	m.p.mu.Lock()
	m.p.cbs = append(m.p.cbs, f)
	m.p.mu.Unlock()
	return hookRegistration{}, nil
}

func (c hookCounter) Add(context.Context, int64, ...metric.AddOption) { c.p.onRecord("counter") }

func (o hookObserver) ObserveInt64(metric.Int64Observable, int64, ...metric.ObserveOption) {
	o.p.onRecord("gauge")
}

func (o hookObserver) ObserveFloat64(metric.Float64Observable, float64, ...metric.ObserveOption) {
	o.p.onRecord("gauge")
}

// hookHandler is a slog.Handler that calls f on every record: a logger is
// the user's code, which may call the Client.
type hookHandler struct{ f func() }

func (h hookHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h hookHandler) Handle(context.Context, slog.Record) error {
	h.f()
	return nil
}
func (h hookHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h hookHandler) WithGroup(string) slog.Handler      { return h }

// collect runs the registered callbacks, with no lock of the provider's
// held (the SDK's would hold its own: a callback that unregisters one
// deadlocks there, whatever the client does).
func (p *hookMeterProvider) collect() {
	p.mu.Lock()
	cbs := append([]metric.Callback(nil), p.cbs...)
	p.mu.Unlock()
	for _, f := range cbs {
		_ = f(context.Background(), hookObserver{p: p})
	}
}

// Finding 4 of issue 32: since ForceOpen, ForceClosed and ResetBreaker
// waited for config updates, the update lock was held while the
// WithOnStateChange hook ran; a hook that called ForceOpen or
// UpdateServiceConfig blocked for ever, and so did every later update,
// the resolver's included. Every hook the client calls (WithOnStateChange,
// WithOnRetry, WithOnStop, WithFallback, WithLogger's logger, and the meter
// provider's counters and gauge observations) now calls every public method
// of the Client,
// and makes unary and streaming calls through it, over real gRPC; the test
// fails, with every goroutine's stack, if that does not end within a
// minute. Each hook runs its calls a few times at most (they cause more
// hooks: a ForceOpen in OnStateChange reports another change).
func TestHooksMayCallEveryMethodOfTheClient(t *testing.T) {
	srv := &testserver.Server{}
	srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
		switch {
		case len(a.Messages) > 0 && a.Messages[0] == "retry" && a.Previous < 0:
			return testserver.Outcome{Err: status.Error(codes.Unavailable, "retry me")}
		case len(a.Messages) > 0 && a.Messages[0] == "stop":
			return testserver.Outcome{Err: status.Error(codes.InvalidArgument, "stop")}
		}
		return testserver.Outcome{}
	})
	cfg := &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
		Name:           []serviceconfig.Name{{Service: echoService}},
		RetryPolicy:    fastPolicy(3),
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 50},
		Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 64},
	}}}
	var (
		c      *Client
		stub   echov1.EchoServiceClient
		ran    sync.Map // hook → *atomic.Int32: times its body ran
		called sync.Map // hook → true once its body ran to the end
	)
	// everything calls every public method of c, and c's interceptors.
	everything := func(hook string) {
		n, _ := ran.LoadOrStore(hook, new(atomic.Int32))
		if n.(*atomic.Int32).Add(1) > 3 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Status(echoMethod)
		_ = c.Statuses()
		_, _ = c.HedgingDelay(echoMethod)
		_ = c.ForceOpen(lookupMethod)
		_ = c.ForceClosed(lookupMethod)
		_ = c.ResetBreaker(lookupMethod)
		if err := c.UpdateServiceConfig(cfg); err != nil {
			t.Errorf("%s: UpdateServiceConfig = %v", hook, err)
		}
		_ = c.DialOptions()
		_ = c.UnaryClientInterceptor()
		_ = c.StreamClientInterceptor()
		_ = c.WrapResolver(nil)
		if _, err := stub.Lookup(ctx, &echov1.LookupRequest{}); err != nil {
			t.Errorf("%s: Lookup = %v", hook, err)
		}
		if st, err := stub.ServerStream(ctx, &echov1.ServerStreamRequest{Count: 1}); err == nil {
			for err == nil {
				_, err = st.Recv()
			}
			if err != io.EOF {
				t.Errorf("%s: ServerStream = %v", hook, err)
			}
		}
		if hook == "OnStop" { // the last hook to run: Close, and use the client after
			if err := c.Close(); err != nil {
				t.Errorf("%s: Close = %v", hook, err)
			}
			_ = c.Statuses()
		}
		called.Store(hook, true)
	}
	meters := &hookMeterProvider{onRecord: func(what string) { everything("meter " + what) }}
	logger := slog.New(hookHandler{f: func() { everything("logger") }})
	var err error
	c, err = NewClient(WithServiceConfig(cfg), WithMeterProvider(meters), WithLogger(logger),
		WithOnStateChange(func(string, BreakerState, BreakerState) { everything("OnStateChange") }),
		WithOnRetry(func(context.Context, RetryEvent) { everything("OnRetry") }),
		WithOnStop(func(context.Context, StopEvent) { everything("OnStop") }),
		WithFallback(func(context.Context, string, any, any, error) error {
			everything("Fallback")
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	checkNothingHeld(t, c)
	stub = echov1.NewEchoServiceClient(testserver.Start(t, srv, c.DialOptions()...))

	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx := context.Background()
		meters.collect()             // gauge observations
		_ = c.Status("no/such name") // a warning to the logger
		if err := c.ForceOpen(echoMethod); err != nil {
			t.Errorf("ForceOpen = %v", err)
		}
		if _, err := stub.Echo(ctx, &echov1.EchoRequest{}); err != nil { // the fallback answers
			t.Errorf("Echo, forced open, with a fallback = %v", err)
		}
		if err := c.ResetBreaker(echoMethod); err != nil {
			t.Errorf("ResetBreaker = %v", err)
		}
		if _, err := stub.Echo(ctx, &echov1.EchoRequest{Message: "retry"}); err != nil {
			t.Errorf("Echo retried once = %v", err)
		}
		if _, err := stub.Echo(ctx, &echov1.EchoRequest{Message: "stop"}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("Echo, INVALID_ARGUMENT = %v", err)
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
		t.Fatal("deadlock: the calls into hooks that call the Client did not end within a minute (stacks above)")
	}
	for _, hook := range []string{"meter gauge", "meter counter", "logger", "OnStateChange", "Fallback", "OnRetry", "OnStop"} {
		if _, ok := called.Load(hook); !ok {
			t.Errorf("hook %s never ran its calls to the end", hook)
		}
	}
	if t.Failed() {
		var ran []string
		called.Range(func(k, _ any) bool { ran = append(ran, fmt.Sprint(k)); return true })
		t.Logf("hooks that ran to the end: %v", ran)
	}
}
