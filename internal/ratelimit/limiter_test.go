package ratelimit

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func mustNew(tb testing.TB, cfg Config) *Limiter {
	tb.Helper()
	l, err := New(cfg, t0)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// TestAllowInstants pins GCRA on a table of instants: 10 calls per second
// (a token every 100ms), bursts of 3.
func TestAllowInstants(t *testing.T) {
	type step struct {
		at   time.Duration
		c    Criticality
		ok   bool
		wait time.Duration
	}
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{"burst then one per interval", Config{Rate: 10, Burst: 3}, []step{
			{0, Critical, true, 0},
			{0, Critical, true, 0},
			{0, Critical, true, 0},
			{0, Critical, false, 100 * time.Millisecond},
			{99 * time.Millisecond, Critical, false, time.Millisecond},
			{100 * time.Millisecond, Critical, true, 0},
			{100 * time.Millisecond, Critical, false, 100 * time.Millisecond},
			{time.Second, Critical, true, 0}, // refilled to the burst, no further
			{time.Second, Critical, true, 0},
			{time.Second, Critical, true, 0},
			{time.Second, Critical, false, 100 * time.Millisecond},
		}},
		{"burst of one spaces calls evenly", Config{Rate: 2, Burst: 1}, []step{
			{0, Critical, true, 0},
			{0, Critical, false, 500 * time.Millisecond},
			{400 * time.Millisecond, Critical, false, 100 * time.Millisecond},
			{500 * time.Millisecond, Critical, true, 0},
			// with a burst of 1 there is no reserve: the last token is everyone's
			{time.Second, Sheddable, true, 0},
			{time.Second, Critical, false, 500 * time.Millisecond},
		}},
		{"rate per minute", Config{Rate: 6, Per: time.Minute, Burst: 1}, []step{
			{0, Critical, true, 0},
			{time.Second, Critical, false, 9 * time.Second},
			{10 * time.Second, Critical, true, 0},
		}},
		{"fractional rate", Config{Rate: 0.5, Burst: 1}, []step{
			{0, Critical, true, 0},
			{time.Second, Critical, false, time.Second},
			{2 * time.Second, Critical, true, 0},
		}},
		{"instants before the epoch", Config{Rate: 10, Burst: 1}, []step{
			{-time.Hour, Critical, true, 0},
			{-time.Hour, Critical, false, 100 * time.Millisecond},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := mustNew(t, tt.cfg)
			for i, s := range tt.steps {
				ok, wait := l.Allow(at(s.at), "k", s.c)
				if ok != s.ok || wait != s.wait {
					t.Fatalf("step %d: Allow(%v, %v) = %v, %v; want %v, %v", i, s.at, s.c, ok, wait, s.ok, s.wait)
				}
			}
		})
	}
}

// TestWaitIsExact pins that a refusal's wait is the exact instant of
// admission: 1ns earlier is still refused, at the wait it is admitted; for
// each criticality, with rates whose interval is not a round number.
func TestWaitIsExact(t *testing.T) {
	for _, rate := range []float64{3, 7, 1000, 12345} {
		for c := range NumCriticalities {
			l := mustNew(t, Config{Rate: rate, Burst: 5})
			now := time.Duration(0)
			for range 20 { // drain the burst and then some
				ok, wait := l.Allow(at(now), "k", c)
				if ok {
					continue
				}
				if ok, _ := l.Allow(at(now+wait-1), "k", c); ok {
					t.Fatalf("rate %v %v: admitted 1ns before the wait %v", rate, c, wait)
				}
				if ok, w := l.Allow(at(now+wait), "k", c); !ok {
					t.Fatalf("rate %v %v: refused at the wait %v (wait now %v)", rate, c, wait, w)
				}
				now += wait
			}
		}
	}
}

// TestCriticalityReserve pins the reserve of the package doc: with a
// burst of 5 (4 above one token), Sheddable keeps half of those 4, so it
// is admitted while 2 tokens would be left after it: 3 of a full bucket;
// SheddablePlus keeps a quarter (1): 4; Critical and CriticalPlus take
// all 5. And then the critical calls take the 2 that Sheddable left.
func TestCriticalityReserve(t *testing.T) {
	for _, tt := range []struct {
		c    Criticality
		want int
	}{{Sheddable, 3}, {SheddablePlus, 4}, {Critical, 5}, {CriticalPlus, 5}} {
		l := mustNew(t, Config{Rate: 10, Burst: 5})
		n := 0
		for {
			ok, wait := l.Allow(t0, "k", tt.c)
			if !ok {
				if wait != 100*time.Millisecond {
					t.Errorf("%v: wait %v after the reserve was reached, want one interval (100ms)", tt.c, wait)
				}
				break
			}
			n++
		}
		if n != tt.want {
			t.Errorf("%v: %d admitted from a full bucket of 5, want %d", tt.c, n, tt.want)
		}
	}
	l := mustNew(t, Config{Rate: 10, Burst: 5})
	for range 3 {
		if ok, _ := l.Allow(t0, "k", Sheddable); !ok {
			t.Fatal("Sheddable refused within its share")
		}
	}
	for i := range 2 {
		if ok, _ := l.Allow(t0, "k", Critical); !ok {
			t.Fatalf("Critical call %d refused: the reserve Sheddable left was not there", i)
		}
	}
	if ok, wait := l.Allow(t0, "k", Sheddable); ok || wait != 300*time.Millisecond {
		t.Fatalf("Sheddable on an empty bucket: %v, %v; want refused for 300ms (3 tokens to come)", ok, wait)
	}
}

// TestSheddableRefusedUnderSustainedExcess is the reserve's purpose:
// Critical and Sheddable calls both offered at twice the rate each, for
// 10 s of fake time. The Critical calls get every token after the first
// burst and the Sheddable calls almost none, where without criticality
// they would share them.
func TestSheddableRefusedUnderSustainedExcess(t *testing.T) {
	l := mustNew(t, Config{Rate: 100, Burst: 20})
	var crit, shed int
	for i := range 4000 { // a call of each every 2.5ms: 400/s each
		now := at(time.Duration(i) * 2500 * time.Microsecond)
		if ok, _ := l.Allow(now, "k", Sheddable); ok {
			shed++
		}
		if ok, _ := l.Allow(now, "k", Critical); ok {
			crit++
		}
	}
	// The burst, and a token every 10ms up to the last call at 9.9975 s:
	// 20 + 999.
	if crit+shed != 1019 {
		t.Fatalf("admitted %d in all, want 1019 (the burst, and the tokens up to the last call)", crit+shed)
	}
	if shed > 11 { // the first half of the burst, and the first token
		t.Fatalf("Sheddable admitted %d times under a sustained Critical excess, want at most 11", shed)
	}
}

// TestAdmittedRateAtThreeTimesLoad: offered at 3× the rate for 10 s of
// fake time, with random (seeded) arrivals, the admitted count is the
// rate × 10 s plus the burst, to one token.
func TestAdmittedRateAtThreeTimesLoad(t *testing.T) {
	for _, rate := range []float64{7, 1000, 3333} {
		l := mustNew(t, Config{Rate: rate, Burst: 10})
		rng := rand.New(rand.NewPCG(1, uint64(rate)))
		admitted := 0
		mean := float64(time.Second) / (3 * rate)
		for now := time.Duration(0); now < 10*time.Second; now += time.Duration(rng.ExpFloat64() * mean) {
			if ok, _ := l.Allow(at(now), "k", Critical); ok {
				admitted++
			}
		}
		want := int(10*time.Second/l.Interval()) + 10 // the interval is rounded to the nanosecond
		if admitted < want-1 || admitted > want {
			t.Errorf("rate %v at 3× for 10 s: %d admitted, want %d (or one less: the last token may come after the last call)", rate, admitted, want)
		}
	}
}

// TestConcurrentDecisionsExact: goroutines deciding at one instant on one
// key admit exactly the burst, whatever the interleaving; and over keys.
func TestConcurrentDecisionsExact(t *testing.T) {
	l := mustNew(t, Config{Rate: 1, Burst: 100})
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				if ok, _ := l.Allow(t0, "k"+strconv.Itoa((g+i)%4), Critical); ok {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 400 {
		t.Fatalf("admitted %d over 4 keys with a burst of 100 each, want 400", got)
	}
}

func TestReserveAndCancel(t *testing.T) {
	l := mustNew(t, Config{Rate: 10, Burst: 1})
	if w, ok := l.Reserve(t0, "k", Critical, time.Second); !ok || w != 0 {
		t.Fatalf("Reserve on a full bucket = %v, %v; want 0, true", w, ok)
	}
	if w, ok := l.Reserve(t0, "k", Critical, 150*time.Millisecond); !ok || w != 100*time.Millisecond {
		t.Fatalf("Reserve within maxWait = %v, %v; want 100ms, true", w, ok)
	}
	if w, ok := l.Reserve(t0, "k", Critical, 150*time.Millisecond); ok || w != 200*time.Millisecond {
		t.Fatalf("Reserve past maxWait = %v, %v; want 200ms, false", w, ok)
	}
	l.Cancel(at(50*time.Millisecond), "k") // the second reservation gives up before its turn
	if ok, wait := l.Allow(at(100*time.Millisecond), "k", Critical); !ok {
		t.Fatalf("the cancelled reservation's token was not given back: refused, wait %v", wait)
	}
	if ok, _ := l.Allow(at(100*time.Millisecond), "k", Critical); ok {
		t.Fatal("Cancel gave back more than one token")
	}
	l.Cancel(at(time.Hour), "k") // a full bucket: nothing to give back
	for i := range 2 {
		ok, _ := l.Allow(at(time.Hour), "k", Critical)
		if ok != (i == 0) {
			t.Fatalf("after Cancel on a full bucket, call %d admitted %v: the burst grew", i, ok)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{Rate: 0, Burst: 1}, "Rate 0: must be a positive number"},
		{Config{Rate: -1, Burst: 1}, "Rate -1"},
		{Config{Rate: 1, Burst: 0}, "Burst 0: must be at least 1"},
		{Config{Rate: 1, Burst: 1, Per: -time.Second}, "Per -1s"},
		{Config{Rate: 1, Burst: 1, MaxKeys: -1}, "MaxKeys -1"},
		{Config{Rate: 3e9, Burst: 1}, "more than one call per nanosecond"},
		{Config{Rate: 1, Per: 1 << 62, Burst: 1 << 20}, "over 73 years"},
	}
	for _, tt := range tests {
		_, err := New(tt.cfg, t0)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", tt.cfg, err, tt.want)
		}
	}
}

func TestOutOfRangeCriticalityIsCritical(t *testing.T) {
	l := mustNew(t, Config{Rate: 10, Burst: 5})
	for i := range 5 {
		if ok, _ := l.Allow(t0, "k", Criticality(200)); !ok {
			t.Fatalf("call %d of criticality 200 refused within the burst: it must count as Critical", i)
		}
	}
}

func TestIntervalRounding(t *testing.T) {
	for _, tt := range []struct {
		rate float64
		want time.Duration
	}{{3, 333333333}, {1000, time.Millisecond}, {7e8, 1}} {
		if got := mustNew(t, Config{Rate: tt.rate, Burst: 1}).Interval(); got != tt.want {
			t.Errorf("Interval at %v/s = %v, want %v", tt.rate, got, tt.want)
		}
	}
}

func Example_keyName() {
	fmt.Println(MaxKeyLen)
	// Output: 256
}
