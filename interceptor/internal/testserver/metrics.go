package testserver

import (
	"context"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Reading what an OpenTelemetry meter provider recorded, for the tests of
// the client and of the server.

// NewMeterReader returns a meter provider and the manual reader it feeds.
func NewMeterReader() (*sdkmetric.ManualReader, *sdkmetric.MeterProvider) {
	reader := sdkmetric.NewManualReader()
	return reader, sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
}

// Collected is what a ManualReader Collected, by instrument name.
type Collected map[string]metricdata.Metrics

func Collect(t *testing.T, r *sdkmetric.ManualReader) Collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := Collected{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// AttrKey writes a set as "k=v,k=v" in the set's (sorted) order.
func AttrKey(s attribute.Set) string {
	var b strings.Builder
	for i, kv := range s.ToSlice() {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(string(kv.Key) + "=" + kv.Value.String())
	}
	return b.String()
}

// Points returns the values of a sum or gauge by attribute set, and its
// unit; histograms give their count under "count:" and sum under "sum:"
// keys.
func (c Collected) Points(t *testing.T, name string) (unit string, pts map[string]float64) {
	t.Helper()
	m, ok := c[name]
	if !ok {
		t.Errorf("metric %s not recorded", name)
		return "", nil
	}
	pts = map[string]float64{}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			pts[AttrKey(p.Attributes)] += float64(p.Value)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			pts[AttrKey(p.Attributes)] = float64(p.Value)
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			pts[AttrKey(p.Attributes)] = p.Value
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			pts["count:"+AttrKey(p.Attributes)] = float64(p.Count)
			pts["sum:"+AttrKey(p.Attributes)] = float64(p.Sum)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			pts["count:"+AttrKey(p.Attributes)] = float64(p.Count)
			pts["sum:"+AttrKey(p.Attributes)] = p.Sum
		}
	default:
		t.Errorf("metric %s: unexpected data %T", name, m.Data)
	}
	return m.Unit, pts
}

// Expect checks a metric's unit and Points against want, exactly: no point
// missing, none more.
func (c Collected) Expect(t *testing.T, name, unit string, want map[string]float64) {
	t.Helper()
	gotUnit, got := c.Points(t, name)
	if got == nil {
		return
	}
	if gotUnit != unit {
		t.Errorf("%s: unit %q, want %q", name, gotUnit, unit)
	}
	keys := make([]string, 0, len(got)+len(want))
	for k := range got {
		keys = append(keys, k)
	}
	for k := range want {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range slices.Compact(keys) {
		g, gok := got[k]
		w, wok := want[k]
		if gok != wok || g < w-1e-9 || g > w+1e-9 {
			t.Errorf("%s{%s} = %v (recorded %v), want %v (expected %v)", name, k, g, gok, w, wok)
		}
	}
}

// WantScope fails t unless r collected at least one metric, and every one
// in the instrumentation scope named scope.
func WantScope(t *testing.T, r *sdkmetric.ManualReader, scope string) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	names := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			names++
			if sm.Scope.Name != scope {
				t.Errorf("%s recorded in scope %q, want %q", m.Name, sm.Scope.Name, scope)
			}
		}
	}
	if names == 0 {
		t.Fatal("no metric recorded")
	}
}
