package endpoint

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor/internal/trail"
	"github.com/grpc-resilience/resilience/internal/outlier"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// fixedPicker is an endpoint's child picker: it returns its SubConn.
type fixedPicker struct{ sc balancer.SubConn }

func (p fixedPicker) Pick(balancer.PickInfo) (balancer.PickResult, error) {
	return balancer.PickResult{SubConn: p.sc}, nil
}

type fakeSubConn struct {
	balancer.SubConn
	name string
}

// newTestPicker returns a picker over n READY endpoints "ep0", ... and the
// policy behind it, configured by p.
func newTestPicker(t *testing.T, n int, p serviceconfig.EndpointPolicy, ordered bool) (*picker, *lb) {
	t.Helper()
	b := &lb{entries: resolver.NewEndpointMap[*entry]()}
	b.setConfigLocked(newConfig(&p))
	pk := &picker{b: b, ordered: ordered}
	for i := range n {
		e := b.newEntry(i, []string{"ep" + string(rune('0'+i))})
		pk.ready = append(pk.ready, choice{e: e, picker: fixedPicker{&fakeSubConn{name: e.addrs[0]}}})
	}
	return pk, b
}

func pickedName(t *testing.T, res balancer.PickResult) string {
	t.Helper()
	return res.SubConn.(*fakeSubConn).name
}

// TestPickOnTheSuccessPathAllocatesNothing pins the pick's cost: 0
// allocations for a call's first attempt (no trail), for a retry's (with
// its trail), and for the Done callback of a success.
func TestPickOnTheSuccessPathAllocatesNothing(t *testing.T) {
	pk, _ := newTestPicker(t, 3, serviceconfig.EndpointPolicy{}, false)
	bare := balancer.PickInfo{FullMethodName: "/s/M", Ctx: context.Background()}
	trailed := balancer.PickInfo{FullMethodName: "/s/M", Ctx: trail.NewContext(context.Background(), "ep0")}
	for _, tt := range []struct {
		name string
		info balancer.PickInfo
	}{{"first attempt", bare}, {"with a trail", trailed}} {
		n := testing.AllocsPerRun(1000, func() {
			res, err := pk.Pick(tt.info)
			if err != nil {
				t.Fatal(err)
			}
			res.Done(balancer.DoneInfo{})
		})
		if n != 0 {
			t.Errorf("Pick+Done (%s): %v allocs, want 0", tt.name, n)
		}
	}
}

func TestPickPrefersAnEndpointTheCallHasNotUsed(t *testing.T) {
	pk, _ := newTestPicker(t, 3, serviceconfig.EndpointPolicy{}, false)
	ctx := trail.NewContext(context.Background(), "ep1") // the first attempt's peer
	info := balancer.PickInfo{Ctx: ctx}
	seen := map[string]bool{"ep1": true}
	for range 2 {
		res, err := pk.Pick(info)
		if err != nil {
			t.Fatal(err)
		}
		name := pickedName(t, res)
		if seen[name] {
			t.Fatalf("picked %s again; the call used %v", name, seen)
		}
		seen[name] = true
	}
	// All used: any READY endpoint.
	if _, err := pk.Pick(info); err != nil {
		t.Fatalf("Pick with every endpoint used = %v, want a pick", err)
	}
}

func TestPickOrderedIsPickFirstsOrder(t *testing.T) {
	pk, _ := newTestPicker(t, 3, serviceconfig.EndpointPolicy{}, true)
	for range 5 {
		res, _ := pk.Pick(balancer.PickInfo{Ctx: context.Background()})
		if got := pickedName(t, res); got != "ep0" {
			t.Fatalf("ordered pick = %s, want ep0", got)
		}
	}
	res, _ := pk.Pick(balancer.PickInfo{Ctx: trail.NewContext(context.Background(), "ep0")})
	if got := pickedName(t, res); got != "ep1" {
		t.Fatalf("ordered pick after ep0 = %s, want ep1", got)
	}
}

// TestPickSkipsEjectedEndpointsAndTheyReturn drives ejection through the
// Done callbacks, with the outcomes classified as the policy does.
func TestPickSkipsEjectedEndpointsAndTheyReturn(t *testing.T) {
	pk, b := newTestPicker(t, 3, serviceconfig.EndpointPolicy{ConsecutiveFailures: 2, BaseEjectionTime: time.Hour}, true)
	fail := balancer.DoneInfo{Err: status.Error(codes.Unavailable, "down")}
	for range 2 {
		res, _ := pk.Pick(balancer.PickInfo{Ctx: context.Background()})
		res.Done(fail)
	}
	for range 5 {
		res, _ := pk.Pick(balancer.PickInfo{Ctx: context.Background()})
		if got := pickedName(t, res); got != "ep1" {
			t.Fatalf("pick with ep0 ejected = %s, want ep1", got)
		}
	}
	if ej, _ := b.group.Ejections(); ej != 1 {
		t.Fatalf("%d ejections, want 1", ej)
	}
}

func TestOutcomeBusyIsNotBroken(t *testing.T) {
	fail := defaultFailures
	if want := rescodes.Of(codes.Unavailable, codes.Unknown, codes.Internal, codes.DataLoss); fail != want {
		t.Fatalf("defaultFailures = %v, want %v", fail, want)
	}
	tests := []struct {
		name     string
		err      error
		trailer  metadata.MD
		received bool
		want     outlier.Outcome
	}{
		{"ok", nil, nil, true, outlier.Success},
		{"unavailable", status.Error(codes.Unavailable, ""), nil, true, outlier.Failure},
		{"unreachable", status.Error(codes.Unavailable, ""), nil, false, outlier.Failure},
		{"internal", status.Error(codes.Internal, ""), nil, true, outlier.Failure},
		{"client's own internal (no marshal)", status.Error(codes.Internal, ""), nil, false, outlier.Ignored},
		{"resource exhausted", status.Error(codes.ResourceExhausted, ""), nil, true, outlier.Busy},
		{"unavailable with pushback", status.Error(codes.Unavailable, ""), metadata.Pairs(pushbackKey, "100"), true, outlier.Busy},
		{"caller's cancel", status.Error(codes.Canceled, ""), nil, true, outlier.Ignored},
		{"caller's deadline", status.Error(codes.DeadlineExceeded, ""), nil, true, outlier.Ignored},
		{"application error", status.Error(codes.NotFound, ""), nil, true, outlier.Ignored},
	}
	for _, tt := range tests {
		if got := outcome(tt.err, tt.trailer, tt.received, fail); got != tt.want {
			t.Errorf("outcome(%s) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestParseConfigErrorNamesThePolicyAndPath(t *testing.T) {
	_, err := builder{}.ParseConfig([]byte(`{"maxEjectionPercent": 101}`))
	const want = "resilience_endpoint.maxEjectionPercent: must be in [1, 100] (0: the default, 50)"
	if err == nil || err.Error() != want {
		t.Fatalf("ParseConfig = %v, want %q", err, want)
	}
}

// TestLateFailureUnderAReplacedConfigAddsNoOverflow pins that the
// refusals of a group a new ejection configuration replaced are dropped,
// as noteOverflow says: a failure reported late by an attempt picked
// under the old configuration must not add the old group's refusals to
// the new one's count. Before: Snapshot.Overflow jumped from 0 to the old
// group's total (and the metric with it).
func TestLateFailureUnderAReplacedConfigAddsNoOverflow(t *testing.T) {
	pk, b := newTestPicker(t, 2, serviceconfig.EndpointPolicy{ConsecutiveFailures: 1, MaxEjectionPercent: 1}, true)
	fail := balancer.DoneInfo{Err: status.Error(codes.Unavailable, "down")}
	old := pk.ready[0].e
	for range 5 {
		old.done(fail) // 1% of 2 endpoints: its ejection held back
	}
	if got := b.overflow.Load(); got != 1 {
		t.Fatalf("overflow = %d under the first config, want 1", got)
	}
	b.mu.Lock()
	b.setConfigLocked(newConfig(&serviceconfig.EndpointPolicy{ConsecutiveFailures: 2, MaxEjectionPercent: 1}))
	b.mu.Unlock()
	old.done(fail) // an attempt in flight across the change
	if got := b.overflow.Load(); got != 0 {
		t.Fatalf("overflow = %d after a late failure under the replaced config, want 0", got)
	}
}
