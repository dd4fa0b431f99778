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
	var slots []Slot
	fill := func(c Criticality) int {
		n := 0
		for {
			s, v, _ := l.Acquire(t0, Request{Crit: c, Left: NoDeadline})
			if v != Admitted {
				return n
			}
			slots = append(slots, s)
			n++
		}
	}
	for _, tt := range []struct {
		c    Criticality
		want int // in flight after filling
	}{{Sheddable, 10}, {SheddablePlus, 15}, {Critical, 18}, {CriticalPlus, 20}} {
		fill(tt.c)
		if got := l.Snapshot(t0).InFlight; got != tt.want {
			t.Errorf("after filling criticality %d: in flight %d, want %d", tt.c, got, tt.want)
		}
	}
	s := l.Snapshot(t0)
	for c := range NumCriticalities {
		if s.Count[ShedLimit][c] != 1 {
			t.Errorf("Count[ShedLimit][%d] = %d, want 1", c, s.Count[ShedLimit][c])
		}
	}
	if n := s.Count[Admitted][Sheddable] + s.Count[Admitted][SheddablePlus] + s.Count[Admitted][Critical] + s.Count[Admitted][CriticalPlus]; n != 20 {
		t.Errorf("admitted = %d, want 20", n)
	}
	for _, sl := range slots {
		l.Abandon(t0, sl)
	}
	if got := l.Snapshot(t0).InFlight; got != 0 {
		t.Errorf("in flight after releases = %d, want 0", got)
	}
}

// releaseAt admits inflight requests and releases two with rtt, the
// second after the window of the first has ended, reporting the limit
// after that one update.
func releaseAt(l *Limiter, inflight int, rtt time.Duration, dropped bool) int {
	slots := make([]Slot, inflight)
	for i := range slots {
		slots[i], _, _ = l.Acquire(t0, Request{Crit: CriticalPlus, Left: NoDeadline})
	}
	o := Completed
	if dropped {
		o = DeadlineEnded
	}
	l.Release(t0, slots[0], rtt, o)
	l.Release(t0.Add(time.Hour), slots[1], rtt, o)
	for _, s := range slots[2:] {
		l.Abandon(t0, s)
	}
	return l.Snapshot(t0).Limit
}

// pinBase makes l's base RTT b for the whole of a test: a long window
// holding b alone.
func pinBase(l *Limiter, b time.Duration) {
	l.cfg.BaseWindow = 1000 * time.Hour
	l.cls[0].base.reset(t0, l.cfg.BaseWindow, b)
	l.srtt = float64(time.Microsecond) // the window of an update ends at once
	l.cfg.ProbeMultiplier, l.cls[0].probeAt = 1000, 1000
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
			pinBase(l, 100*time.Millisecond)
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
			pinBase(l, 100*time.Millisecond)
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
	if got := l.Snapshot(t0).Limit; got != 6 {
		t.Errorf("limit after growth = %d, want MaxLimit 6", got)
	}
	for range 10 {
		releaseAt(l, 5, time.Millisecond, true)
	}
	if got := l.Snapshot(t0).Limit; got != 4 {
		t.Errorf("limit after drops = %d, want MinLimit 4", got)
	}
}

// complete admits one request at now and releases it completed after rtt.
func complete(l *Limiter, now time.Time, rtt time.Duration) {
	s, v, _ := l.Acquire(now, Request{Crit: CriticalPlus, Left: NoDeadline})
	if v != Admitted {
		panic("complete: not admitted")
	}
	l.Release(now, s, rtt, Completed)
}

// TestBaseRTTWindows pins the base RTT as the minimum of the last two
// windows (while they hold fewer than 16 samples), aging with time: a whole
// window without a sample forgets the previous one, two forget both.
func TestBaseRTTWindows(t *testing.T) {
	l := mustNew(t, Config{BaseWindow: 10 * time.Second, ProbeMultiplier: 1000})
	steps := []struct {
		at, rtt, want time.Duration // rtt 0: no sample, only a read
	}{
		{0, 50 * time.Millisecond, 50 * time.Millisecond},
		{time.Second, 80 * time.Millisecond, 50 * time.Millisecond},
		{10 * time.Second, 90 * time.Millisecond, 50 * time.Millisecond},   // second window: min of both
		{20 * time.Second, 100 * time.Millisecond, 90 * time.Millisecond},  // first window forgotten
		{45 * time.Second, 120 * time.Millisecond, 120 * time.Millisecond}, // a whole empty window
		{55*time.Second - 1, 0, 120 * time.Millisecond},                    // still the current window
		{55 * time.Second, 0, 120 * time.Millisecond},                      // the previous window now
		{65*time.Second - 1, 0, 120 * time.Millisecond},                    //
		{65 * time.Second, 0, 0},                                           // aged out with no sample
	}
	for _, s := range steps {
		now := t0.Add(s.at)
		if s.rtt > 0 {
			complete(l, now, s.rtt)
		}
		if got := l.BaseRTT(now); got != s.want {
			t.Errorf("at %v after %v: BaseRTT = %v, want %v", s.at, s.rtt, got, s.want)
		}
	}
}

// TestBaseRTTRobust pins the estimate of the base RTT: the least latency
// of the last two windows that is at least a tenth of their 5th smallest
// (with fewer than 5, their largest).
func TestBaseRTTRobust(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name string
		rtts []time.Duration
		want time.Duration
	}{
		{"one sample", []time.Duration{100 * ms}, 100 * ms},
		{"4 samples: against the largest", []time.Duration{1 * ms, 100 * ms, 100 * ms, 100 * ms}, 100 * ms},
		{"3 samples within a tenth of the largest: the least", []time.Duration{60 * ms, 100 * ms, 80 * ms}, 60 * ms},
		{"1 outlier in 5", []time.Duration{1 * ms, 100 * ms, 100 * ms, 100 * ms, 100 * ms}, 100 * ms},
		{"4 outliers in 1000", append(slices.Repeat([]time.Duration{ms}, 4), slices.Repeat([]time.Duration{100 * ms}, 996)...), 100 * ms},
		{"5 fast ones are no outliers", append(slices.Repeat([]time.Duration{ms}, 5), slices.Repeat([]time.Duration{100 * ms}, 995)...), 1 * ms},
		{"queued latencies: the least", []time.Duration{80 * ms, 60 * ms, 70 * ms, 90 * ms, 65 * ms, 75 * ms}, 60 * ms},
		{"a tenth of the 5th is no outlier", []time.Duration{10 * ms, 100 * ms, 100 * ms, 100 * ms, 100 * ms}, 10 * ms},
		{"under a tenth is", []time.Duration{9 * ms, 100 * ms, 100 * ms, 100 * ms, 100 * ms}, 100 * ms},
		{"queued latencies after an unqueued one", []time.Duration{100 * ms, 201 * ms, 201 * ms}, 100 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := mustNew(t, Config{ProbeMultiplier: 1000, MaxLimit: 1000, InitialLimit: 1000})
			for _, rtt := range tt.rtts {
				complete(l, t0, rtt)
			}
			if got := l.BaseRTT(t0); got != tt.want {
				t.Errorf("BaseRTT = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestPushbackFormula pins pushback = s·(1 + x/(1−x)), s being
// InitialServiceTime before the first sample, rounded up to the grid (the
// millisecond up to 10ms, then the E12 series), and NoRetry from x = 1/2.
func TestPushbackFormula(t *testing.T) {
	ms := float64(time.Millisecond)
	tests := []struct {
		srtt float64
		x    float64
		want time.Duration
	}{
		{0, 0, 100 * time.Millisecond}, // no sample yet: InitialServiceTime
		{100 * ms, 0, 100 * time.Millisecond},
		{100 * ms, 1.0 / 3, 150 * time.Millisecond},
		{100 * ms, 0.2, 150 * time.Millisecond},    // 125ms, up to the step of 150
		{100 * ms, 0.4999, 220 * time.Millisecond}, // 199.98ms, up to 220
		{100 * ms, 0.5, NoRetry},
		{100 * ms, 0.9, NoRetry},
		{1.5 * ms, 0, 2 * time.Millisecond},
		{0.001 * ms, 0, time.Millisecond}, // at least 1ms
		{9.5 * ms, 0, 10 * time.Millisecond},
		{10.5 * ms, 0, 12 * time.Millisecond},
		{47 * ms, 0, 47 * time.Millisecond},
		{47.001 * ms, 0, 56 * time.Millisecond},
		{float64(59 * time.Minute), 0, 3900 * time.Second},     // 3.54e6ms: up to 3.9e6
		{float64(10000 * time.Second), 0, 10000 * time.Second}, // the last step
		{float64(3 * time.Hour), 0, 3 * time.Hour},             // beyond the grid: the millisecond
	}
	for _, tt := range tests {
		l := mustNew(t, Config{})
		l.srtt, l.shedEW = tt.srtt, tt.x
		got := l.pushbackLocked()
		if got != tt.want {
			t.Errorf("pushback(s=%v, x=%v) = %v, want %v", time.Duration(tt.srtt), tt.x, got, tt.want)
		}
		if step := PushbackStep(got); (step >= 0) != (got > 0 && got <= 10000*time.Second) {
			t.Errorf("PushbackStep(%v) = %d", got, step)
		}
	}
}

// TestPushbackGrid pins the grid: steps at most 25% apart, PushbackStep
// the index of each.
func TestPushbackGrid(t *testing.T) {
	for i, v := range grid {
		d := time.Duration(v) * time.Millisecond
		if got := PushbackStep(d); got != i {
			t.Errorf("PushbackStep(%v) = %d, want %d", d, got, i)
		}
		if i > 0 && float64(v) > 1.25*float64(grid[i-1]) && v > 10 {
			t.Errorf("step %v is more than 25%% above %v", v, grid[i-1])
		}
	}
	if PushbackSteps != 82 || grid[PushbackSteps-1] != 10_000_000 {
		t.Errorf("grid has %d steps up to %dms, want 82 up to 10,000s", PushbackSteps, grid[PushbackSteps-1])
	}
	for _, d := range []time.Duration{NoRetry, 0, 11 * time.Millisecond, 1500 * time.Microsecond, 3 * time.Hour} {
		if got := PushbackStep(d); got != -1 {
			t.Errorf("PushbackStep(%v) = %d, want -1", d, got)
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
	type req struct {
		start, done time.Time
		slot        Slot
	}
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
			l.Release(r.done, r.slot, r.done.Sub(r.start), Completed)
			if i > from {
				maxLat = max(maxLat, r.done.Sub(r.start))
			}
		}
		slot, v, _ := l.Acquire(now, Request{Left: NoDeadline})
		if v != Admitted {
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
		r := req{now, done, slot}
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
		t.Errorf("utilization of the last 3s = %.3f, want ≥ 0.95 (limit %d)", util, l.Snapshot(t0).Limit)
	}
	if maxLat > 2*svc {
		t.Errorf("max latency of admitted requests = %v, want ≤ %v (limit %d)", maxLat, 2*svc, l.Snapshot(t0).Limit)
	}
	t.Logf("limit %d, max latency %v, snapshot %+v", l.Snapshot(t0).Limit, maxLat, l.Snapshot(t0))
}

// TestAcquireReleaseAllocatesNothing: Acquire and Release of a limit
// allocate nothing, with or without a tenant. Its name has "Allocat", so
// that CI's allocation step (without -race) runs it too.
func TestAcquireReleaseAllocatesNothing(t *testing.T) {
	l := mustNew(t, Config{})
	now := t0
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond)
		if s, v, _ := l.Acquire(now, Request{Left: time.Second}); v == Admitted {
			l.Release(now, s, time.Millisecond, Completed)
		}
	})
	if allocs != 0 {
		t.Errorf("Acquire+Release allocs = %v, want 0", allocs)
	}
	// With tenants: a named tenant seen again allocates nothing either.
	allocs = testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond)
		if s, v, _ := l.Acquire(now, Request{Left: time.Second, Tenant: "a"}); v == Admitted {
			l.Release(now, s, time.Millisecond, Completed)
		}
	})
	if allocs != 0 {
		t.Errorf("Acquire+Release allocs with a tenant = %v, want 0", allocs)
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
				now := t0.Add(time.Duration(i) * ms)
				complete(l, now, s.rtt)
				if got := l.Snapshot(now); got.BaseRTT != s.base || got.Probes != s.probes {
					t.Fatalf("sample %d (%v): base %v, probes %d; want %v, %d", i+1, s.rtt, got.BaseRTT, got.Probes, s.base, s.probes)
				}
			}
		})
	}
}

// TestVegasProbeSkipsOutliers: a probe that falls on a latency under a
// tenth of the base RTT (a cheap call next to a 100ms service) waits for
// the next latency that is not one, so the base never becomes the cheap
// call's. Before, the base was 1µs after the probe until four more
// latencies came (interceptor/server's TestLimitFastFailuresDoNotPoisonTheBase
// saw it once in about 60 runs).
func TestVegasProbeSkipsOutliers(t *testing.T) {
	ms := time.Millisecond
	l := mustNew(t, Config{InitialLimit: 10, MinLimit: 10, MaxLimit: 10, ProbeMultiplier: 2,
		Rand: func() float64 { return 0 }})
	steps := []struct {
		rtt, base time.Duration
		probes    uint64
	}{
		{100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0},
		{100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0},
		{100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0}, {100 * ms, 100 * ms, 0},
		{time.Microsecond, 100 * ms, 0}, // the 10th would probe: an outlier, no probe
		{9 * ms, 100 * ms, 0},           // still under a tenth
		{120 * ms, 120 * ms, 1},         // the probe, on the next latency that counts
		{12 * ms, 12 * ms, 1},           // a tenth of the largest is no outlier: folded in
	}
	for i, s := range steps {
		now := t0.Add(time.Duration(i) * ms)
		complete(l, now, s.rtt)
		if got := l.Snapshot(now); got.BaseRTT != s.base || got.Probes != s.probes {
			t.Fatalf("sample %d (%v): base %v, probes %d; want %v, %d", i+1, s.rtt, got.BaseRTT, got.Probes, s.base, s.probes)
		}
	}
}

// TestVegasProbeResumesWhenTheServiceGetsFaster (REVIEW class 1): the
// probe skips latencies under a tenth of the base, so a service that
// becomes 20 times faster must not silence it for good: its latencies fold
// into the base as the minimum once five of them agree (they are no
// outliers of each other), and the next probe comes on schedule.
func TestVegasProbeResumesWhenTheServiceGetsFaster(t *testing.T) {
	l := mustNew(t, Config{InitialLimit: 10, MinLimit: 10, MaxLimit: 10, ProbeMultiplier: 2,
		Rand: func() float64 { return 0 }})
	i := 0
	sample := func(rtt time.Duration) Snapshot {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		i++
		complete(l, now, rtt)
		return l.Snapshot(now)
	}
	for range 5 {
		sample(100 * time.Millisecond)
	}
	var got Snapshot
	for range 25 { // 5ms: 20 times faster
		got = sample(5 * time.Millisecond)
	}
	if got.BaseRTT != 5*time.Millisecond || got.Probes == 0 {
		t.Fatalf("after 25 samples of 5ms: base %v, probes %d; want 5ms and a probe", got.BaseRTT, got.Probes)
	}
}

// TestAIMDDoesNotProbe: the probe is Vegas's; AIMD keeps the windowed
// minimum.
func TestAIMDDoesNotProbe(t *testing.T) {
	l := mustNew(t, Config{Algorithm: AIMD, InitialLimit: 1, MinLimit: 1, MaxLimit: 1, ProbeMultiplier: 1,
		Rand: func() float64 { return 0 }})
	for i := range 10 {
		complete(l, t0.Add(time.Duration(i)*time.Millisecond), time.Duration(10+i)*time.Millisecond)
	}
	if s := l.Snapshot(t0); s.BaseRTT != 10*time.Millisecond || s.Probes != 0 {
		t.Errorf("AIMD: base %v, probes %d; want 10ms, 0", s.BaseRTT, s.Probes)
	}
}

// TestVegasLearnsSlowdown simulates a server far from its capacity (an
// open load of 80 requests/s, each running its service time) whose service
// time doubles from 100ms to 200ms at 10s. With the probe, or without it
// (a probe every 10,000 samples: none in this run) through the slowdown
// detector once the falling limit sheds, within 3s of the slowdown the
// limit is back to 80% of its value before it and stays there, and at most
// 5% of the requests after the slowdown are shed. (Before the detector,
// without the probe the limit fell and shed a quarter of the requests for
// the rest of the run.)
func TestVegasLearnsSlowdown(t *testing.T) {
	run := func(probe float64) (pre, last int, recovered time.Duration, shed float64) {
		l := mustNew(t, Config{ProbeMultiplier: probe, Rand: func() float64 { return 0.5 }})
		const gap, slow, end = 12500 * time.Microsecond, 10 * time.Second, 20 * time.Second
		var done []time.Time // completion times of the running requests, ascending
		var starts []time.Time
		var slots []Slot
		var after, afterShed int
		for at := time.Duration(0); at < end; at += gap {
			now := t0.Add(at)
			for len(done) > 0 && !done[0].After(now) {
				l.Release(done[0], slots[0], done[0].Sub(starts[0]), Completed)
				done, starts, slots = done[1:], starts[1:], slots[1:]
			}
			if at == slow {
				pre = l.Snapshot(now).Limit
			}
			slot, v, _ := l.Acquire(now, Request{Left: NoDeadline})
			lim := l.Snapshot(now).Limit
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
				done, starts, slots = append(done, now.Add(svc)), append(starts, now), append(slots, slot)
			}
		}
		return pre, l.Snapshot(t0.Add(end)).Limit, recovered, float64(afterShed) / float64(after)
	}
	for _, tt := range []struct {
		name  string
		probe float64
	}{{"without the probe", 1000}, {"with the probe", 0}} {
		pre, last, rec, shed := run(tt.probe)
		t.Logf("%s: limit %d before, %d at the end, below 80%% until %v after the slowdown, shed %.3f", tt.name, pre, last, rec, shed)
		if rec > 3*time.Second {
			t.Errorf("%s: the limit was below 80%% of %d until %v after the slowdown, want within 3s", tt.name, pre, rec)
		}
		if shed > 0.05 {
			t.Errorf("%s: shed %.3f of the requests after the slowdown, want ≤ 0.05", tt.name, shed)
		}
	}
}

// simulate offers load times the capacity of a server with n slots of svc
// each (a request waits for the earliest free slot) to l for secs seconds,
// open loop, and returns the utilization of the slots and the p99 latency
// of the requests admitted in the last 3s.
func simulate(l *Limiter, n int, svc time.Duration, load float64, secs int) (util float64, p99 time.Duration) {
	return simulateSlowdown(l, n, svc, svc, 0, load, secs)
}

// simulateSlowdown is simulate with a service time that becomes slow from
// the time at on, for good; load is in multiples of the capacity before.
func simulateSlowdown(l *Limiter, n int, svc, slow, at time.Duration, load float64, secs int) (util float64, p99 time.Duration) {
	type req struct {
		start, done time.Time
		slot        Slot
	}
	var running []req // in order of completion
	free := make([]time.Time, n)
	for i := range free {
		free[i] = t0
	}
	gap := time.Duration(float64(svc) / (load * float64(n)))
	end, from := t0.Add(time.Duration(secs)*time.Second), t0.Add(time.Duration(secs-3)*time.Second)
	var lats []time.Duration
	var busy time.Duration
	for now := t0; now.Before(end); now = now.Add(gap) {
		for len(running) > 0 && !running[0].done.After(now) {
			r := running[0]
			running = running[1:]
			l.Release(r.done, r.slot, r.done.Sub(r.start), Completed)
			if !r.start.Before(from) {
				lats = append(lats, r.done.Sub(r.start))
			}
		}
		slot, v, _ := l.Acquire(now, Request{Left: NoDeadline})
		if v != Admitted {
			continue
		}
		k := 0
		for j := range free {
			if free[j].Before(free[k]) {
				k = j
			}
		}
		start := now
		if free[k].After(now) {
			start = free[k]
		}
		took := svc
		if at > 0 && !start.Before(t0.Add(at)) {
			took = slow
		}
		done := start.Add(took)
		free[k] = done
		if !now.Before(from) {
			busy += took
		}
		j := len(running)
		for j > 0 && running[j-1].done.After(done) {
			j--
		}
		running = slices.Insert(running, j, req{now, done, slot})
	}
	slices.Sort(lats)
	return float64(busy) / float64(3*time.Second*time.Duration(n)), lats[len(lats)*99/100]
}

// TestNoRatchetUnderMildOverload: a server of 8 slots × 50ms at 1.2 and 1.5
// times its capacity for 30s. A probe under overload used to take a queued
// latency for the base RTT; at a mild overload the queue never drained, so
// each probe raised the base and the limit grew without bound (on main:
// limit 124, p99 732ms, 14.6 times the service time, at 1.2x). A probe
// while the limit sheds now drains first: the limit stays near the
// capacity, the slots stay busy.
func TestNoRatchetUnderMildOverload(t *testing.T) {
	for _, load := range []float64{1.2, 1.5} {
		l := mustNew(t, Config{Rand: func() float64 { return 0.25 }})
		util, p99 := simulate(l, 8, 50*time.Millisecond, load, 30)
		sn := l.Snapshot(t0.Add(30 * time.Second))
		t.Logf("at %.1fx: utilization %.3f, p99 %v, %+v", load, util, p99, sn)
		if util < 0.95 || p99 > 3*50*time.Millisecond || sn.Limit > 3*8 {
			t.Errorf("at %.1fx: utilization %.3f, p99 %v, limit %d; want ≥ 0.95, ≤ 150ms, ≤ 24", load, util, p99, sn.Limit)
		}
	}
}

// TestSlowdownDetector pins the detector's rule on windows of samples at a
// pinned base RTT of 100ms: the limit falling to 3/4 of its anchor while
// the latency stays within 10% is a slowdown (the base RTT takes the door's
// service time); the limit falling with the latency (a queue shortening) is
// not.
func TestSlowdownDetector(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name     string
		rtts     []time.Duration // one window each
		wantBase time.Duration
	}{
		{"latency stays: a slowdown", slices.Repeat([]time.Duration{200 * ms}, 16), 200 * ms},
		{"latency falls with the limit: a queue", []time.Duration{300 * ms, 260 * ms, 220 * ms, 190 * ms, 165 * ms, 140 * ms, 120 * ms, 105 * ms}, 100 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := mustNew(t, Config{InitialLimit: 40})
			pinBase(l, 100*ms)
			now := t0
			for _, rtt := range tt.rtts {
				now = now.Add(time.Second)
				l.srtt = 0                          // each release is a window
				slots := make([]Slot, int(l.limit)) // the limit in use
				for i := range slots {
					slots[i] = admit(t, l, Request{Crit: CriticalPlus, Left: NoDeadline})
				}
				l.Release(now, slots[0], rtt, Completed)
				for _, s := range slots[1:] {
					l.Abandon(now, s)
				}
			}
			if sn := l.Snapshot(now); sn.BaseRTT != tt.wantBase {
				t.Errorf("after the windows: %+v, want base %v", sn, tt.wantBase)
			}
		})
	}
}

// TestSlowdownDetectorAnchorsOnRise replays the onset of an overload as
// bench/overload saw it (limit and window latency per update): the limit
// grew while nothing queued, then the latency doubled with the queue and
// the limit fell. Anchored before the rise, the detector took the queued
// latency for a slowdown and made it the base RTT (86ms for a 50ms
// service); the anchor now moves with a latency that moves by more than
// 10%, so the base RTT holds.
func TestSlowdownDetectorAnchorsOnRise(t *testing.T) {
	ms := time.Millisecond
	l := mustNew(t, Config{})
	pinBase(l, 50*ms)
	l.cls[0].door.add(t0, 86*ms) // the least of the queued latencies
	for _, w := range []struct {
		limit float64
		rtt   time.Duration
	}{{20, 51 * ms}, {27.8, 51 * ms}, {29.25, 53 * ms}, {26, 117 * ms}, {23, 122 * ms}, {22, 111 * ms}, {20.8, 110 * ms}} {
		l.setLimit(w.limit)
		l.slowdownLocked(t0, float64(w.rtt)/float64(50*ms), int(w.limit))
	}
	if got := l.BaseRTT(t0); got != 50*ms {
		t.Errorf("base RTT = %v, want it held at 50ms", got)
	}
}

// TestDrainLearnsASlowdownWhileShedding pins the probe of a limit that
// sheds (issue 33, REVIEW class 1): a server of 8 slots whose service
// becomes three times slower for good (10ms, then 30ms) under twice its
// first capacity. AIMD does not probe, and its base RTT stayed at 10ms
// while every latency was 30ms or more: the limit fell to its minimum and
// stayed there while it shed (a state that only the traffic it refused
// could move), until the base's windows aged out a minute later, using
// one slot of 8. Now the limit drains to half of itself now and then while
// it sheds, so that a latency without a queue shows the new service time:
// the slots are busy again.
func TestDrainLearnsASlowdownWhileShedding(t *testing.T) {
	for _, alg := range []Algorithm{AIMD, Vegas} {
		l := mustNew(t, Config{Algorithm: alg, Rand: func() float64 { return 0.5 }})
		util, p99 := simulateSlowdown(l, 8, 10*time.Millisecond, 30*time.Millisecond, 5*time.Second, 2, 20)
		sn := l.Snapshot(t0.Add(20 * time.Second))
		t.Logf("algorithm %d: utilization of the last 3s %.3f, p99 %v, %+v", alg, util, p99, sn)
		if util < 0.9 || p99 > 3*30*time.Millisecond {
			t.Errorf("algorithm %d: utilization %.3f and p99 %v in the last 3s after the slowdown; want ≥ 0.9 and ≤ 90ms", alg, util, p99)
		}
	}
}
