package server

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// trustInternal trusts the criticality of calls that carry x-internal
// (standing for what an authentication interceptor verified) and caps the
// others at wire.Critical.
func trustInternal(ctx context.Context, sent wire.Criticality, ok bool) wire.Criticality {
	if len(metadata.ValueFromIncomingContext(ctx, "x-internal")) > 0 {
		return sent
	}
	return CapCriticality(wire.Critical)(ctx, sent, ok)
}

// TestWithCriticalityDecidesWhoIsShedLast: with a limit of 10, nine
// CRITICAL calls in flight fill CRITICAL's share (90%); a tenth call that
// claims CRITICAL_PLUS is shed by default (no caller is trusted with more
// than CRITICAL: review r19, a tenant claiming CRITICAL_PLUS took the whole
// limit and made every honest caller yield) and when Limits.Criticality
// caps it, and admitted when the function trusts its caller.
func TestWithCriticalityDecidesWhoIsShedLast(t *testing.T) {
	plus := metadata.Pairs(wire.CriticalityKey, "CRITICAL_PLUS")
	internalPlus := metadata.Pairs(wire.CriticalityKey, "CRITICAL_PLUS", "x-internal", "1")
	tests := []struct {
		name string
		crit CriticalityFunc
		md   metadata.MD
		want codes.Code
		as   wire.Criticality // the criticality counted in LimitStatuses
	}{
		{"default caps the claim at CRITICAL", nil, plus, codes.ResourceExhausted, wire.Critical},
		{"trusting every caller", CapCriticality(wire.CriticalPlus), plus, codes.OK, wire.CriticalPlus},
		{"capped at CRITICAL", CapCriticality(wire.Critical), plus, codes.ResourceExhausted, wire.Critical},
		{"trusted caller", trustInternal, internalPlus, codes.OK, wire.CriticalPlus},
		{"untrusted caller", trustInternal, plus, codes.ResourceExhausted, wire.Critical},
		{"an invalid result is CRITICAL", func(context.Context, wire.Criticality, bool) wire.Criticality { return 9 },
			plus, codes.ResourceExhausted, wire.Critical},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := limitsOf(serviceconfig.ConcurrencyLimit{InitialLimit: 10, MinLimit: 10, MaxLimit: 10})
			l.Criticality = tt.crit
			srv := newLimitServer(t, l)
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
			_, err := icpt(metadata.NewIncomingContext(t.Context(), tt.md), nil, info, func(context.Context, any) (any, error) { return nil, nil })
			close(release)
			for range 9 {
				<-done
			}
			if got := status.Code(err); got != tt.want {
				t.Errorf("the tenth call: %v, want %v", err, tt.want)
			}
			st := srv.LimitStatuses()[0]
			if got := st.Admitted[tt.as] + st.ShedLimit[tt.as]; tt.as == wire.Critical && got != 10 || tt.as != wire.Critical && got != 1 {
				t.Errorf("the tenth call not counted as %v: %+v", tt.as, st)
			}
		})
	}
}

func TestCapCriticality(t *testing.T) {
	tests := []struct {
		highest, sent, want wire.Criticality
		ok                  bool
	}{
		{wire.Critical, wire.CriticalPlus, wire.Critical, true},
		{wire.Critical, wire.Critical, wire.Critical, false},
		{wire.Critical, wire.SheddablePlus, wire.SheddablePlus, true},
		{wire.Critical, wire.Sheddable, wire.Sheddable, true},
		{wire.SheddablePlus, wire.Critical, wire.SheddablePlus, false}, // the default is capped too
		{wire.SheddablePlus, wire.Sheddable, wire.Sheddable, true},
		{wire.CriticalPlus, wire.CriticalPlus, wire.CriticalPlus, true},
		{wire.Sheddable, wire.CriticalPlus, wire.Sheddable, true},
	}
	for _, tt := range tests {
		if got := CapCriticality(tt.highest)(context.Background(), tt.sent, tt.ok); got != tt.want {
			t.Errorf("CapCriticality(%v)(%v, %v) = %v, want %v", tt.highest, tt.sent, tt.ok, got, tt.want)
		}
	}
}

// TestLimitsNilCriticalityIsCapped: WithCriticality(nil) was refused; a
// nil Limits.Criticality is the documented default instead, valid, and
// gives a call what it sent but at most CRITICAL.
func TestLimitsNilCriticalityIsCapped(t *testing.T) {
	l := limitsOf(serviceconfig.ConcurrencyLimit{})
	if err := l.Validate(); err != nil {
		t.Fatalf("Limits{Criticality: nil}.Validate() = %v, want nil", err)
	}
	srv := newLimitServer(t, l)
	icpt := srv.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"}
	h := func(context.Context, any) (any, error) { return nil, nil }
	for _, sent := range []string{"CRITICAL_PLUS", "SHEDDABLE"} {
		_, _ = icpt(metadata.NewIncomingContext(context.Background(), metadata.Pairs(wire.CriticalityKey, sent)), nil, info, h)
	}
	st := srv.LimitStatuses()[0]
	if st.Admitted[wire.CriticalPlus] != 0 || st.Admitted[wire.Critical] != 1 || st.Admitted[wire.Sheddable] != 1 {
		t.Errorf("admitted by criticality %v, want CRITICAL_PLUS counted as CRITICAL and SHEDDABLE as sent", st.Admitted)
	}
}

// TestWithCriticalityAllocatesNothing: the function adds no allocation to
// an admitted call.
func TestWithCriticalityAllocatesNothing(t *testing.T) {
	l := limitsOf(serviceconfig.ConcurrencyLimit{})
	l.Criticality = CapCriticality(wire.Critical)
	srv := newLimitServer(t, l)
	icpt := srv.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-other", "v"))
	h := func(context.Context, any) (any, error) { return nil, nil }
	if n := testing.AllocsPerRun(1000, func() { _, _ = icpt(ctx, nil, info, h) }); n != 0 {
		t.Errorf("allocs per admitted call = %v, want 0", n)
	}
}
