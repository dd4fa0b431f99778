package server

// Copies of helpers that files of the other half of the split define
// (deadline_test.go: serveEcho, serveEchoWith; bench_test.go: benchHandler,
// benchHandlerVar) or need (collected.points and expect, from the client's
// metrics_test.go), kept here so that the limit tests compile while those
// files are tagged. Delete this file when those files compile: nothing else
// is in it.

import (
	"context"
	"net"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// serveEcho serves impl behind the interceptors of srv over bufconn until
// the test ends, and returns a connection to it dialed with opts.
func serveEcho(t *testing.T, impl echov1.EchoServiceServer, srv *Server, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	return serveEchoWith(t, impl, srv, nil, opts...)
}

// serveEchoWith is serveEcho with spy called on every unary call's context
// before srv's interceptor.
func serveEchoWith(t *testing.T, impl echov1.EchoServiceServer, srv *Server, spy func(context.Context), opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	var unary []grpc.UnaryServerInterceptor
	if spy != nil {
		unary = append(unary, func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			spy(ctx)
			return h(ctx, req)
		})
	}
	sopts := []grpc.ServerOption{}
	if srv != nil {
		unary = append(unary, srv.UnaryServerInterceptor())
		sopts = append(sopts, grpc.ChainStreamInterceptor(srv.StreamServerInterceptor()))
	}
	sopts = append(sopts, grpc.ChainUnaryInterceptor(unary...))
	gs := grpc.NewServer(sopts...)
	echov1.RegisterEchoServiceServer(gs, impl)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///bufnet", append([]grpc.DialOption{
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close(); gs.Stop(); <-done })
	return cc
}

func benchHandler(_ context.Context, req any) (any, error) {
	return &echov1.EchoResponse{Message: req.(*echov1.EchoRequest).Message}, nil
}

// benchHandlerVar is called as the interceptor calls a handler: through a
// func value, not inlined, so that its reply escapes to the heap as it does
// behind the interceptor.
var benchHandlerVar grpc.UnaryHandler = benchHandler

// points returns the values of a sum or gauge by attribute set, and its
// unit; histograms give their count under "count:" and sum under "sum:"
// keys.
func (c collected) points(t *testing.T, name string) (unit string, pts map[string]float64) {
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
			pts[attrKey(p.Attributes)] += float64(p.Value)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			pts[attrKey(p.Attributes)] = float64(p.Value)
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			pts[attrKey(p.Attributes)] = p.Value
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			pts["count:"+attrKey(p.Attributes)] = float64(p.Count)
			pts["sum:"+attrKey(p.Attributes)] = float64(p.Sum)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			pts["count:"+attrKey(p.Attributes)] = float64(p.Count)
			pts["sum:"+attrKey(p.Attributes)] = p.Sum
		}
	default:
		t.Errorf("metric %s: unexpected data %T", name, m.Data)
	}
	return m.Unit, pts
}

// expect checks a metric's unit and points against want, exactly: no point
// missing, none more.
func (c collected) expect(t *testing.T, name, unit string, want map[string]float64) {
	t.Helper()
	gotUnit, got := c.points(t, name)
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
