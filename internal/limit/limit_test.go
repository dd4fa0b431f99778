package limit

import (
	"math"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustNew(t *testing.T, cfg Config) *Limiter {
	t.Helper()
	l, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return l
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero", Config{}, true},
		{"aimd", Config{Algorithm: AIMD, Backoff: 0.5, Tolerance: 1.5}, true},
		{"unknown algorithm", Config{Algorithm: 7}, false},
		{"negative", Config{MinLimit: -1}, false},
		{"min over max", Config{MinLimit: 10, MaxLimit: 5}, false},
		{"initial outside", Config{InitialLimit: 50, MaxLimit: 40}, false},
		{"default initial clamped", Config{MaxLimit: 5}, true},
		{"backoff 1", Config{Backoff: 1}, false},
		{"tolerance under 1", Config{Tolerance: 0.5}, false},
		{"negative window", Config{BaseWindow: -time.Second}, false},
		{"probe multiplier", Config{ProbeMultiplier: 30}, true},
		{"probe multiplier under 1", Config{ProbeMultiplier: 0.5}, false},
		{"probe multiplier NaN", Config{ProbeMultiplier: math.NaN()}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cfg.Validate(); (err == nil) != tt.ok {
				t.Errorf("Validate(%+v) = %v, want ok %v", tt.cfg, err, tt.ok)
			}
		})
	}
}

// TestSharesShedLowestFirst pins the shares of the package doc at a limit
// of 20: Sheddable stops at 10 in flight, SheddablePlus at 15, Critical at
// 18, CriticalPlus at 20.
func TestSharesShedLowestFirst(t *testing.T) {
	l := mustNew(t, Config{InitialLimit: 20})
	fill := func(c Criticality) int {
		n := 0
		for {
			v, _ := l.Acquire(c, NoDeadline)
			if v != Admitted {
				return n
			}
			n++
		}
	}
	for _, tt := range []struct {
		c    Criticality
		want int // in flight after filling
	}{{Sheddable, 10}, {SheddablePlus, 15}, {Critical, 18}, {CriticalPlus, 20}} {
		fill(tt.c)
		if got := l.Snapshot().InFlight; got != tt.want {
			t.Errorf("after filling criticality %d: in flight %d, want %d", tt.c, got, tt.want)
		}
	}
	s := l.Snapshot()
	for c := range NumCriticalities {
		if s.Count[ShedLimit][c] != 1 {
			t.Errorf("Count[ShedLimit][%d] = %d, want 1", c, s.Count[ShedLimit][c])
		}
	}
	if n := s.Count[Admitted][Sheddable] + s.Count[Admitted][SheddablePlus] + s.Count[Admitted][Critical] + s.Count[Admitted][CriticalPlus]; n != 20 {
		t.Errorf("admitted = %d, want 20", n)
	}
	for range 20 {
		l.Abandon()
	}
	if got := l.Snapshot().InFlight; got != 0 {
		t.Errorf("in flight after releases = %d, want 0", got)
	}
}

// releaseAt admits inflight requests and releases two with rtt, the
// second after the window of the first has ended, reporting the limit
// after that one update.
func releaseAt(l *Limiter, inflight int, rtt time.Duration, dropped bool) int {
	for range inflight {
		l.Acquire(CriticalPlus, NoDeadline)
	}
	l.Release(t0, rtt, dropped)
	l.Release(t0.Add(time.Hour), rtt, dropped)
	for range inflight - 2 {
		l.Abandon()
	}
	return l.Snapshot().Limit
}

// TestVegasSteps pins the four cases of the Vegas update at L = 100
// (log10 = 2, α = 6, β = 12) with a base RTT of 100ms.
func TestVegasSteps(t *testing.T) {
	tests := []struct {
		name     string
		inflight int
		rtt      time.Duration
		dropped  bool
		want     int
	}{
		{"no queue grows by beta", 100, 100 * time.Millisecond, false, 112},
		{"queue 5 under alpha grows by log", 100, 105263 * time.Microsecond, false, 102}, // 100·(1−100/105.263) = 4.99
		{"queue 10 within alpha..beta holds", 100, 111112 * time.Microsecond, false, 100},
		{"queue 50 over beta shrinks by log", 100, 200 * time.Millisecond, false, 98},
		{"dropped shrinks by log", 100, 100 * time.Millisecond, true, 98},
		{"application-limited holds", 49, 100 * time.Millisecond, false, 100},
		{"application-limited still shrinks", 49, 200 * time.Millisecond, false, 98},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := mustNew(t, Config{InitialLimit: 100})
			l.base[1] = 100 * time.Millisecond
			l.baseEnd = t0.Add(1000 * time.Hour)
			if got := releaseAt(l, tt.inflight, tt.rtt, tt.dropped); got != tt.want {
				t.Errorf("limit after rtt %v with %d in flight = %d, want %d", tt.rtt, tt.inflight, got, tt.want)
			}
		})
	}
}

func TestAIMDSteps(t *testing.T) {
	tests := []struct {
		name     string
		inflight int
		rtt      time.Duration
		dropped  bool
		want     int
	}{
		{"fast adds one", 100, 150 * time.Millisecond, false, 101},
		{"slow multiplies", 100, 201 * time.Millisecond, false, 90},
		{"dropped multiplies", 100, 100 * time.Millisecond, true, 90},
		{"application-limited holds", 40, 100 * time.Millisecond, false, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := mustNew(t, Config{Algorithm: AIMD, InitialLimit: 100})
			l.base[1] = 100 * time.Millisecond
			l.baseEnd = t0.Add(1000 * time.Hour)
			if got := releaseAt(l, tt.inflight, tt.rtt, tt.dropped); got != tt.want {
				t.Errorf("limit = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestLimitBounds(t *testing.T) {
	l := mustNew(t, Config{InitialLimit: 5, MinLimit: 4, MaxLimit: 6})
	for range 10 {
		releaseAt(l, 5, time.Millisecond, false)
	}
	if got := l.Snapshot().Limit; got != 6 {
		t.Errorf("limit after growth = %d, want MaxLimit 6", got)
	}
	for range 10 {
		releaseAt(l, 5, time.Millisecond, true)
	}
	if got := l.Snapshot().Limit; got != 4 {
		t.Errorf("limit after drops = %d, want MinLimit 4", got)
	}
}

// TestBaseRTTWindows pins the base RTT as the minimum of the last two
// windows.
func TestBaseRTTWindows(t *testing.T) {
	l := mustNew(t, Config{BaseWindow: 10 * time.Second})
	obs := func(at time.Duration, rtt time.Duration) time.Duration {
		l.Acquire(CriticalPlus, NoDeadline)
		l.Release(t0.Add(at), rtt, false)
		return l.BaseRTT()
	}
	steps := []struct {
		at, rtt, want time.Duration
	}{
		{0, 50 * time.Millisecond, 50 * time.Millisecond},
		{time.Second, 80 * time.Millisecond, 50 * time.Millisecond},
		{10 * time.Second, 90 * time.Millisecond, 50 * time.Millisecond},   // second window: min of both
		{20 * time.Second, 100 * time.Millisecond, 90 * time.Millisecond},  // first window forgotten
		{45 * time.Second, 120 * time.Millisecond, 120 * time.Millisecond}, // a whole empty window
	}
	for _, s := range steps {
		if got := obs(s.at, s.rtt); got != s.want {
			t.Errorf("at %v after %v: BaseRTT = %v, want %v", s.at, s.rtt, got, s.want)
		}
	}
}

// TestPushbackFormula pins pushback = s·(1 + x/(1−x)), rounded up to the
// millisecond, at least 1ms, and NoRetry from x = 1/2.
func TestPushbackFormula(t *testing.T) {
	tests := []struct {
		srtt float64
		x    float64
		want time.Duration
	}{
		{0, 0, time.Millisecond},
		{float64(100 * time.Millisecond), 0, 100 * time.Millisecond},
		{float64(100 * time.Millisecond), 1.0 / 3, 150 * time.Millisecond},
		{float64(100 * time.Millisecond), 0.2, 125 * time.Millisecond},
		{float64(100 * time.Millisecond), 0.4999, 200 * time.Millisecond}, // 199.98ms rounded up
		{float64(100 * time.Millisecond), 0.5, NoRetry},
		{float64(100 * time.Millisecond), 0.9, NoRetry},
		{float64(1500 * time.Microsecond), 0, 2 * time.Millisecond},
	}
	for _, tt := range tests {
		l := mustNew(t, Config{})
		l.srtt, l.shedEW = tt.srtt, tt.x
		if got := l.pushbackLocked(); got != tt.want {
			t.Errorf("pushback(s=%v, x=%v) = %v, want %v", time.Duration(tt.srtt), tt.x, got, tt.want)
		}
	}
}

// TestConvergesOnFixedCapacity runs a discrete simulation of a server with
// n slots and a fixed service time under three times its capacity: the
// Vegas limit settles where it keeps every slot busy with a short queue.
// Over 60s the probes (each of which takes a queued sample for the base
// RTT) do not ratchet the limit up: the queue stays as short in the last 3s.
func TestConvergesOnFixedCapacity(t *testing.T) {
	for _, secs := range []int{5, 60} {
		t.Run(time.Duration(secs*int(time.Second)).String(), func(t *testing.T) {
			convergeOnFixedCapacity(t, secs)
		})
	}
}

func convergeOnFixedCapacity(t *testing.T, secs int) {
	const n, svc = 20, 100 * time.Millisecond
	l := mustNew(t, Config{Rand: func() float64 { return 0.25 }})
	from := 3 * n * 10 * (secs - 3) // the first arrival of the last 3s
	type req struct{ start, done time.Time }
	var running []req // admitted, in order of completion
	var slotsFree []time.Time
	for range n {
		slotsFree = append(slotsFree, t0)
	}
	gap := svc / (3 * n)
	busy, total := time.Duration(0), time.Duration(0)
	var maxLat time.Duration
	for i := range 3 * n * 10 * secs {
		now := t0.Add(time.Duration(i) * gap)
		for len(running) > 0 && !running[0].done.After(now) {
			r := running[0]
			running = running[1:]
			l.Release(r.done, r.done.Sub(r.start), false)
			if i > from {
				maxLat = max(maxLat, r.done.Sub(r.start))
			}
		}
		if v, _ := l.Acquire(Critical, NoDeadline); v != Admitted {
			continue
		}
		// the earliest free slot serves it
		k := 0
		for j := range slotsFree {
			if slotsFree[j].Before(slotsFree[k]) {
				k = j
			}
		}
		start := now
		if slotsFree[k].After(now) {
			start = slotsFree[k]
		}
		done := start.Add(svc)
		slotsFree[k] = done
		if i > from {
			busy += svc
		}
		r := req{now, done}
		j := len(running)
		for j > 0 && running[j-1].done.After(done) {
			j--
		}
		running = append(running, req{})
		copy(running[j+1:], running[j:])
		running[j] = r
	}
	total = time.Duration(3*n*30) * gap * n
	if util := float64(busy) / float64(total); util < 0.95 {
		t.Errorf("utilization of the last 3s = %.3f, want ≥ 0.95 (limit %d)", util, l.Snapshot().Limit)
	}
	if maxLat > 2*svc {
		t.Errorf("max latency of admitted requests = %v, want ≤ %v (limit %d)", maxLat, 2*svc, l.Snapshot().Limit)
	}
	t.Logf("limit %d, max latency %v, snapshot %+v", l.Snapshot().Limit, maxLat, l.Snapshot())
}

func TestAcquireReleaseAllocs(t *testing.T) {
	l := mustNew(t, Config{})
	allocs := testing.AllocsPerRun(1000, func() {
		if v, _ := l.Acquire(Critical, time.Second); v == Admitted {
			l.Release(t0, time.Millisecond, false)
		}
	})
	if allocs != 0 {
		t.Errorf("Acquire+Release allocs = %v, want 0", allocs)
	}
}

// TestShedDeadline pins the door: a request with less left than the base
// RTT is shed without pushback; one with exactly the base RTT runs.
func TestShedDeadline(t *testing.T) {
	l := mustNew(t, Config{})
	if v, _ := l.Acquire(Critical, 0); v != Admitted {
		t.Fatalf("before any sample, Acquire(left 0) = %v, want Admitted", v)
	}
	l.Release(t0, 100*time.Millisecond, false)
	tests := []struct {
		left time.Duration
		want Verdict
	}{
		{99 * time.Millisecond, ShedDeadline},
		{100 * time.Millisecond, Admitted},
		{NoDeadline, Admitted},
	}
	for _, tt := range tests {
		v, pb := l.Acquire(Sheddable, tt.left)
		if v != tt.want || pb != 0 {
			t.Errorf("Acquire(left %v) = %v, %v, want %v, 0", tt.left, v, pb, tt.want)
		}
		if v == Admitted {
			l.Abandon()
		}
	}
	if got := l.Snapshot().Count[ShedDeadline][Sheddable]; got != 1 {
		t.Errorf("Count[ShedDeadline][Sheddable] = %d, want 1", got)
	}
}

// TestReleasedWakes: the channel of Released closes at the next Release or
// Abandon, and a new one is made for the next waiter.
func TestReleasedWakes(t *testing.T) {
	l := mustNew(t, Config{})
	l.Acquire(Critical, NoDeadline)
	l.Acquire(Critical, NoDeadline)
	c := l.Released()
	if c != l.Released() {
		t.Fatalf("two waiters got different channels")
	}
	select {
	case <-c:
		t.Fatalf("closed before a release")
	default:
	}
	l.Release(t0, time.Millisecond, false)
	select {
	case <-c:
	default:
		t.Fatalf("not closed by Release")
	}
	c2 := l.Released()
	l.Abandon()
	select {
	case <-c2:
	default:
		t.Fatalf("not closed by Abandon")
	}
}

func TestTryAcquireCountsOnlyAdmissions(t *testing.T) {
	l := mustNew(t, Config{InitialLimit: 1, MinLimit: 1, MaxLimit: 1})
	if !l.TryAcquire(Critical) {
		t.Fatalf("TryAcquire on an empty limiter failed")
	}
	if l.TryAcquire(Critical) {
		t.Fatalf("TryAcquire over the limit succeeded")
	}
	s := l.Snapshot()
	if s.Count[Admitted][Critical] != 1 || s.Count[ShedLimit][Critical] != 0 || s.InFlight != 1 {
		t.Errorf("snapshot %+v, want 1 admitted, no shed", s)
	}
}

// TestVegasProbe pins the probe on a table of instants at a pinned limit of
// 10 and ProbeMultiplier 2: with a jitter draw of r the probe comes every
// 2·(½ + ½r)·10 samples, and its sample becomes the base RTT even when it
// is slower; the samples after it fold in as the minimum again.
func TestVegasProbe(t *testing.T) {
	ms := time.Millisecond
	type step struct {
		rtt, base time.Duration // the sample; the base RTT after it
		probes    uint64        // probes after it
	}
	tests := []struct {
		name  string
		draw  float64
		steps []step
	}{
		{"every 10 samples", 0, []step{
			{100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0},
			{100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0},
			{100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0},
			{200 * ms, 200 * ms, 1},                          // the 10th: the probe takes the slower sample
			{250 * ms, 200 * ms, 1}, {150 * ms, 150 * ms, 1}, // the minimum again
			{210 * ms, 150 * ms, 1}, {210 * ms, 150 * ms, 1}, {210 * ms, 150 * ms, 1},
			{210 * ms, 150 * ms, 1}, {210 * ms, 150 * ms, 1}, {210 * ms, 150 * ms, 1},
			{210 * ms, 150 * ms, 1}, {210 * ms, 210 * ms, 2}, // 10 samples later
		}},
		{"jitter stretches to 15", 0.5, []step{
			{100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0},
			{100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0},
			{100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0},
			{200 * ms, 100 * ms, 0}, {200 * ms, 100 * ms, 0}, {200 * ms, 100 * ms, 0},
			{200 * ms, 100 * ms, 0}, {200 * ms, 100 * ms, 0},
			{200 * ms, 200 * ms, 1}, // the 15th
		}},
		{"jitter near 1 stretches to 20", 0.999, append(slices.Repeat([]step{{100 * ms, 100 * ms, 0}}, 19),
			step{200 * ms, 200 * ms, 1})}, // the 20th: 2·(½ + ½·0.999)·10 = 19.99
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := mustNew(t, Config{InitialLimit: 10, MinLimit: 10, MaxLimit: 10, ProbeMultiplier: 2,
				Rand: func() float64 { return tt.draw }})
			for i, s := range tt.steps {
				l.Acquire(CriticalPlus, NoDeadline)
				l.Release(t0.Add(time.Duration(i)*ms), s.rtt, false)
				if got := l.Snapshot(); got.BaseRTT != s.base || got.Probes != s.probes {
					t.Fatalf("sample %d (%v): base %v, probes %d; want %v, %d", i+1, s.rtt, got.BaseRTT, got.Probes, s.base, s.probes)
				}
			}
		})
	}
}

// TestAIMDDoesNotProbe: the probe is Vegas's; AIMD keeps the windowed
// minimum.
func TestAIMDDoesNotProbe(t *testing.T) {
	l := mustNew(t, Config{Algorithm: AIMD, InitialLimit: 1, MinLimit: 1, MaxLimit: 1, ProbeMultiplier: 1,
		Rand: func() float64 { return 0 }})
	for i := range 10 {
		l.Acquire(CriticalPlus, NoDeadline)
		l.Release(t0.Add(time.Duration(i)*time.Millisecond), time.Duration(10+i)*time.Millisecond, false)
	}
	if s := l.Snapshot(); s.BaseRTT != 10*time.Millisecond || s.Probes != 0 {
		t.Errorf("AIMD: base %v, probes %d; want 10ms, 0", s.BaseRTT, s.Probes)
	}
}

// TestVegasLearnsSlowdown simulates a server far from its capacity (an
// open load of 80 requests/s, each running its service time) whose service
// time doubles from 100ms to 200ms at 10s. Without the probe (the base RTT
// held for two 30s windows) the limit falls and sheds a quarter of the
// requests for the rest of the run; with it, within 3s of the slowdown the
// limit is back to 80% of its value before it and stays there, and at most
// 5% of the requests after the slowdown are shed.
func TestVegasLearnsSlowdown(t *testing.T) {
	run := func(probe float64) (pre, last int, recovered time.Duration, shed float64) {
		l := mustNew(t, Config{ProbeMultiplier: probe, Rand: func() float64 { return 0.5 }})
		const gap, slow, end = 12500 * time.Microsecond, 10 * time.Second, 20 * time.Second
		var done []time.Time // completion times of the running requests, ascending
		var starts []time.Time
		var after, afterShed int
		for at := time.Duration(0); at < end; at += gap {
			now := t0.Add(at)
			for len(done) > 0 && !done[0].After(now) {
				l.Release(done[0], done[0].Sub(starts[0]), false)
				done, starts = done[1:], starts[1:]
			}
			if at == slow {
				pre = l.Snapshot().Limit
			}
			v, _ := l.Acquire(Critical, NoDeadline)
			lim := l.Snapshot().Limit
			if at >= slow {
				after++
				if v != Admitted {
					afterShed++
				}
				if 5*lim < 4*pre {
					recovered = at - slow + gap
				}
			}
			if v == Admitted {
				svc := 100 * time.Millisecond
				if at >= slow {
					svc *= 2
				}
				done, starts = append(done, now.Add(svc)), append(starts, now)
			}
		}
		return pre, l.Snapshot().Limit, recovered, float64(afterShed) / float64(after)
	}
	pre, last, rec, shed := run(1000) // a probe every 10,000 samples: none in this run
	t.Logf("without the probe: limit %d before, %d at the end, below 80%% until %v after the slowdown, shed %.3f", pre, last, rec, shed)
	if shed < 0.1 {
		t.Errorf("without the probe, shed %.3f after the slowdown; want the collapse this test guards against (≥ 0.1)", shed)
	}
	pre, last, rec, shed = run(0)
	t.Logf("with the probe: limit %d before, %d at the end, below 80%% until %v after the slowdown, shed %.3f", pre, last, rec, shed)
	if rec > 3*time.Second {
		t.Errorf("the limit was below 80%% of %d until %v after the slowdown, want within 3s", pre, rec)
	}
	if shed > 0.05 {
		t.Errorf("shed %.3f of the requests after the slowdown, want ≤ 0.05", shed)
	}
}
