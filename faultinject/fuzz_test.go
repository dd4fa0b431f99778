package faultinject_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/faultinject"
)

// FuzzParse: Parse never panics, and what it accepts is valid.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"seed": 7, "faults": [{"methods": ["a.B/C"], "delay": {"fixedDelay": "0.05s", "percentage": {"numerator": 20}},
		"abort": {"grpcStatus": "UNAVAILABLE", "pushback": "-1s", "retryDelay": "1s"},
		"streamAbort": {"afterMessages": 3, "grpcStatus": 10}, "outage": {"every": "1m", "duration": "1s", "grpcStatus": 14}}]}`))
	f.Add([]byte(`{"faults": [{"abort": {"grpcStatus": "x", "percentage": {"numerator": 1, "denominator": "MILLION"}}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := faultinject.Parse(data)
		if err != nil {
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that Validate refuses: %v", err)
		}
		if _, err := faultinject.New(cfg); err != nil {
			t.Fatalf("New refused a parsed config: %v", err)
		}
	})
}

// FuzzMetadataFaults: per-call fault metadata never panics the interceptor.
// The call's context has ended, so an asked-for delay returns at once.
func FuzzMetadataFaults(f *testing.F) {
	f.Add("UNAVAILABLE", "50", "100", "-1", "3", "internal")
	f.Add("99", "x", "1000", "", "0", "")
	inj, err := faultinject.New(faultinject.Config{}, faultinject.WithMetadataFaults())
	if err != nil {
		f.Fatal(err)
	}
	unary := inj.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/a.B/C"}
	handler := func(context.Context, any) (any, error) { return nil, nil }
	f.Fuzz(func(t *testing.T, abort, pct, delay, pushback, after, code string) {
		md := metadata.MD{}
		for k, v := range map[string]string{
			faultinject.MetadataAbort: abort, faultinject.MetadataAbortPercentage: pct,
			faultinject.MetadataDelayMs: delay, faultinject.MetadataPushbackMs: pushback,
			faultinject.MetadataStreamAbortAfter: after, faultinject.MetadataStreamAbortCode: code,
		} {
			if v != "" {
				md.Set(k, v)
			}
		}
		ctx, cancel := context.WithCancel(metadata.NewIncomingContext(context.Background(), md))
		cancel()
		_, _ = unary(ctx, nil, info, handler)
	})
}

// A call that no fault matches allocates nothing in the interceptor.
func TestNoFaultAllocatesNothing(t *testing.T) {
	inj, err := faultinject.New(faultinject.Config{Faults: []faultinject.Fault{{
		Methods: []string{"other.Service"},
		Abort:   &faultinject.Abort{Code: 14},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	unary := inj.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/a.B/C"}
	handler := func(context.Context, any) (any, error) { return nil, nil }
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("k", "v"))
	if allocs := testing.AllocsPerRun(100, func() { _, _ = unary(ctx, nil, info, handler) }); allocs != 0 {
		t.Errorf("a call without a fault allocates %v times, want 0", allocs)
	}
}
