package limit

import (
	"testing"
	"time"
)

// fixed returns a Limiter whose limit is n, with a queue of q.
func fixed(t *testing.T, n, q int) *Limiter {
	t.Helper()
	return mustNew(t, Config{InitialLimit: n, MinLimit: n, MaxLimit: n, MaxQueue: q})
}

// admit acquires a slot for r at t0 and fails t when it is not admitted.
func admit(t *testing.T, l *Limiter, r Request) Slot {
	t.Helper()
	s, v, _ := l.Acquire(t0, r)
	if v != Admitted {
		t.Fatalf("Acquire(%+v) = %v, want Admitted", r, v)
	}
	return s
}

// isReady reports whether w's wait is over, without blocking.
func isReady(w *Waiter) bool {
	select {
	case <-w.Ready():
		return true
	default:
		return false
	}
}

// TestShedDeadline pins the door: a request with less left than the door's
// service time is shed without pushback; one with exactly it runs.
func TestShedDeadline(t *testing.T) {
	l := mustNew(t, Config{})
	s, v, _ := l.Acquire(t0, Request{Crit: Critical, Left: 0})
	if v != Admitted {
		t.Fatalf("before any sample, Acquire(left 0) = %v, want Admitted", v)
	}
	l.Release(t0, s, 100*time.Millisecond, Completed)
	tests := []struct {
		left time.Duration
		want Verdict
	}{
		{99 * time.Millisecond, ShedDeadline},
		{100 * time.Millisecond, Admitted},
		{NoDeadline, Admitted},
	}
	for _, tt := range tests {
		s, v, pb := l.Acquire(t0, Request{Crit: Sheddable, Left: tt.left})
		if v != tt.want || pb != 0 {
			t.Errorf("Acquire(left %v) = %v, %v, want %v, 0", tt.left, v, pb, tt.want)
		}
		l.Abandon(t0, s)
	}
	if got := l.Snapshot(t0).Count[ShedDeadline][Sheddable]; got != 1 {
		t.Errorf("Count[ShedDeadline][Sheddable] = %d, want 1", got)
	}
}

// TestDoorAgesWithTime pins the door's staleness: without a new latency
// for 8 smoothed latencies, the door is open to every deadline (issue 19,
// defect 1: the door must never rest on a stale service time); the next
// latency closes it again, at the least of the last 32 to 64.
func TestDoorAgesWithTime(t *testing.T) {
	l := mustNew(t, Config{})
	ms := time.Millisecond
	for range 16 {
		s := admit(t, l, Request{Left: NoDeadline})
		l.Release(t0, s, 100*ms, Completed)
	}
	tests := []struct {
		at       time.Duration
		door     time.Duration
		admitted bool
	}{
		{0, 100 * ms, false},
		{798 * ms, 100 * ms, true}, // the door lets one through per service time (TestDoorLetsOneThrough)
		{799 * ms, 100 * ms, false},
		{800 * ms, 0, true}, // 8 smoothed latencies (100ms) without one: open
		{801 * ms, 0, true},
	}
	for _, tt := range tests {
		now := t0.Add(tt.at)
		if got := l.DoorRTT(now, 0); got != tt.door {
			t.Errorf("DoorRTT at %v = %v, want %v", tt.at, got, tt.door)
		}
		s, v, _ := l.Acquire(now, Request{Left: 50 * ms})
		if (v == Admitted) != tt.admitted {
			t.Errorf("at %v a request with 50ms left: %v, want admitted %v", tt.at, v, tt.admitted)
		}
		l.Abandon(now, s)
	}
	s := admit(t, l, Request{Left: NoDeadline})
	l.Release(t0.Add(time.Second), s, 5*ms, Completed)
	if got := l.DoorRTT(t0.Add(time.Second), 0); got != 5*ms {
		t.Errorf("after a 5ms latency: DoorRTT = %v, want 5ms", got)
	}
}

// TestDoorFollowsTheFastest pins the door's service time: the least of the
// last 32 to 64 latencies. A fast one lowers it at once, whatever the
// probes do to the base RTT; a lasting slowdown raises it once 32 to 64
// latencies are all slower (issue 19, defect 1: the door errs towards
// letting calls in).
func TestDoorFollowsTheFastest(t *testing.T) {
	l := mustNew(t, Config{InitialLimit: 10, MinLimit: 10, MaxLimit: 10, ProbeMultiplier: 2, Rand: func() float64 { return 0 }})
	ms := time.Millisecond
	sample := func(rtt time.Duration) {
		s := admit(t, l, Request{Left: NoDeadline})
		l.Release(t0, s, rtt, Completed)
	}
	steps := []struct {
		n         int
		rtt, door time.Duration
	}{
		{39, 100 * ms, 100 * ms}, // probes at 10, 20, 30
		{1, 5 * ms, 5 * ms},      // the 40th, a probe: the door takes it at once
		{24, 100 * ms, 5 * ms},   // 64: the block holding it is the previous one
		{31, 100 * ms, 5 * ms},   // 95
		{1, 100 * ms, 100 * ms},  // 96: it has left both blocks
	}
	for i, st := range steps {
		for range st.n {
			sample(st.rtt)
		}
		if got := l.DoorRTT(t0, 0); got != st.door {
			t.Errorf("step %d: DoorRTT = %v, want %v", i, got, st.door)
		}
	}
	if sn := l.Snapshot(t0); sn.Probes != 9 {
		t.Errorf("probes = %d, want 9", sn.Probes)
	}
}

// TestDoorLetsOneThrough: a door that refuses a deadline still lets one
// such request through every door service time, counted from the last
// one let through (the first sample at first), so that calls faster than
// those that completed can show it within about one service time (issue
// 19, defect 1; issue 33: every 8 door windows, 6.4s here, kept an idle
// door shut for 3.21s after the service was fast again).
func TestDoorLetsOneThrough(t *testing.T) {
	l := mustNew(t, Config{})
	ms := time.Millisecond
	s := admit(t, l, Request{Left: NoDeadline})
	l.Release(t0, s, 100*ms, Completed) // door 100ms: a pass every 100ms
	keep := func(at time.Duration) {    // keeps the door's windows fed
		s := admit(t, l, Request{Left: NoDeadline})
		l.Release(t0.Add(at), s, 100*ms, Completed)
	}
	tests := []struct {
		at   time.Duration
		want Verdict
	}{
		{0, ShedDeadline},
		{99 * ms, ShedDeadline},
		{100 * ms, Admitted}, // the pass
		{101 * ms, ShedDeadline},
		{199 * ms, ShedDeadline},
		{200 * ms, Admitted},
		{250 * ms, ShedDeadline},
	}
	for _, tt := range tests {
		keep(tt.at)
		s, v, _ := l.Acquire(t0.Add(tt.at), Request{Left: 10 * ms})
		if v != tt.want {
			t.Errorf("at %v: %v, want %v", tt.at, v, tt.want)
		}
		l.Abandon(t0.Add(tt.at), s)
	}
}

// TestOutcomes pins what each Outcome teaches: Completed is a sample,
// Ignored nothing, DeadlineEnded a drop only when the request had at least
// twice the base RTT left when admitted (issue 19, defects 2 and 3).
func TestOutcomes(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name      string
		left      time.Duration
		o         Outcome
		wantLimit int
		wantBase  time.Duration
	}{
		{"completed faster: a sample", NoDeadline, Completed, 100, 60 * ms},
		{"ignored: no sample", NoDeadline, Ignored, 100, 100 * ms},
		{"deadline of 2 base RTTs ended: a drop", 200 * ms, DeadlineEnded, 98, 100 * ms},
		{"deadline under 2 base RTTs ended: the caller's", 199 * ms, DeadlineEnded, 100, 100 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := mustNew(t, Config{InitialLimit: 100})
			pinBase(l, 100*ms)
			l.srtt = 0 // the window of an update ends at its first release
			s := admit(t, l, Request{Left: tt.left})
			l.Release(t0.Add(time.Hour), s, 60*ms, tt.o)
			if sn := l.Snapshot(t0.Add(time.Hour)); sn.Limit != tt.wantLimit || sn.BaseRTT != tt.wantBase || sn.InFlight != 0 {
				t.Errorf("after %v: %+v, want limit %d, base %v, none in flight", tt.o, sn, tt.wantLimit, tt.wantBase)
			}
		})
	}
}

// TestLimitReturnsToInitial: an overload lowered the limit to 10; once
// less than half of it is used and nothing queues, it grows back to its
// initial 20, and no further (issue 19, step down).
func TestLimitReturnsToInitial(t *testing.T) {
	l := mustNew(t, Config{})
	pinBase(l, 100*time.Millisecond)
	l.setLimit(10)
	for i := range 10 {
		s := admit(t, l, Request{Left: NoDeadline}) // one in flight: application-limited
		l.Release(t0.Add(time.Duration(i)*time.Hour), s, 100*time.Millisecond, Completed)
	}
	if got := l.Snapshot(t0).Limit; got != 20 {
		t.Errorf("limit = %d, want back at its initial 20", got)
	}
}

// TestQueueHandsFreedSlotToMostCritical: the freed slot goes to the most
// critical waiter, at the release, whatever the order of arrival.
func TestQueueHandsFreedSlotToMostCritical(t *testing.T) {
	l := fixed(t, 2, 4)
	a := admit(t, l, Request{Crit: CriticalPlus, Left: NoDeadline})
	admit(t, l, Request{Crit: CriticalPlus, Left: NoDeadline})
	var ws []*Waiter
	for _, c := range []Criticality{SheddablePlus, Critical, CriticalPlus} {
		w, ok := l.Enqueue(t0, Request{Crit: c, Left: NoDeadline})
		if !ok {
			t.Fatalf("Enqueue(%v) refused", c)
		}
		ws = append(ws, w)
	}
	l.Release(t0, a, time.Millisecond, Completed)
	if !isReady(ws[2]) || isReady(ws[0]) || isReady(ws[1]) {
		t.Fatalf("after a release: ready %v %v %v, want only the CRITICAL_PLUS waiter", isReady(ws[0]), isReady(ws[1]), isReady(ws[2]))
	}
	s, ok := l.Leave(ws[2])
	if !ok || s.t == nil {
		t.Fatalf("Leave(granted) = %v, %v", s, ok)
	}
	// The others give up: nothing held by them.
	for _, w := range ws[:2] {
		if _, ok := l.Leave(w); ok {
			t.Errorf("Leave of a waiter never granted: ok")
		}
	}
	if sn := l.Snapshot(t0); sn.InFlight != 2 || sn.Queued != 0 || sn.Count[Admitted][CriticalPlus] != 3 {
		t.Errorf("%+v, want 2 in flight, none queued, 3 CRITICAL_PLUS admitted", sn)
	}
}

// TestQueueDisplacesLessCritical: a full queue of SHEDDABLE waiters; a
// CRITICAL request takes the newest one's place, and that one is told at
// once; a SHEDDABLE request is refused (issue 19, defect 5).
func TestQueueDisplacesLessCritical(t *testing.T) {
	l := fixed(t, 1, 2)
	admit(t, l, Request{Left: NoDeadline})
	old, _ := l.Enqueue(t0, Request{Crit: Sheddable, Left: NoDeadline})
	newer, _ := l.Enqueue(t0, Request{Crit: Sheddable, Left: NoDeadline})
	if _, ok := l.Enqueue(t0, Request{Crit: Sheddable, Left: NoDeadline}); ok {
		t.Fatalf("a SHEDDABLE request entered a queue full of SHEDDABLE ones")
	}
	crit, ok := l.Enqueue(t0, Request{Crit: Critical, Left: NoDeadline})
	if !ok {
		t.Fatalf("a CRITICAL request was refused by a queue of SHEDDABLE ones")
	}
	if !isReady(newer) || isReady(old) || isReady(crit) {
		t.Fatalf("ready: old %v, newer %v, critical %v; want the newer SHEDDABLE displaced", isReady(old), isReady(newer), isReady(crit))
	}
	if _, ok := l.Leave(newer); ok {
		t.Errorf("the displaced waiter got a slot")
	}
	l.Leave(old)
	l.Leave(crit)
	if sn := l.Snapshot(t0); sn.Queued != 0 || sn.InFlight != 1 {
		t.Errorf("%+v, want none queued, 1 in flight", sn)
	}
}

// TestQueueLeaveAfterGrant: a waiter granted a slot as it gave up (its
// timer fired) still gets the slot from Leave, and must release it.
func TestQueueLeaveAfterGrant(t *testing.T) {
	l := fixed(t, 1, 1)
	s := admit(t, l, Request{Left: NoDeadline})
	w, _ := l.Enqueue(t0, Request{Left: NoDeadline})
	l.Abandon(t0, s)
	got, ok := l.Leave(w) // without reading Ready
	if !ok {
		t.Fatalf("Leave after a grant: not ok")
	}
	l.Abandon(t0, got)
	if sn := l.Snapshot(t0); sn.InFlight != 0 || sn.Queued != 0 {
		t.Errorf("%+v, want nothing held", sn)
	}
	// The pooled waiter comes back clean.
	s = admit(t, l, Request{Left: NoDeadline})
	w2, _ := l.Enqueue(t0, Request{Left: NoDeadline})
	if isReady(w2) {
		t.Errorf("a reused waiter is ready at once")
	}
	l.Leave(w2)
	l.Abandon(t0, s)
}

// TestQueueNoneConfigured: without MaxQueue, Enqueue refuses.
func TestQueueNoneConfigured(t *testing.T) {
	l := fixed(t, 1, 0)
	if _, ok := l.Enqueue(t0, Request{}); ok {
		t.Errorf("Enqueue without a queue: ok")
	}
}

// TestLessCriticalYield: once a CRITICAL request is shed over the limit,
// a SHEDDABLE one is shed for 4 smoothed latencies even where its share has
// room, so that the slots freed go to the CRITICAL requests; after that it
// is admitted again (issue 19, defect 5: a SHEDDABLE flood held the slots
// a CRITICAL load needed).
func TestLessCriticalYield(t *testing.T) {
	l := fixed(t, 10, 0)
	ms := time.Millisecond
	s := admit(t, l, Request{Left: NoDeadline})
	l.Release(t0, s, 10*ms, Completed) // srtt 10ms
	var slots []Slot
	for range 9 { // CRITICAL's share: 9
		slots = append(slots, admit(t, l, Request{Left: NoDeadline}))
	}
	if _, v, _ := l.Acquire(t0, Request{Left: NoDeadline}); v != ShedLimit {
		t.Fatalf("a 10th CRITICAL request: %v, want shed", v)
	}
	for _, s := range slots[:6] { // 3 in flight: SHEDDABLE's share (5) has room
		l.Abandon(t0, s)
	}
	tests := []struct {
		at   time.Duration
		want Verdict
	}{
		{0, ShedLimit},
		{39 * ms, ShedLimit},
		{40 * ms, Admitted},
	}
	for _, tt := range tests {
		s, v, _ := l.Acquire(t0.Add(tt.at), Request{Crit: Sheddable, Left: NoDeadline})
		if v != tt.want {
			t.Errorf("SHEDDABLE at %v after the CRITICAL shed: %v, want %v", tt.at, v, tt.want)
		}
		l.Abandon(t0, s)
	}
	if _, v, _ := l.Acquire(t0, Request{Crit: CriticalPlus, Left: NoDeadline}); v != Admitted {
		t.Errorf("CRITICAL_PLUS after a CRITICAL shed: %v, want admitted (more critical ones never yield)", v)
	}
}
