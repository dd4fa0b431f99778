package interceptor

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// closeTestConfig guards Echo with a breaker and a bulkhead, whose state
// the gauges report (the retry budget is on by default).
func closeTestConfig() ClientOption {
	return WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
		RetryPolicy:    fastPolicy(3),
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5, OpenDuration: time.Second},
		Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 4},
	})
}

// TestClientCloseReleasesItFromTheMeterProvider pins the Client's lifetime
// on a meter provider (REVIEW.md class 9): a Client had no Close, and its
// gauges' callbacks stayed registered for ever, so a process that builds a
// Client per tenant or per configuration reload kept every Client it ever
// built reachable from the provider, read on every collection, reporting
// under the same labels as the Client that replaced it. Over real gRPC, 200
// Clients built, used and closed against one provider: none is reachable
// any more, the provider reports no gauge, and the one live Client alone
// reports its breaker, bulkhead and budget gauges.
func TestClientCloseReleasesItFromTheMeterProvider(t *testing.T) {
	reader, mp := newMeterReader()
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	srv := &testserver.Server{}
	dial, stop := testserver.Listen(func(gs *grpc.Server) { echov1.RegisterEchoServiceServer(gs, srv) })
	t.Cleanup(stop)

	// use builds a Client, makes one call through it, closes the
	// connection and returns the Client.
	use := func() *Client {
		t.Helper()
		c, err := NewClient(WithMeterProvider(mp), closeTestConfig())
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpc.NewClient("passthrough:///bufnet", append(dial, c.DialOptions()...)...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := echov1.NewEchoServiceClient(cc).Echo(t.Context(), &echov1.EchoRequest{Message: "m"}); err != nil {
			t.Fatalf("Echo() = %v", err)
		}
		if err := cc.Close(); err != nil {
			t.Fatal(err)
		}
		if held := heldGuards(c); held != "" {
			t.Fatalf("after the call, guards still held: %s", held)
		}
		return c
	}

	const clients = 200
	refs := make([]weak.Pointer[Client], 0, clients)
	for range clients {
		c := use()
		refs = append(refs, weak.Make(c))
		if err := c.Close(); err != nil {
			t.Fatalf("Close() = %v, want nil", err)
		}
	}
	if got := collect(t, reader); len(gaugesIn(got)) != 0 {
		t.Errorf("after closing every Client, the provider reports gauges %v, want none", gaugesIn(got))
	}
	// A closed connection's goroutines and timers end shortly after Close
	// returns, and hold the Client's interceptors until then (under the
	// race detector on a loaded machine, a few took over 5s): collect until
	// none is reachable, or for 30s.
	alive := clients
	for deadline := time.Now().Add(30 * time.Second); alive > 0 && time.Now().Before(deadline); {
		runtime.GC()
		alive = 0
		for _, r := range refs {
			if r.Value() != nil {
				alive++
			}
		}
		if alive > 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if alive != 0 {
		t.Errorf("%d of %d closed Clients are still reachable, want none: the provider keeps what it reads", alive, clients)
	}

	live := use()
	defer func() { _ = live.Close() }()
	if err := live.ForceOpen(echoMethod); err != nil {
		t.Fatal(err)
	}
	got := collect(t, reader)
	got.Expect(t, metricBreakerState, "{state}", map[string]float64{echoMethodAttr: float64(BreakerForcedOpen)})
	got.Expect(t, metricInFlight, "{attempt}", map[string]float64{echoMethodAttr: 0})
	if _, pts := got.Points(t, metricBudget); len(pts) != 1 {
		t.Errorf("%s has %d points, want the live Client's one", metricBudget, len(pts))
	}
}

// gaugesIn returns the names of the client's gauges in got.
func gaugesIn(got collected) []string {
	var names []string
	for _, n := range []string{metricBudget, metricBreakerState, metricInFlight, metricQueued, metricRejectProbability} {
		if _, ok := got[n]; ok {
			names = append(names, n)
		}
	}
	return names
}

// TestClosedClientStillServesItsCalls pins what Close promises of the calls
// that come after it: they run as before (a retry, the breaker controls,
// Statuses, UpdateServiceConfig), Close may be called again and
// concurrently, and every call of it returns nil.
func TestClosedClientStillServesItsCalls(t *testing.T) {
	_, mp := newMeterReader()
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	srv := &testserver.Server{}
	srv.SetScript(failFirst(1, codes.Unavailable))
	stub, c := newEcho(t, srv, WithMeterProvider(mp), WithRetryBudget(nil), closeTestConfig())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := c.Close(); err != nil {
				t.Errorf("Close() = %v, want nil", err)
			}
		})
	}
	wg.Wait()
	if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{Message: "m"}); err != nil || srv.Count("Echo") != 2 {
		t.Errorf("Echo() after Close = %v over %d attempts, want success on the retry", err, srv.Count("Echo"))
	}
	if err := c.UpdateServiceConfig(&serviceconfig.Config{}); err != nil {
		t.Errorf("UpdateServiceConfig after Close = %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close() again = %v, want nil", err)
	}
}

// countingProvider is a meter provider that counts the callbacks
// registered on it and not yet unregistered.
type countingProvider struct {
	metric.MeterProvider
	live atomic.Int64
}

type countingMeter struct {
	metric.Meter
	p *countingProvider
}

type countingRegistration struct {
	metric.Registration
	p    *countingProvider
	once sync.Once
}

func (p *countingProvider) Meter(name string, opts ...metric.MeterOption) metric.Meter {
	return countingMeter{Meter: p.MeterProvider.Meter(name, opts...), p: p}
}

func (m countingMeter) RegisterCallback(f metric.Callback, instruments ...metric.Observable) (metric.Registration, error) {
	r, err := m.Meter.RegisterCallback(f, instruments...)
	if err != nil {
		return nil, err
	}
	m.p.live.Add(1)
	return &countingRegistration{Registration: r, p: m.p}, nil
}

func (r *countingRegistration) Unregister() error {
	r.once.Do(func() { r.p.live.Add(-1) })
	return r.Registration.Unregister()
}

// A NewClient that returned an error left its gauges' callback registered
// on the meter provider: 100 refused constructions, 100 live callbacks,
// each keeping its Client reachable and read on every collection. A failed
// NewClient now holds nothing (0), whatever refused it: a MaxAttempts above
// the client's cap, a config that does not validate. A Client built and
// closed holds nothing either.
func TestFailedNewClientHoldsNothing(t *testing.T) {
	_, sdk := newMeterReader()
	t.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	p := &countingProvider{MeterProvider: sdk}
	refused := []ClientOption{
		WithMethodConfig(serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: echoService}},
			RetryPolicy: &serviceconfig.RetryPolicy{MaxAttempts: 100}}),
		WithMethodConfig(serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: echoService}},
			CircuitBreaker: &serviceconfig.CircuitBreaker{FailureRateThreshold: 2}}),
	}
	for i := range 100 {
		if c, err := NewClient(WithMeterProvider(p), refused[i%len(refused)]); err == nil {
			_ = c.Close()
			t.Fatalf("NewClient with %d-th refused option = nil error", i%len(refused))
		}
	}
	if n := p.live.Load(); n != 0 {
		t.Errorf("after 100 refused NewClient, %d gauge callbacks registered, want 0", n)
	}
	c, err := NewClient(WithMeterProvider(p), closeTestConfig())
	if err != nil {
		t.Fatal(err)
	}
	if n := p.live.Load(); n != 1 {
		t.Errorf("a Client built: %d callbacks registered, want 1", n)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := p.live.Load(); n != 0 {
		t.Errorf("a Client closed: %d callbacks registered, want 0", n)
	}
}
