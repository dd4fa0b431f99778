package latency

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ms = time.Millisecond

func mustNew(t testing.TB, cfg Config) *Estimator {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v) = %v", cfg, err)
	}
	return e
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr bool
	}{
		{"defaults", DefaultConfig(), false},
		{"floor", Config{Quantile: 0.99, Gain: 1, Floor: ms}, false},
		{"zero value", Config{}, true},
		{"quantile 0", Config{Quantile: 0, Gain: 0.1}, true},
		{"quantile 1", Config{Quantile: 1, Gain: 0.1}, true},
		{"quantile NaN", Config{Quantile: math.NaN(), Gain: 0.1}, true},
		{"gain 0", Config{Quantile: 0.9, Gain: 0}, true},
		{"gain above 1", Config{Quantile: 0.9, Gain: 1.5}, true},
		{"gain NaN", Config{Quantile: 0.9, Gain: math.NaN()}, true},
		{"negative floor", Config{Quantile: 0.9, Gain: 0.1, Floor: -1}, true},
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

func TestEstimateWithoutObservationsIsTheFloor(t *testing.T) {
	for _, floor := range []time.Duration{0, 5 * ms} {
		cfg := DefaultConfig()
		cfg.Floor = floor
		if got := mustNew(t, cfg).Estimate(); got != floor {
			t.Errorf("Estimate() with floor %v and no observations = %v, want %v", floor, got, floor)
		}
	}
}

// TestObserveSteps pins the update rule of the doc comment, observation by
// observation: the first sets the estimate, one above multiplies it by
// e^(δp), one at or below by e^(−δ(1−p)).
func TestObserveSteps(t *testing.T) {
	up, down := math.Exp(0.1*0.9), math.Exp(-0.1*0.1)
	q0 := float64(10 * ms)
	steps := []struct {
		name    string
		observe time.Duration
		want    float64 // estimate in nanoseconds after the observation
	}{
		{"first observation sets the estimate", 10 * ms, q0},
		{"equal counts as below", 10 * ms, q0 * down},
		{"above", 20 * ms, q0 * down * up},
		{"far above moves one step only", time.Hour, q0 * down * up * up},
		{"below", 5 * ms, q0 * down * up * up * down},
		{"zero counts as below", 0, q0 * down * up * up * down * down},
		{"negative counts as below", -time.Second, q0 * down * up * up * down * down * down},
	}
	e := mustNew(t, DefaultConfig())
	for _, s := range steps {
		e.Observe(s.observe)
		if got, want := e.Estimate(), time.Duration(s.want); got != want {
			t.Fatalf("%s: after Observe(%v), Estimate() = %v, want %v", s.name, s.observe, got, want)
		}
	}
}

func TestEstimateNeverBelowFloor(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Floor = 3 * ms
	e := mustNew(t, cfg)
	e.Observe(ms)
	if got := e.Estimate(); got != 3*ms {
		t.Errorf("Estimate() after Observe(1ms) with floor 3ms = %v, want 3ms", got)
	}
	for range 100 {
		e.Observe(time.Second)
	}
	if got := e.Estimate(); got < 900*ms {
		t.Errorf("Estimate() after 100 × Observe(1s) = %v, want at least 900ms", got)
	}
}

// TestAdaptationSpeed pins the numbers of the doc comment: with the defaults
// the estimate doubles within 8 observations above it, grows tenfold within
// 26, and halves within 70 observations below it.
func TestAdaptationSpeed(t *testing.T) {
	tests := []struct {
		name    string
		start   time.Duration
		observe time.Duration
		crossed func(time.Duration) bool
		want    int // observations until crossed first holds
	}{
		{"doubles", ms, time.Hour, func(d time.Duration) bool { return d >= 2*ms }, 8},
		{"grows tenfold", ms, time.Hour, func(d time.Duration) bool { return d >= 10*ms }, 26},
		{"halves", 100 * ms, 1, func(d time.Duration) bool { return d <= 50*ms }, 70},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustNew(t, DefaultConfig())
			e.Observe(tt.start)
			n := 0
			for !tt.crossed(e.Estimate()) {
				e.Observe(tt.observe)
				n++
			}
			if n != tt.want {
				t.Errorf("from %v observing %v: crossed after %d observations, want %d", tt.start, tt.observe, n, tt.want)
			}
		})
	}
}

// TestConvergesToTheQuantile pins the steady state of the doc comment: a
// share 1 − p of the observations lies above the estimate, the estimate
// centres on the true p90, and its spread in log units is close to
// √(δ·p·(1−p) / (2·f)).
func TestConvergesToTheQuantile(t *testing.T) {
	const mean = 10 * ms
	tests := []struct {
		name   string
		sample func(r *rand.Rand) time.Duration
		p90    float64 // the true p90, ns
		f      float64 // density of ln x at the p90
	}{
		{
			name:   "exponential, mean 10ms",
			sample: func(r *rand.Rand) time.Duration { return time.Duration(r.ExpFloat64() * float64(mean)) },
			p90:    math.Ln10 * float64(mean), // F(x) = 1 − e^(−x/mean)
			f:      0.1 * math.Ln10,           // x·f(x) = (x/mean)·e^(−x/mean) at x/mean = ln 10
		},
		{
			name:   "uniform on [5ms, 15ms]",
			sample: func(r *rand.Rand) time.Duration { return 5*ms + time.Duration(r.Float64()*float64(10*ms)) },
			p90:    float64(14 * ms),
			f:      14.0 / 10, // x·f(x) = x / (b − a)
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			e := mustNew(t, DefaultConfig())
			for range 1000 {
				e.Observe(tt.sample(r))
			}
			const n = 200_000
			above := 0
			var sum, sum2 float64
			for range n {
				x := tt.sample(r)
				q := e.Estimate()
				if x > q {
					above++
				}
				l := math.Log(float64(q) / tt.p90)
				sum += l
				sum2 += l * l
				e.Observe(x)
			}
			share := float64(above) / n
			bias := sum / n
			spread := math.Sqrt(sum2/n - bias*bias)
			wantSpread := math.Sqrt(DefaultGain * 0.9 * 0.1 / (2 * tt.f))
			t.Logf("share above %.4f, mean log error %+.4f, spread %.4f (formula %.4f)", share, bias, spread, wantSpread)
			if math.Abs(share-0.1) > 0.005 {
				t.Errorf("share of observations above the estimate = %.4f, want 0.1 ± 0.005", share)
			}
			if math.Abs(bias) > 0.03 {
				t.Errorf("mean of ln(estimate / p90) = %.4f, want 0 ± 0.03", bias)
			}
			if math.Abs(spread-wantSpread) > 0.25*wantSpread {
				t.Errorf("spread of ln(estimate) = %.4f, want %.4f ± 25%%", spread, wantSpread)
			}
		})
	}
}

func TestExtremesDoNotOverflow(t *testing.T) {
	e := mustNew(t, DefaultConfig())
	for range 1000 {
		e.Observe(math.MaxInt64)
	}
	if got := e.Estimate(); got != 1<<62 {
		t.Errorf("Estimate() after huge observations = %v, want the cap 2^62 ns", got)
	}
	for range 100_000 {
		e.Observe(0)
	}
	if got := e.Estimate(); got != 1 {
		t.Errorf("Estimate() after many zero observations = %v, want 1ns", got)
	}
}

func TestConcurrentObserve(t *testing.T) {
	e := mustNew(t, DefaultConfig())
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				e.Observe(time.Duration(1+(g+i)%10) * ms)
				_ = e.Estimate()
			}
		})
	}
	wg.Wait()
	if got := e.Estimate(); got < ms || got > 10*ms*2 {
		t.Errorf("Estimate() after concurrent observations in [1ms, 10ms] = %v, want within [1ms, 20ms]", got)
	}
}

func TestNoAllocations(t *testing.T) {
	e := mustNew(t, DefaultConfig())
	if n := testing.AllocsPerRun(1000, func() {
		e.Observe(5 * ms)
		_ = e.Estimate()
	}); n != 0 {
		t.Errorf("Observe and Estimate allocate %v times per run, want 0", n)
	}
}
