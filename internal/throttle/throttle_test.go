package throttle

import (
	"math"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func mustNew(t testing.TB, cfg Config) *Throttle {
	t.Helper()
	th, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v) = %v", cfg, err)
	}
	return th
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr bool
	}{
		{"A6 example", Config{MaxTokens: 10, TokenRatio: 0.1}, false},
		{"largest bucket", Config{MaxTokens: 1000, TokenRatio: 1}, false},
		{"smallest ratio", Config{MaxTokens: 10, TokenRatio: 0.001}, false},
		{"zero value", Config{}, true},
		{"maxTokens 0", Config{MaxTokens: 0, TokenRatio: 0.1}, true},
		{"maxTokens above 1000", Config{MaxTokens: 1000.5, TokenRatio: 0.1}, true},
		{"maxTokens below a milli-token is accepted", Config{MaxTokens: 0.0004, TokenRatio: 0.1}, false},
		{"maxTokens NaN", Config{MaxTokens: math.NaN(), TokenRatio: 0.1}, true},
		{"negative ratio", Config{MaxTokens: 10, TokenRatio: -0.1}, true},
		{"ratio below a milli-token is accepted", Config{MaxTokens: 10, TokenRatio: 0.0009}, false},
		{"ratio infinite", Config{MaxTokens: 10, TokenRatio: math.Inf(1)}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if (err != nil) != tt.wantErr {
				t.Errorf("New(%+v) error = %v, want error %v", tt.cfg, err, tt.wantErr)
			}
		})
	}
}

func TestMilli(t *testing.T) {
	tests := []struct {
		in   float64
		want int64
	}{
		{0.1, 100},
		{0.29, 290}, // 0.28999999999999998 as a float64
		{0.57, 570},
		{1.005, 1005}, // 1004.9999999999999 after × 1000
		{0.0019, 1},   // digits past the third decimal are ignored
		{0.0009, 0},
		{10, 10000},
		{1000, 1_000_000},
	}
	for _, tt := range tests {
		if got := milli(tt.in); got != tt.want {
			t.Errorf("milli(%v) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

type op int

const (
	fail    op = iota // OnFailure
	succeed           // OnSuccess
)

func (o op) String() string { return [...]string{"fail", "succeed"}[o] }

type step struct {
	op         op
	wantTokens float64
	wantAllow  bool // Allow() after the step; also OnFailure's result
}

func runTrace(t *testing.T, cfg Config, steps []step) {
	t.Helper()
	th := mustNew(t, cfg)
	if got := th.Tokens(); got != cfg.MaxTokens {
		t.Fatalf("Tokens() at start = %v, want %v", got, cfg.MaxTokens)
	}
	for i, s := range steps {
		switch s.op {
		case fail:
			if got := th.OnFailure(); got != s.wantAllow {
				t.Fatalf("step %d: OnFailure() = %v, want %v", i, got, s.wantAllow)
			}
		case succeed:
			th.OnSuccess()
		}
		if got := th.Tokens(); got != s.wantTokens {
			t.Fatalf("step %d (%v): Tokens() = %v, want %v", i, s.op, got, s.wantTokens)
		}
		if got := th.Allow(); got != s.wantAllow {
			t.Fatalf("step %d (%v): Allow() with %v tokens = %v, want %v", i, s.op, s.wantTokens, got, s.wantAllow)
		}
	}
}

// TestA6TokenTrace replays gRFC A6's arithmetic step by step for its own
// example, maxTokens 10 and tokenRatio 0.1: the count starts at 10, a failure
// takes 1 (not below 0), a success adds 0.1 (not above 10), and retries stop
// while the count is ≤ 5.
func TestA6TokenTrace(t *testing.T) {
	steps := []step{
		{fail, 9, true},
		{fail, 8, true},
		{fail, 7, true},
		{fail, 6, true},
		{fail, 5, false}, // 5 ≤ 10/2: throttled
		{succeed, 5.1, true},
		{fail, 4.1, false},
	}
	// Nine successes bring 4.1 back to exactly 5.0, still throttled.
	want := []float64{4.2, 4.3, 4.4, 4.5, 4.6, 4.7, 4.8, 4.9, 5}
	for _, w := range want {
		steps = append(steps, step{succeed, w, false})
	}
	steps = append(steps,
		step{succeed, 5.1, true}, // the tenth success pays for the failure
		step{fail, 4.1, false},
		step{fail, 3.1, false},
		step{fail, 2.1, false},
		step{fail, 1.1, false},
		step{fail, 0.1, false},
		step{fail, 0, false}, // never below 0
		step{fail, 0, false},
		step{succeed, 0.1, false},
	)
	// From 0.1, 99 more successes fill the bucket; more add nothing.
	for i := 2; i <= 100; i++ {
		steps = append(steps, step{succeed, float64(i) / 10, float64(i)/10 > 5})
	}
	steps = append(steps,
		step{succeed, 10, true}, // capped at maxTokens
		step{fail, 9, true},
	)
	runTrace(t, Config{MaxTokens: 10, TokenRatio: 0.1}, steps)
}

// TestThresholdIsExactWhereFloatDrifts pins the case of the doc comment:
// with tokenRatio 0.2, ten successes after the count fell to 3 give exactly
// 5, which throttles; float64 arithmetic would give 5.000000000000002.
func TestThresholdIsExactWhereFloatDrifts(t *testing.T) {
	steps := make([]step, 0, 18)
	for i := 9; i >= 3; i-- {
		steps = append(steps, step{fail, float64(i), i > 5})
	}
	for i := 1; i <= 10; i++ {
		tokens := float64(30+2*i) / 10
		steps = append(steps, step{succeed, tokens, tokens > 5})
	}
	runTrace(t, Config{MaxTokens: 10, TokenRatio: 0.2}, steps)

	f := 3.0
	for range 10 {
		f += 0.2
	}
	if f != 5.000000000000002 {
		t.Errorf("3 + ten times 0.2 in float64 = %v, want 5.000000000000002 as the doc comment says", f)
	}
}

func TestRatioDigitsPastTheThirdAreIgnored(t *testing.T) {
	th := mustNew(t, Config{MaxTokens: 10, TokenRatio: 0.1999})
	th.OnFailure()
	th.OnSuccess()
	if got := th.Tokens(); got != 9.199 {
		t.Errorf("Tokens() after a failure and a success with ratio 0.1999 = %v, want 9.199", got)
	}
}

// TestRatioUnderOneThousandthAddsOneThousandth pins what the throttle does
// with a positive TokenRatio under 0.001, which A6 and grpc-go accept: it
// adds 0.001 per success. Cut to 0 thousandths, it used to add nothing, so
// the bucket never refilled.
func TestRatioUnderOneThousandthAddsOneThousandth(t *testing.T) {
	for _, ratio := range []float64{0.0009, 1e-9} {
		th := mustNew(t, Config{MaxTokens: 10, TokenRatio: ratio})
		th.OnFailure()
		th.OnSuccess()
		if got := th.Tokens(); got != 9.001 {
			t.Errorf("Tokens() after a failure and a success with ratio %v = %v, want 9.001", ratio, got)
		}
	}
}

func TestOddMilliMaxThreshold(t *testing.T) {
	// maxTokens 0.003: the threshold is 0.0015, so 0.002 allows and 0.001 not.
	th := mustNew(t, Config{MaxTokens: 0.003, TokenRatio: 0.001})
	if !th.Allow() {
		t.Fatal("Allow() on a full bucket of 0.003 = false, want true")
	}
	th.OnFailure() // 0
	th.OnSuccess() // 0.001
	if th.Allow() {
		t.Errorf("Allow() at 0.001 of 0.003 = true, want false")
	}
	th.OnSuccess() // 0.002
	if !th.Allow() {
		t.Errorf("Allow() at 0.002 of 0.003 = false, want true")
	}
}

func TestConcurrentUpdatesAreNotLost(t *testing.T) {
	const goroutines, each = 8, 100
	th := mustNew(t, Config{MaxTokens: 1000, TokenRatio: 0.5})
	run := func(f func()) {
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				for range each {
					f()
				}
			})
		}
		wg.Wait()
	}
	run(func() { th.OnFailure() })
	if got := th.Tokens(); got != 1000-goroutines*each {
		t.Fatalf("Tokens() after %d concurrent failures = %v, want %v", goroutines*each, got, 1000-goroutines*each)
	}
	run(th.OnSuccess)
	if got, want := th.Tokens(), 1000-goroutines*each+0.5*goroutines*each; got != want {
		t.Fatalf("Tokens() after %d concurrent successes = %v, want %v", goroutines*each, got, want)
	}
}

func TestNoAllocations(t *testing.T) {
	th := mustNew(t, Config{MaxTokens: 10, TokenRatio: 0.1})
	if n := testing.AllocsPerRun(1000, func() {
		th.OnSuccess()
		_ = th.OnFailure()
		_ = th.Allow()
	}); n != 0 {
		t.Errorf("OnSuccess, OnFailure and Allow allocate %v times per run, want 0", n)
	}
}
