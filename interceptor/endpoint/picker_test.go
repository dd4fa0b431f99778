package endpoint

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"testing/synctest"
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
// policy behind it, configured by p, with a seeded random source.
func newTestPicker(t testing.TB, n int, p serviceconfig.EndpointPolicy) (*picker, *lb) {
	t.Helper()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	b := newLB("test", nil)
	b.rand = rand.New(rand.NewPCG(1, 2)).Uint64
	b.setConfig(newConfig(&p))
	pk := newPicker(b, b.cfg.Load(), nil)
	b.mu.Lock()
	for i := range n {
		e, _ := b.newEntryLocked(resolver.Endpoint{Addresses: []resolver.Address{{Addr: "ep" + string(rune('0'+i))}}})
		e.order = i
		e.ready, e.wasReady = true, true
		pk.ready = append(pk.ready, choice{e: e, picker: fixedPicker{&fakeSubConn{name: e.addrs[0]}}})
	}
	b.mu.Unlock()
	return pk, b
}

func pickedName(t *testing.T, res balancer.PickResult) string {
	t.Helper()
	return res.SubConn.(*fakeSubConn).name
}

// pickOne picks with ctx and ends the attempt with di.
func pickOne(t *testing.T, pk *picker, ctx context.Context, di balancer.DoneInfo) string {
	t.Helper()
	res, err := pk.Pick(balancer.PickInfo{FullMethodName: "/s/M", Ctx: ctx})
	if err != nil {
		t.Fatal(err)
	}
	name := pickedName(t, res)
	res.Done(di)
	return name
}

var (
	ok          = balancer.DoneInfo{BytesSent: true, BytesReceived: true}
	unavailable = balancer.DoneInfo{Err: status.Error(codes.Unavailable, "down"), BytesSent: true, BytesReceived: true}
	reset       = balancer.DoneInfo{Err: status.Error(codes.Unavailable, "connection reset"), BytesSent: true}
)

// TestPickAndDoneAllocateNothing pins the pick's cost, exactly: 0
// allocations for a call's first attempt (no trail), for an attempt with
// a trail in a trail.Context (a stream embeds one), in every child
// mode, with an endpoint ejected, and for the Done callback. Run without
// the race detector, which makes sync.Pool drop records on purpose.
func TestPickAndDoneAllocateNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	for _, child := range []string{"round_robin", "pick_first", "peak_ewma"} {
		pk, _ := newTestPicker(t, 3, serviceconfig.EndpointPolicy{ChildPolicy: child, ConsecutiveFailures: 1, MaxEjectionPercent: ptr(50)})
		// Eject ep0 for the last row.
		for range 3 {
			if pickOne(t, pk, context.Background(), unavailable) == "ep0" {
				break
			}
		}
		var tc trail.Context
		for _, tt := range []struct {
			name string
			ctx  func() context.Context
		}{
			{"first attempt", context.Background},
			{"with a trail", func() context.Context {
				tc.Reset(context.Background(), time.Time{})
				return &tc
			}},
		} {
			n := testing.AllocsPerRun(1000, func() {
				res, err := pk.Pick(balancer.PickInfo{FullMethodName: "/s/M", Ctx: tt.ctx()})
				if err != nil {
					t.Fatal(err)
				}
				res.Done(ok)
			})
			if n != 0 {
				t.Errorf("%s, %s: Pick+Done %v allocs, want 0", child, tt.name, n)
			}
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestPickPrefersAnEndpointTheCallHasNotUsed pins exact identity: every
// pick of a call with a trail, the first included, is recorded, and later
// picks avoid them whatever the endpoints' addresses.
func TestPickPrefersAnEndpointTheCallHasNotUsed(t *testing.T) {
	for _, child := range []string{"round_robin", "pick_first", "peak_ewma"} {
		pk, _ := newTestPicker(t, 3, serviceconfig.EndpointPolicy{ChildPolicy: child})
		ctx := trail.NewContext(context.Background(), time.Time{})
		seen := map[string]bool{}
		for range 3 {
			name := pickOne(t, pk, ctx, unavailable)
			if seen[name] {
				t.Fatalf("%s: picked %s again; the call used %v", child, name, seen)
			}
			seen[name] = true
		}
		if got := trail.FromContext(ctx).Len(); got != 3 {
			t.Fatalf("%s: trail holds %d picks, want 3 (the first included)", child, got)
		}
		// All used: any READY endpoint.
		pickOne(t, pk, ctx, ok)
	}
}

func TestPickOrderedIsPickFirstsOrder(t *testing.T) {
	pk, _ := newTestPicker(t, 3, serviceconfig.EndpointPolicy{ChildPolicy: "pick_first"})
	for range 5 {
		if got := pickOne(t, pk, context.Background(), ok); got != "ep0" {
			t.Fatalf("ordered pick = %s, want ep0", got)
		}
	}
	ctx := trail.NewContext(context.Background(), time.Time{})
	pickOne(t, pk, ctx, unavailable)
	if got := pickOne(t, pk, ctx, ok); got != "ep1" {
		t.Fatalf("ordered pick after ep0 = %s, want ep1", got)
	}
}

// TestPickSkipsEjectedEndpointsAndTheyReturn drives ejection through the
// Done callbacks, with the outcomes classified as the policy does.
func TestPickSkipsEjectedEndpointsAndTheyReturn(t *testing.T) {
	pk, b := newTestPicker(t, 3, serviceconfig.EndpointPolicy{ChildPolicy: "pick_first", ConsecutiveFailures: 2, BaseEjectionTime: time.Hour})
	for range 2 {
		pickOne(t, pk, context.Background(), unavailable)
	}
	for range 5 {
		if got := pickOne(t, pk, context.Background(), ok); got != "ep1" {
			t.Fatalf("pick with ep0 ejected = %s, want ep1", got)
		}
	}
	if ej, _ := b.group.Ejections(); ej != 1 {
		t.Fatalf("%d ejections, want 1", ej)
	}
}

// TestAbandonedPickIsNoOutcome pins REVIEW class 11: grpc abandons a pick
// whose connection closed before the attempt started (Done with an empty
// DoneInfo); that is no success, so a crash-looping endpoint failing every
// attempt that reaches it still has its run of failures. Before: each
// abandoned pick counted as a success and broke the run.
func TestAbandonedPickIsNoOutcome(t *testing.T) {
	pk, b := newTestPicker(t, 3, serviceconfig.EndpointPolicy{ChildPolicy: "pick_first", ConsecutiveFailures: 3})
	for range 3 {
		pickOne(t, pk, context.Background(), unavailable)
		pickOne(t, pk, context.Background(), balancer.DoneInfo{}) // abandoned
	}
	if ej, _ := b.group.Ejections(); ej != 1 {
		t.Fatalf("%d ejections, want 1: abandoned picks broke the run of failures", ej)
	}
}

// TestLocalFailureOfAReplacedConnectionIsDropped pins the connection
// generation: a reset reported after the endpoint reconnected (an attempt
// of the old connection ending late) does not count against the new one.
func TestLocalFailureOfAReplacedConnectionIsDropped(t *testing.T) {
	pk, _ := newTestPicker(t, 3, serviceconfig.EndpointPolicy{ChildPolicy: "pick_first", ConsecutiveLocalOriginFailures: 1})
	res, err := pk.Pick(balancer.PickInfo{Ctx: context.Background()})
	if err != nil {
		t.Fatal(err)
	}
	e := pk.ready[0].e
	e.gen.Add(1) // it reconnected meanwhile
	res.Done(reset)
	if s := e.out.State(time.Now()); s.ConsecutiveLocalFailures != 0 || !s.EjectedUntil.IsZero() {
		t.Fatalf("a late reset of the old connection counted: %+v", s)
	}
	pickOne(t, pk, context.Background(), reset)
	if s := e.out.State(time.Now()); s.EjectedUntil.IsZero() || s.Cause != outlier.LocalOrigin {
		t.Fatalf("a reset of the current connection did not eject at consecutiveLocalOriginFailures 1: %+v", s)
	}
}

// TestClassify pins how each way an attempt ends counts, per the
// classify doc.
func TestClassify(t *testing.T) {
	if want := rescodes.Of(codes.Unavailable, codes.Internal, codes.DataLoss); defaultFailures != want {
		t.Fatalf("defaultFailures = %v, want %v (UNKNOWN is an answer a caller can provoke)", defaultFailures, want)
	}
	st := func(c codes.Code) error { return status.Error(c, "") }
	sent := func(err error, received bool) balancer.DoneInfo {
		return balancer.DoneInfo{Err: err, BytesSent: true, BytesReceived: received}
	}
	own, timer := attemptEnd{own: true}, attemptEnd{timedOut: true}
	tests := []struct {
		name string
		di   balancer.DoneInfo
		end  attemptEnd
		want outlier.Outcome
		lat  latencyUse
	}{
		{"ok", sent(nil, true), attemptEnd{}, outlier.Success, latencySample},
		{"abandoned pick (empty done info)", balancer.DoneInfo{}, attemptEnd{}, outlier.Ignored, latencyNone},
		{"unavailable, nothing sent (per-RPC credentials)", balancer.DoneInfo{Err: st(codes.Unavailable)}, attemptEnd{}, outlier.Ignored, latencyNone},
		{"unavailable answered", sent(st(codes.Unavailable), true), attemptEnd{}, outlier.Failure, latencyPeak},
		{"reset before any response", sent(st(codes.Unavailable), false), attemptEnd{}, outlier.LocalFailure, latencyNone},
		{"internal", sent(st(codes.Internal), true), attemptEnd{}, outlier.Failure, latencyPeak},
		{"unknown (an application's plain error)", sent(st(codes.Unknown), true), attemptEnd{}, outlier.Ignored, latencyPeak},
		{"client's own internal (no marshal)", sent(st(codes.Internal), false), attemptEnd{}, outlier.Ignored, latencyNone},
		{"resource exhausted", sent(st(codes.ResourceExhausted), true), attemptEnd{}, outlier.Busy, latencyNone},
		{"unavailable with pushback", balancer.DoneInfo{Err: st(codes.Unavailable), BytesSent: true, BytesReceived: true,
			Trailer: metadata.Pairs(pushbackKey, "100")}, attemptEnd{}, outlier.Busy, latencyNone},
		{"caller's cancel", sent(st(codes.Canceled), true), attemptEnd{}, outlier.Ignored, latencyNone},
		{"caller's deadline", sent(st(codes.DeadlineExceeded), false), attemptEnd{}, outlier.Ignored, latencyNone},
		{"per-attempt timeout", sent(st(codes.DeadlineExceeded), false), own, outlier.Failure, latencyCut},
		{"per-attempt timeout, server's status", sent(st(codes.DeadlineExceeded), true), own, outlier.Failure, latencyCut},
		{"stream's per-attempt timer", sent(st(codes.Canceled), false), timer, outlier.Failure, latencyCut},
		// A stream commits on the caller's reads: one whose endpoint had
		// answered and whose caller read late is cut by the timer too.
		{"stream's per-attempt timer, the endpoint had answered", sent(st(codes.Canceled), true), timer, outlier.Ignored, latencyNone},
		{"cancel, not the timer", sent(st(codes.Canceled), true), own, outlier.Ignored, latencyNone},
		{"hedged copy another copy outran", sent(st(codes.Canceled), false), attemptEnd{ended: true}, outlier.Ignored, latencyCut},
		{"hedged copy another copy outran, headers in", sent(st(codes.Canceled), true), attemptEnd{ended: true}, outlier.Ignored, latencyCut},
		{"a failure as the call ended", sent(st(codes.Unavailable), true), attemptEnd{ended: true}, outlier.Failure, latencyPeak},
		{"application error", sent(st(codes.NotFound), true), attemptEnd{}, outlier.Ignored, latencyPeak},
	}
	for _, tt := range tests {
		if got, lat := classify(tt.di, defaultFailures, tt.end); got != tt.want || lat != tt.lat {
			t.Errorf("classify(%s) = %v, %v; want %v, %v", tt.name, got, lat, tt.want, tt.lat)
		}
	}
}

// TestParseConfigEndpointConcurrency pins what reaches the picker: each
// attempt outstanding weighs 1/endpointConcurrency of a latency, a quarter
// when absent.
func TestParseConfigEndpointConcurrency(t *testing.T) {
	for _, tt := range []struct {
		doc  string
		want float64
	}{
		{`{"childPolicy": [{"peak_ewma": {}}]}`, 0.25},
		{`{"childPolicy": [{"peak_ewma": {"endpointConcurrency": 1}}]}`, 1},
		{`{"childPolicy": [{"peak_ewma": {"endpointConcurrency": 8}}]}`, 0.125},
	} {
		c, err := builder{}.ParseConfig([]byte(tt.doc))
		if err != nil {
			t.Fatalf("ParseConfig(%s) = %v", tt.doc, err)
		}
		if got := c.(*lbConfig).perAttempt; got != tt.want {
			t.Errorf("ParseConfig(%s): perAttempt = %v, want %v", tt.doc, got, tt.want)
		}
	}
}

func TestParseConfigErrorNamesThePolicyAndPath(t *testing.T) {
	_, err := builder{}.ParseConfig([]byte(`{"maxEjectionPercent": 101}`))
	const want = "resilience_endpoint.maxEjectionPercent: must be in [0, 100] (0 ejects nothing; absent: the default, 50)"
	if err == nil || err.Error() != want {
		t.Fatalf("ParseConfig = %v, want %q", err, want)
	}
}

// TestPeakEWMAPicksTheCheaperOfTwo pins the peak_ewma choice: of three
// endpoints, one measured 10× slower is picked only when it is not among
// the two candidates' cheaper (never, with the others idle and fast), and
// load spreads over the others by their outstanding attempts.
func TestPeakEWMAPicksTheCheaperOfTwo(t *testing.T) {
	pk, _ := newTestPicker(t, 3, serviceconfig.EndpointPolicy{ChildPolicy: "peak_ewma"})
	now := pk.b.nanotime(time.Now())
	for i, d := range []time.Duration{time.Millisecond, 10 * time.Millisecond, time.Millisecond} {
		pk.ready[i].e.lat.Observe(now, d, pk.decay)
	}
	counts := map[string]int{}
	var held []balancer.PickResult
	for range 300 {
		res, err := pk.Pick(balancer.PickInfo{Ctx: context.Background()})
		if err != nil {
			t.Fatal(err)
		}
		counts[pickedName(t, res)]++
		held = append(held, res) // outstanding: the cost grows with them
		if len(held) == 8 {
			for _, r := range held {
				r.Done(balancer.DoneInfo{Err: status.Error(codes.Canceled, ""), BytesSent: true}) // no sample
			}
			held = held[:0]
		}
	}
	for _, r := range held {
		r.Done(balancer.DoneInfo{})
	}
	if counts["ep1"] > 15 || counts["ep0"] < 120 || counts["ep2"] < 120 {
		t.Fatalf("picks = %v, want the slow ep1 (10×) rarely, ep0 and ep2 about even", counts)
	}
	for _, c := range pk.ready {
		if n := c.e.outstanding.Load(); n != 0 {
			t.Fatalf("%s: %d outstanding after every Done", c.e.name, n)
		}
	}
}

// TestPeakEWMAWeighsOutstandingByEndpointConcurrency pins the cost of an
// attempt in flight: two fast endpoints (5ms) with 8 attempts each and an
// idle one 10× slower (50ms). Priced as Finagle and Linkerd price it
// (endpointConcurrency 1: 5ms × 9 = 45ms against 50ms × 1) the slow one is
// nearly as cheap, and two attempts more make it cheaper; at the default 4
// (5ms × 3 = 15ms) it is far dearer until 36 attempts are out. The penalty of an endpoint with attempts out
// and no sample is the same under both.
func TestPeakEWMAWeighsOutstandingByEndpointConcurrency(t *testing.T) {
	for _, tt := range []struct {
		conc     int // 0: the default
		out      int32
		slowWins bool
	}{
		{0, 8, false}, {0, 35, false}, {0, 40, true},
		{1, 8, false}, {1, 10, true},
		{16, 140, false}, {16, 150, true},
	} {
		pk, b := newTestPicker(t, 3, serviceconfig.EndpointPolicy{ChildPolicy: "peak_ewma", EndpointConcurrency: tt.conc})
		now := b.nanotime(time.Now())
		for i, d := range []time.Duration{5 * time.Millisecond, 50 * time.Millisecond, 5 * time.Millisecond} {
			pk.ready[i].e.lat.Observe(now, d, pk.decay)
		}
		pk.ready[0].e.outstanding.Store(tt.out)
		if k, _ := pk.cheaper(0, 1, now); (k == 1) != tt.slowWins {
			t.Errorf("endpointConcurrency %d, %d out on the fast one: slow one cheaper = %v, want %v", tt.conc, tt.out, k == 1, tt.slowWins)
		}
		pk.ready[0].e.outstanding.Store(0)
	}
}

// TestPeakEWMASkipsEjectedAndUsedEndpoints pins that peak_ewma chooses
// among READY, non-ejected, untried endpoints first: with ep0 ejected and
// ep1 used by the call, a retry goes to ep2 even when ep2 is the slowest.
func TestPeakEWMASkipsEjectedAndUsedEndpoints(t *testing.T) {
	pk, _ := newTestPicker(t, 3, serviceconfig.EndpointPolicy{ChildPolicy: "peak_ewma", ConsecutiveFailures: 1, MaxEjectionPercent: ptr(50)})
	now := pk.b.nanotime(time.Now())
	for i, d := range []time.Duration{time.Millisecond, time.Millisecond, time.Second} {
		pk.ready[i].e.lat.Observe(now, d, pk.decay)
	}
	pk.ready[0].e.out.Record(time.Now(), outlier.Failure)
	for range 50 {
		ctx := trail.NewContext(context.Background(), time.Time{})
		trail.FromContext(ctx).Add(pk.ready[1].e.id)
		if got := pickOne(t, pk, ctx, ok); got != "ep2" {
			t.Fatalf("retry picked %s, want ep2 (ep0 ejected, ep1 used)", got)
		}
	}
}

// TestPeakEWMAMeasuresTimeoutsAsAPeak pins that an attempt cut by the
// Client's per-attempt timeout raises the endpoint's latency estimate
// (to at least the time it ran), so peak_ewma moves calls away from a
// silent endpoint before any ejection. On the bubble's clock, so that the
// attempt runs 2ms exactly and the estimate is read at its end.
func TestPeakEWMAMeasuresTimeoutsAsAPeak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pk, _ := newTestPicker(t, 1, serviceconfig.EndpointPolicy{ChildPolicy: "peak_ewma", ConsecutiveFailures: 1000})
		var tc trail.Context
		tc.Reset(context.Background(), time.Now().Add(time.Hour))
		ctx, cancel := context.WithDeadline(&tc, time.Now().Add(time.Minute)) // before the bound: the Client's own timeout
		defer cancel()
		res, err := pk.Pick(balancer.PickInfo{Ctx: ctx})
		if err != nil {
			t.Fatal(err)
		}
		e := pk.ready[0].e
		time.Sleep(2 * time.Millisecond) // the attempt runs
		res.Done(balancer.DoneInfo{Err: status.Error(codes.DeadlineExceeded, ""), BytesSent: true})
		if got := e.lat.Estimate(pk.b.nanotime(time.Now()), pk.decay); got < 2*time.Millisecond {
			t.Fatalf("estimate after a per-attempt timeout of 2ms = %v", got)
		}
		if s := e.out.State(time.Now()); s.ConsecutiveFailures != 1 {
			t.Fatalf("a per-attempt timeout did not count as a failure: %+v", s)
		}
	})
}

// TestEndpointLabelIsBoundedPerChannel pins REVIEW class 4 for the
// optional endpoint metric label: a channel gives out at most maxLabels
// distinct values over its life (endpoints come and go with deployments),
// then "other"; an endpoint seen before keeps its label.
func TestEndpointLabelIsBoundedPerChannel(t *testing.T) {
	b := newLB("t", nil)
	b.mu.Lock()
	defer b.mu.Unlock()
	ep := func(i int) resolver.Endpoint {
		return resolver.Endpoint{Addresses: []resolver.Address{{Addr: "10.1." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256) + ":443"}}}
	}
	for i := range maxLabels + 5 {
		e, _ := b.newEntryLocked(ep(i))
		if want := i < maxLabels; (e.label == e.name) != want || !want && e.label != "other" {
			t.Fatalf("endpoint %d: label %q, name %q", i, e.label, e.name)
		}
	}
	if e, _ := b.newEntryLocked(ep(3)); e.label != e.name {
		t.Fatalf("an endpoint seen before lost its label: %q", e.label)
	}
}

// BenchmarkPick measures a pick and its Done on the success path, each
// child, from parallel callers (the rotation's counter and the records'
// pool are the shared state).
func BenchmarkPick(b *testing.B) {
	for _, child := range []string{"round_robin", "pick_first", "peak_ewma"} {
		b.Run(child, func(b *testing.B) {
			pk, lb := newTestPicker(b, 3, serviceconfig.EndpointPolicy{ChildPolicy: child})
			lb.rand = rand.Uint64 // the seeded source is not safe for parallel use
			info := balancer.PickInfo{FullMethodName: "/s/M", Ctx: context.Background()}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, err := pk.Pick(info)
					if err != nil {
						b.Fatal(err)
					}
					res.Done(ok)
				}
			})
		})
	}
}

// TestHedgesLeaveTheRotationToFirstAttempts pins that a call's later
// attempts (a hedged copy, a retry) do not take a turn of the round_robin
// rotation: with one call at a time and every call whose first attempt
// lands on the slow ep1 hedged, each endpoint gets a third of the first
// attempts. When the hedge took the next turn, ep1 got every other call
// (its turn, then the turn after the hedge's), half of them, and ep2 none:
// the bench's hedge-budget scenario, whose budget paid for 45% of the calls
// against a slow share of 50%. The hedges spread over the other endpoints.
func TestHedgesLeaveTheRotationToFirstAttempts(t *testing.T) {
	pk, _ := newTestPicker(t, 3, serviceconfig.EndpointPolicy{ChildPolicy: "round_robin"})
	first := map[string]int{}
	hedges := map[string]int{}
	const calls = 300
	for range calls {
		ctx := trail.NewContext(context.Background(), time.Time{})
		name := pickOne(t, pk, ctx, ok)
		first[name]++
		if name == "ep1" {
			h := pickOne(t, pk, ctx, ok)
			if h == "ep1" {
				t.Fatal("the hedge went to the endpoint its call had used")
			}
			hedges[h]++
		}
	}
	for _, ep := range []string{"ep0", "ep1", "ep2"} {
		if first[ep] != calls/3 {
			t.Errorf("first attempts %v, want %d each: the hedges took turns", first, calls/3)
			break
		}
	}
	if hedges["ep0"] != calls/6 || hedges["ep2"] != calls/6 {
		t.Errorf("hedges %v, want %d each on ep0 and ep2", hedges, calls/6)
	}
}
