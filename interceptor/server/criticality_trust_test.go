//go:build splittodo

package server

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// trustInternal trusts the criticality of calls that carry x-internal
// (standing for what an authentication interceptor verified) and caps the
// others at Critical.
func trustInternal(ctx context.Context, sent Criticality, ok bool) Criticality {
	if len(metadata.ValueFromIncomingContext(ctx, "x-internal")) > 0 {
		return sent
	}
	return CapCriticality(Critical)(ctx, sent, ok)
}

// TestWithCriticalityDecidesWhoIsShedLast: with a limit of 10, nine
// CRITICAL calls in flight fill CRITICAL's share (90%); a tenth call that
// claims CRITICAL_PLUS is shed by default (no caller is trusted with more
// than CRITICAL: review r19, a tenant claiming CRITICAL_PLUS took the whole
// limit and made every honest caller yield) and when WithCriticality caps
// it, and admitted when the function trusts its caller.
func TestWithCriticalityDecidesWhoIsShedLast(t *testing.T) {
	plus := metadata.Pairs(CriticalityKey, "CRITICAL_PLUS")
	internalPlus := metadata.Pairs(CriticalityKey, "CRITICAL_PLUS", "x-internal", "1")
	tests := []struct {
		name string
		opts []ServerOption
		md   metadata.MD
		want codes.Code
		as   Criticality // the criticality counted in LimitStatuses
	}{
		{"default caps the claim at CRITICAL", nil, plus, codes.ResourceExhausted, Critical},
		{"trusting every caller", []ServerOption{WithCriticality(CapCriticality(CriticalPlus))}, plus, codes.OK, CriticalPlus},
		{"capped at CRITICAL", []ServerOption{WithCriticality(CapCriticality(Critical))}, plus, codes.ResourceExhausted, Critical},
		{"trusted caller", []ServerOption{WithCriticality(trustInternal)}, internalPlus, codes.OK, CriticalPlus},
		{"untrusted caller", []ServerOption{WithCriticality(trustInternal)}, plus, codes.ResourceExhausted, Critical},
		{"an invalid result is CRITICAL", []ServerOption{WithCriticality(func(context.Context, Criticality, bool) Criticality { return 9 })},
			plus, codes.ResourceExhausted, Critical},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, err := NewServer(append([]ServerOption{WithConcurrencyLimit(serviceconfig.ConcurrencyLimit{
				InitialLimit: 10, MinLimit: 10, MaxLimit: 10})}, tt.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			icpt := srv.UnaryServerInterceptor()
			info := &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"}
			release := make(chan struct{})
			held := make(chan struct{}, 9)
			done := make(chan struct{}, 9)
			for range 9 {
				go func() {
					_, _ = icpt(t.Context(), nil, info, func(context.Context, any) (any, error) {
						held <- struct{}{}
						<-release
						return nil, nil
					})
					done <- struct{}{}
				}()
			}
			for range 9 {
				<-held
			}
			_, err = icpt(metadata.NewIncomingContext(t.Context(), tt.md), nil, info, func(context.Context, any) (any, error) { return nil, nil })
			close(release)
			for range 9 {
				<-done
			}
			if got := status.Code(err); got != tt.want {
				t.Errorf("the tenth call: %v, want %v", err, tt.want)
			}
			st := srv.LimitStatuses()[0]
			if got := st.Admitted[tt.as] + st.ShedLimit[tt.as]; tt.as == Critical && got != 10 || tt.as != Critical && got != 1 {
				t.Errorf("the tenth call not counted as %v: %+v", tt.as, st)
			}
		})
	}
}

func TestCapCriticality(t *testing.T) {
	tests := []struct {
		highest, sent, want Criticality
		ok                  bool
	}{
		{Critical, CriticalPlus, Critical, true},
		{Critical, Critical, Critical, false},
		{Critical, SheddablePlus, SheddablePlus, true},
		{Critical, Sheddable, Sheddable, true},
		{SheddablePlus, Critical, SheddablePlus, false}, // the default is capped too
		{SheddablePlus, Sheddable, Sheddable, true},
		{CriticalPlus, CriticalPlus, CriticalPlus, true},
		{Sheddable, CriticalPlus, Sheddable, true},
	}
	for _, tt := range tests {
		if got := CapCriticality(tt.highest)(context.Background(), tt.sent, tt.ok); got != tt.want {
			t.Errorf("CapCriticality(%v)(%v, %v) = %v, want %v", tt.highest, tt.sent, tt.ok, got, tt.want)
		}
	}
}

func TestWithCriticalityRefusesNil(t *testing.T) {
	if _, err := NewServer(WithCriticality(nil)); err == nil {
		t.Error("NewServer(WithCriticality(nil)) = nil error, want one")
	}
}

// TestWithCriticalityAllocatesNothing: the function adds no allocation to
// an admitted call.
func TestWithCriticalityAllocatesNothing(t *testing.T) {
	srv, err := NewServer(WithConcurrencyLimit(serviceconfig.ConcurrencyLimit{}), WithCriticality(CapCriticality(Critical)))
	if err != nil {
		t.Fatal(err)
	}
	icpt := srv.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-other", "v"))
	h := func(context.Context, any) (any, error) { return nil, nil }
	if n := testing.AllocsPerRun(1000, func() { _, _ = icpt(ctx, nil, info, h) }); n != 0 {
		t.Errorf("allocs per admitted call = %v, want 0", n)
	}
}
