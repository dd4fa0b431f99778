package endpoint_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/stats/opentelemetry"

	"github.com/grpc-resilience/resilience/interceptor/endpoint"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
)

// recordingHandler keeps every record it handles.
type recordingHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

// events returns the records for target, each as its message and attrs.
func (h *recordingHandler) events(target string) []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, r := range h.records {
		m := map[string]string{"msg": r.Message, "level": r.Level.String()}
		r.Attrs(func(a slog.Attr) bool {
			m[a.Key] = a.Value.String()
			return true
		})
		if m["target"] == target {
			out = append(out, m)
		}
	}
	return out
}

// TestEjectionAndReturnAreLoggedOnce pins the policy's log: one WARN
// record per ejection with target, endpoint, cause, ejections and
// duration, and one INFO record per return with its reason and how long
// the ejection lasted, through the logger SetLogger set, whether the
// return is noticed by a snapshot or by the next call.
func TestEjectionAndReturnAreLoggedOnce(t *testing.T) {
	h := &recordingHandler{}
	endpoint.SetLogger(slog.New(h))
	defer endpoint.SetLogger(nil)
	synctest.Test(t, func(t *testing.T) {
		cl := resiliencetest.StartCluster(t, 3, nil, resiliencetest.WithServiceConfig(
			`{"loadBalancingConfig": [{"resilience_endpoint": {"consecutiveFailures": 2, "baseEjectionTime": "10s"}}]}`))
		cl.Backends[0].OnCall(func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Code: codes.Unavailable} })
		echo := cl.EchoClient()
		for range 12 {
			_, _ = echo.Echo(t.Context(), &echov1.EchoRequest{Message: "x"})
		}
		ev := h.events(cl.Conn.Target())
		if len(ev) != 1 {
			t.Fatalf("records = %v, want one ejection", ev)
		}
		want := map[string]string{"msg": "resilience_endpoint: endpoint ejected", "level": "WARN", "target": cl.Conn.Target(),
			"endpoint": "backend-0", "cause": "consecutive_failures", "ejections": "1", "duration": "10s"}
		for k, v := range want {
			if ev[0][k] != v {
				t.Errorf("ejection record %s = %q, want %q (record %v)", k, ev[0][k], v, ev[0])
			}
		}
		time.Sleep(11 * time.Second)
		cl.Backends[0].OnCall(nil)     // healthy again: the next call's outcome, wherever it lands, ejects nothing
		endpoint.Snapshots(time.Now()) // notices the expiry
		endpoint.Snapshots(time.Now())
		_, _ = echo.Echo(t.Context(), &echov1.EchoRequest{Message: "x"}, grpc.WaitForReady(true))
		ev = h.events(cl.Conn.Target())
		if len(ev) != 2 {
			t.Fatalf("records = %v, want the ejection and one return", ev)
		}
		want = map[string]string{"msg": "resilience_endpoint: endpoint returned", "level": "INFO", "endpoint": "backend-0",
			"reason": "expired", "ejected_for": "10s"}
		for k, v := range want {
			if ev[1][k] != v {
				t.Errorf("return record %s = %q, want %q (record %v)", k, ev[1][k], v, ev[1])
			}
		}
	})
}

// TestMetricsCountDetectionsAndReturnsWithBoundedEndpointLabels pins the
// round-2 metrics through grpc's OpenTelemetry plugin: ejections detected
// (enforced or refused by maxEjectionPercent) and enforced, by cause, the
// overflow, and returns by reason; the endpoint label only when enabled as
// an optional label.
func TestMetricsCountDetectionsAndReturnsWithBoundedEndpointLabels(t *testing.T) {
	const (
		detected   = "grpc.lb.resilience_endpoint.ejections_detected_total"
		enforced   = "grpc.lb.resilience_endpoint.ejections_enforced_total"
		overflow   = "grpc.lb.resilience_endpoint.ejections_overflow"
		unejected  = "grpc.lb.resilience_endpoint.unejections_total"
		labelEP    = "grpc.lb.resilience_endpoint.endpoint"
		labelCause = "grpc.lb.resilience_endpoint.cause"
	)
	for _, withLabel := range []bool{false, true} {
		t.Run(map[bool]string{false: "default labels", true: "endpoint label on"}[withLabel], func(t *testing.T) {
			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			defer mp.Shutdown(context.Background())
			mo := opentelemetry.MetricsOptions{MeterProvider: mp,
				Metrics: opentelemetry.DefaultMetrics().Add(detected, enforced, overflow, unejected)}
			if withLabel {
				mo.OptionalLabels = []string{labelEP}
			}
			cl := resiliencetest.StartCluster(t, 3, []grpc.DialOption{opentelemetry.DialOption(opentelemetry.Options{MetricsOptions: mo})},
				resiliencetest.WithServiceConfig(`{"loadBalancingConfig": [{"resilience_endpoint": {"consecutiveFailures": 1, "baseEjectionTime": "600s", "maxEjectionPercent": 100}}]}`))
			for _, b := range cl.Backends[:2] {
				b.OnCall(func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Code: codes.Unavailable} })
			}
			echo := cl.EchoClient()
			for range 20 {
				_, _ = echo.Echo(t.Context(), &echov1.EchoRequest{Message: "x"})
			}
			// Backend 1 answers again: with 0 and 1 ejected, only 2 is in
			// rotation; eject it too, so that a last resort reaches 1.
			cl.Backends[1].OnCall(nil)
			cl.Backends[2].OnCall(func(resiliencetest.Attempt) resiliencetest.Step { return resiliencetest.Step{Code: codes.Unavailable} })
			for range 20 {
				_, _ = echo.Echo(t.Context(), &echov1.EchoRequest{Message: "x"})
			}
			m := metricsByName(t, reader)
			sum := func(name string) (n int64, endpoints map[string]bool, causes map[string]bool) {
				endpoints, causes = map[string]bool{}, map[string]bool{}
				for _, dp := range m[name] {
					if v, _ := dp.Attributes.Value("grpc.target"); v.AsString() != cl.Conn.Target() {
						continue
					}
					n += dp.Value
					if v, ok := dp.Attributes.Value(labelEP); ok {
						endpoints[v.AsString()] = true
					}
					if v, ok := dp.Attributes.Value(labelCause); ok {
						causes[v.AsString()] = true
					}
				}
				return n, endpoints, causes
			}
			ne, eps, causes := sum(enforced)
			nd, _, _ := sum(detected)
			nu, _, _ := sum(unejected)
			if ne < 3 || nd < ne || nu < 1 || !causes["consecutive_failures"] {
				t.Fatalf("enforced %d (causes %v), detected %d, unejections %d: want ≥ 3 ejections, detections ≥ ejections, a return (answered)", ne, causes, nd, nu)
			}
			if withLabel != (len(eps) > 0) {
				t.Fatalf("endpoint label values %v with the optional label enabled = %v", eps, withLabel)
			}
			if withLabel && !eps["backend-0"] {
				t.Fatalf("endpoint labels = %v, want backend-0 among them", eps)
			}
		})
	}
}

// TestSnapshotStringPrintsTimesRelativeToTheSnapshot pins String's doc:
// times relative to the snapshot's At, not wall-clock instants. Before:
// the doc said relative and the code printed RFC 3339 instants.
func TestSnapshotStringPrintsTimesRelativeToTheSnapshot(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	s := endpoint.Snapshot{Target: "dns:///db", ChildPolicy: "round_robin", At: at, Ejections: 1,
		Endpoints: []endpoint.EndpointState{
			{Addresses: []string{"10.0.0.1:443"}, Connectivity: connectivity.Ready, EjectedUntil: at.Add(25 * time.Second),
				EjectedSince: at.Add(-5 * time.Second), Cause: "local_origin", Ejections: 1},
			{Addresses: []string{"10.0.0.2:443"}, Connectivity: connectivity.Ready, Probation: true, Latency: 1500 * time.Microsecond},
		}}
	got := s.String()
	for _, want := range []string{"ejected for 25s more, since 5s, local_origin", "in rotation, on probation", "latency 2ms"} {
		if !strings.Contains(got, want) {
			t.Errorf("String() lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "2030") {
		t.Errorf("String() prints an instant:\n%s", got)
	}
}
