package budget

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const ms = time.Millisecond

func at(d time.Duration) time.Time { return t0.Add(d) }

func mustNew(t testing.TB, cfg Config) *Budget {
	t.Helper()
	b, err := New(cfg, t0)
	if err != nil {
		t.Fatalf("New(%+v) = %v", cfg, err)
	}
	return b
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr bool
	}{
		{"defaults", DefaultConfig(), false},
		{"no share, reserve only", Config{Ratio: 0, MinRetriesPerSecond: 1, TTL: time.Second}, false},
		{"no reserve", Config{Ratio: 0.2, MinRetriesPerSecond: 0, TTL: time.Second}, false},
		{"largest ratio", Config{Ratio: 1000, TTL: MinTTL}, false},
		{"zero value", Config{}, true},
		{"negative ratio", Config{Ratio: -0.1, TTL: time.Second}, true},
		{"ratio above 1000", Config{Ratio: 1000.1, TTL: time.Second}, true},
		{"ratio NaN", Config{Ratio: math.NaN(), TTL: time.Second}, true},
		{"negative minRetriesPerSecond", Config{Ratio: 0.2, MinRetriesPerSecond: -1, TTL: time.Second}, true},
		{"minRetriesPerSecond NaN", Config{Ratio: 0.2, MinRetriesPerSecond: math.NaN(), TTL: time.Second}, true},
		{"minRetriesPerSecond infinite", Config{Ratio: 0.2, MinRetriesPerSecond: math.Inf(1), TTL: time.Second}, true},
		{"ttl below the minimum", Config{Ratio: 0.2, TTL: MinTTL - 1}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg, t0)
			if (err != nil) != tt.wantErr {
				t.Errorf("New(%+v) error = %v, want error %v", tt.cfg, err, tt.wantErr)
			}
		})
	}
}

func TestDefaultReserve(t *testing.T) {
	b := mustNew(t, DefaultConfig())
	if got := b.Available(t0); got != 100 {
		t.Errorf("Available(start) with defaults = %v, want 100 (10/s × 10s)", got)
	}
}

// op is one step of a trace: a call at an instant, and what the budget must
// say afterwards.
type op struct {
	at      time.Duration // since t0
	do      string        // "request", "retry" (must be granted), "denied" (must be refused), "refund" (the last granted retry)
	wantAvl float64       // Available(at) after the step
}

func runTrace(t *testing.T, cfg Config, ops []op) {
	t.Helper()
	b := mustNew(t, cfg)
	var last Retry
	for i, o := range ops {
		now := at(o.at)
		switch o.do {
		case "request":
			b.OnRequest(now)
		case "retry", "denied":
			r, ok := b.TryRetry(now)
			if want := o.do == "retry"; ok != want {
				t.Fatalf("step %d: TryRetry(t0+%v) = %v, want %v (available before: %v)", i, o.at, ok, want, b.Available(now))
			}
			if ok {
				last = r
			} else if r != (Retry{}) {
				t.Fatalf("step %d: TryRetry refused but returned %+v, want the zero Retry", i, r)
			}
		case "refund":
			b.Refund(last)
		default:
			t.Fatalf("step %d: unknown op %q", i, o.do)
		}
		if got := b.Available(now); math.Abs(got-o.wantAvl) > 1e-9 {
			t.Fatalf("step %d (%s at t0+%v): Available = %v, want %v", i, o.do, o.at, got, o.wantAvl)
		}
	}
}

func TestShareOfRequests(t *testing.T) {
	// No reserve: five requests at ratio 0.2 pay for exactly one retry.
	cfg := Config{Ratio: 0.2, TTL: 10 * time.Second}
	runTrace(t, cfg, []op{
		{0, "denied", 0},
		{0, "request", 0.2},
		{ms, "request", 0.4},
		{2 * ms, "request", 0.6},
		{3 * ms, "request", 0.8},
		{4 * ms, "denied", 0.8},
		{5 * ms, "request", 1},
		{6 * ms, "retry", 0}, // balance after the withdrawal is exactly 0: allowed
		{7 * ms, "denied", 0},
	})
}

func TestReserveOnly(t *testing.T) {
	// Ratio 0, 1 retry per second over 10 s: a reserve of 10 retries.
	cfg := Config{Ratio: 0, MinRetriesPerSecond: 1, TTL: 10 * time.Second}
	var ops []op
	for i := range 10 {
		ops = append(ops, op{time.Duration(i) * ms, "retry", float64(9 - i)})
	}
	ops = append(ops,
		op{10 * ms, "denied", 0},
		op{10*time.Second - 1, "denied", 0}, // still bucket 15 of the window
		op{10 * time.Second, "retry", 9},    // bucket 16: bucket 0's withdrawals are forgotten
	)
	runTrace(t, cfg, ops)
}

// TestWindowForgetsAfterTTL pins when an event leaves the window: at the end
// of the bucket 16 buckets (one TTL) after its own, so between TTL − TTL/16
// and TTL after the event.
func TestWindowForgetsAfterTTL(t *testing.T) {
	cfg := Config{Ratio: 1, TTL: 16 * time.Second} // buckets of 1 s
	tests := []struct {
		name    string
		request time.Duration // instant of the only request
		check   time.Duration
		want    float64
	}{
		{"same instant", 0, 0, 1},
		{"end of its own bucket", 0, time.Second - 1, 1},
		{"15 buckets later", 0, 16*time.Second - 1, 1},
		{"exactly TTL later", 0, 16 * time.Second, 0},
		{"late in its bucket: still counted TTL − 1s + 1ns later", time.Second - 1, 16*time.Second - 1, 1},
		{"late in its bucket: forgotten TTL − 1ns + 1ns later", time.Second - 1, 16 * time.Second, 0},
		{"long after", 0, time.Hour, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustNew(t, cfg)
			b.OnRequest(at(tt.request))
			if got := b.Available(at(tt.check)); got != tt.want {
				t.Errorf("request at t0+%v, Available(t0+%v) = %v, want %v", tt.request, tt.check, got, tt.want)
			}
		})
	}
}

func TestRefund(t *testing.T) {
	cfg := Config{Ratio: 0, MinRetriesPerSecond: 0.2, TTL: 10 * time.Second} // reserve 2
	runTrace(t, cfg, []op{
		{0, "retry", 1},
		{ms, "refund", 2}, // a retry that succeeded costs nothing
		{2 * ms, "retry", 1},
		{3 * ms, "retry", 0},
		{4 * ms, "denied", 0},
		{time.Second, "refund", 1}, // refunds the withdrawal at 3ms, in bucket 0
		{2 * time.Second, "retry", 0},
	})
}

func TestRefundAfterTheWithdrawalLeftTheWindowGivesNothing(t *testing.T) {
	b := mustNew(t, Config{Ratio: 0, MinRetriesPerSecond: 0.1, TTL: 10 * time.Second}) // reserve 1
	r, ok := b.TryRetry(t0)
	if !ok {
		t.Fatal("TryRetry(t0) = false, want true")
	}
	late := at(10 * time.Second) // the withdrawal's bucket has left the window
	if got := b.Available(late); got != 1 {
		t.Fatalf("Available(t0+10s) = %v, want 1", got)
	}
	b.OnRequest(late) // writes nothing at ratio 0; a TryRetry would reuse the slot
	b.Refund(r)
	if got := b.Available(late); got != 1 {
		t.Errorf("Available(t0+10s) after refunding a forgotten retry = %v, want 1 (not inflated)", got)
	}
	// The same holds once the slot has been reused by a later epoch.
	r2, _ := b.TryRetry(late)
	b.Refund(r)
	if got := b.Available(late); got != 0 {
		t.Errorf("Available after refunding a forgotten retry over a reused slot = %v, want 0", got)
	}
	b.Refund(r2)
	if got := b.Available(late); got != 1 {
		t.Errorf("Available after refunding the live retry = %v, want 1", got)
	}
}

func TestZeroRetryRefundIsANoOp(t *testing.T) {
	b := mustNew(t, DefaultConfig())
	b.Refund(Retry{})
	if got := b.Available(t0); got != 100 {
		t.Errorf("Available after Refund(Retry{}) = %v, want 100", got)
	}
}

func TestInstantsOutOfOrder(t *testing.T) {
	b := mustNew(t, Config{Ratio: 1, TTL: 16 * time.Second})
	b.OnRequest(t0.Add(-time.Hour)) // before New's instant: counts as the start
	if got := b.Available(t0); got != 1 {
		t.Errorf("Available after a request dated before start = %v, want 1", got)
	}
	b.OnRequest(at(20 * time.Second)) // bucket 20 takes slot 4
	b.OnRequest(at(4 * time.Second))  // bucket 4, a whole window late, same slot: dropped
	if got := b.Available(at(20 * time.Second)); got != 1 {
		t.Errorf("Available(t0+20s) after a request a window late = %v, want 1", got)
	}
	if _, ok := b.TryRetry(at(4 * time.Second)); ok {
		t.Error("TryRetry a whole window late = true, want false")
	}
	// A caller slightly ahead opens the next bucket; one slightly behind
	// still counts it.
	b.OnRequest(at(21 * time.Second))
	if got := b.Available(at(20 * time.Second)); got != 2 {
		t.Errorf("Available(t0+20s) with a request at t0+21s = %v, want 2", got)
	}
}

func TestBucketSaturates(t *testing.T) {
	b := mustNew(t, Config{Ratio: 1000, TTL: MinTTL})
	for range 3000 { // 3e9 milli-retries into one bucket: more than an int32
		b.OnRequest(t0)
	}
	got := b.Available(t0)
	if want := float64(math.MaxInt32) / cost; got != want {
		t.Errorf("Available after overfilling one bucket = %v, want the saturated %v", got, want)
	}
	if _, ok := b.TryRetry(t0); !ok {
		t.Error("TryRetry on a saturated bucket = false, want true")
	}
}

// TestNeverOverdrawnUnderConcurrency runs 32 goroutines in a full outage at
// one instant: every call retries as long as the budget lets it. The retries
// granted must never exceed reserve + Ratio × requests.
func TestNeverOverdrawnUnderConcurrency(t *testing.T) {
	const callers, calls = 32, 200
	b := mustNew(t, DefaultConfig())
	var granted atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range calls {
				b.OnRequest(t0)
				for range 3 {
					if _, ok := b.TryRetry(t0); !ok {
						break
					}
					granted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	limit := int64(100 + DefaultRatio*callers*calls)
	t.Logf("%d calls: %d retries granted, limit %d", callers*calls, granted.Load(), limit)
	if got := granted.Load(); got > limit {
		t.Errorf("retries granted = %d, want at most %d", got, limit)
	}
	if got := b.Available(t0); got < 0 {
		t.Errorf("Available after the run = %v, want ≥ 0", got)
	}
}

func TestConcurrentRefundsAreNotLost(t *testing.T) {
	b := mustNew(t, DefaultConfig())
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 500 {
				b.OnRequest(t0)
				if r, ok := b.TryRetry(t0); ok {
					b.Refund(r)
				}
			}
		})
	}
	wg.Wait()
	if got, want := b.Available(t0), 100+0.2*8*500; math.Abs(got-want) > 1e-9 {
		t.Errorf("Available after 4000 requests and refunded retries = %v, want %v", got, want)
	}
}

func TestNoAllocations(t *testing.T) {
	b := mustNew(t, DefaultConfig())
	if n := testing.AllocsPerRun(1000, func() {
		b.OnRequest(t0)
		r, _ := b.TryRetry(t0)
		b.Refund(r)
		_ = b.Available(t0)
		_ = b.Share(t0)
	}); n != 0 {
		t.Errorf("OnRequest, TryRetry, Refund, Available and Share allocate %v times per run, want 0", n)
	}
}

// TestShare pins Share: Ratio + reserve / requests over the window, +Inf
// with no request, 0 for a budget that pays nothing; requests leave the
// window with it.
func TestShare(t *testing.T) {
	b, err := New(Config{Ratio: 0.2, MinRetriesPerSecond: 10, TTL: 10 * time.Second}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if s := b.Share(t0); !math.IsInf(s, 1) {
		t.Errorf("Share with no request = %v, want +Inf", s)
	}
	for i := range 1000 { // 100 per second for 10s
		b.OnRequest(t0.Add(time.Duration(i) * 10 * time.Millisecond))
	}
	// The window holds the last 15 or 16 buckets of 625ms: about 938 to
	// 1000 requests, a reserve of 100 retries.
	now := t0.Add(9990 * time.Millisecond)
	if s := b.Share(now); s < 0.2+100.0/1000-1e-9 || s > 0.2+100.0/937+1e-9 {
		t.Errorf("Share at 100 requests a second = %v, want 0.2 + 10/100 = 0.3", s)
	}
	if s := b.Share(now.Add(time.Hour)); !math.IsInf(s, 1) {
		t.Errorf("Share an hour later = %v, want +Inf (no request left in the window)", s)
	}
	zero, err := New(Config{TTL: time.Second}, t0)
	if err != nil {
		t.Fatal(err)
	}
	zero.OnRequest(t0)
	if s := zero.Share(t0); s != 0 {
		t.Errorf("Share of a budget that pays nothing = %v, want 0", s)
	}
	if _, ok := zero.TryRetry(t0); ok {
		t.Error("a budget that pays nothing granted a retry")
	}
}
