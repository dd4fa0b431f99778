package limit

import (
	"testing"
	"time"
)

// bbrWithHistory is a BBR whose window saw, in each complete bucket of
// 500ms, pass requests of latency rt.
func bbrWithHistory(t *testing.T, pass int, rt time.Duration) (*BBR, time.Time) {
	t.Helper()
	s, err := NewBBR(BBRConfig{})
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	for range bbrBuckets {
		for range pass {
			s.Acquire(now, 0, Critical)
			s.Release(now, rt)
		}
		now = now.Add(500 * time.Millisecond)
	}
	return s, now
}

// TestBBRMaxInFlight pins maxInFlight = maxPass × minRT / bucket: 10 per
// 500ms bucket at 100ms gives 2.
func TestBBRMaxInFlight(t *testing.T) {
	s, now := bbrWithHistory(t, 10, 100*time.Millisecond)
	if got := s.Snapshot(now).Limit; got != 2 {
		t.Fatalf("maxInFlight = %d, want 2", got)
	}
	tests := []struct {
		name     string
		cpu      float64
		inflight int
		c        Criticality
		want     Verdict
	}{
		{"cool admits over the limit", 0.5, 5, Critical, Admitted},
		{"hot under the limit", 0.9, 1, Critical, Admitted},
		{"hot at the limit", 0.9, 2, Critical, ShedLimit},
		{"hot at the limit, critical plus", 0.9, 2, CriticalPlus, ShedLimit},
		{"hot, sheddable at half", 0.9, 1, Sheddable, ShedLimit},
		{"at the threshold counts as hot", 0.8, 2, Critical, ShedLimit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, now := bbrWithHistory(t, 10, 100*time.Millisecond)
			s.inflight = tt.inflight
			if got, _ := s.Acquire(now, tt.cpu, tt.c); got != tt.want {
				t.Errorf("Acquire(cpu %v, %d in flight, %v) = %v, want %v", tt.cpu, tt.inflight, tt.c, got, tt.want)
			}
		})
	}
}

// TestBBRCoolOff: after a shed, the limit holds for CoolOff even when the
// CPU cools.
func TestBBRCoolOff(t *testing.T) {
	s, now := bbrWithHistory(t, 10, 100*time.Millisecond)
	s.inflight = 2
	if v, pb := s.Acquire(now, 0.95, Critical); v != ShedLimit || pb < time.Millisecond {
		t.Fatalf("hot at the limit: %v, pushback %v", v, pb)
	}
	if v, _ := s.Acquire(now.Add(999*time.Millisecond), 0.1, Critical); v != ShedLimit {
		t.Errorf("cool within the cool-off: %v, want ShedLimit", v)
	}
	if v, _ := s.Acquire(now.Add(2*time.Second), 0.1, Critical); v != Admitted {
		t.Errorf("cool after the cool-off: %v, want Admitted", v)
	}
}

// TestBBRNoHistoryAdmits: without a complete bucket, nothing is shed.
func TestBBRNoHistoryAdmits(t *testing.T) {
	s, err := NewBBR(BBRConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if v, _ := s.Acquire(t0, 1, Sheddable); v != Admitted {
			t.Fatalf("no history: %v", v)
		}
	}
}

// TestBBROnFixedCapacity simulates a server with n slots whose CPU use is
// the share of busy slots, under three times its capacity: the shedder
// keeps it busy with a short queue.
func TestBBROnFixedCapacity(t *testing.T) {
	const n, svc = 20, 100 * time.Millisecond
	s, err := NewBBR(BBRConfig{CPUThreshold: 0.8})
	if err != nil {
		t.Fatal(err)
	}
	type req struct{ start, done time.Time }
	var running []req
	slots := make([]time.Time, n)
	for i := range slots {
		slots[i] = t0
	}
	gap := svc / (3 * n)
	var busy time.Duration
	var maxLat time.Duration
	const total, from = 3 * n * 100, 3 * n * 40 // 10s, measuring from 4s
	for i := range total {
		now := t0.Add(time.Duration(i) * gap)
		for len(running) > 0 && !running[0].done.After(now) {
			r := running[0]
			running = running[1:]
			s.Release(r.done, r.done.Sub(r.start))
			if i > from {
				maxLat = max(maxLat, r.done.Sub(r.start))
			}
		}
		busyNow := 0
		for _, f := range slots {
			if f.After(now) {
				busyNow++
			}
		}
		if v, _ := s.Acquire(now, float64(busyNow)/n, Critical); v != Admitted {
			continue
		}
		k := 0
		for j := range slots {
			if slots[j].Before(slots[k]) {
				k = j
			}
		}
		start := now
		if slots[k].After(now) {
			start = slots[k]
		}
		done := start.Add(svc)
		slots[k] = done
		if i > from {
			busy += svc
		}
		j := len(running)
		for j > 0 && running[j-1].done.After(done) {
			j--
		}
		running = append(running, req{})
		copy(running[j+1:], running[j:])
		running[j] = req{now, done}
	}
	window := time.Duration(total-from) * gap * n
	util := float64(busy) / float64(window)
	t.Logf("utilization %.3f, max latency %v, %+v", util, maxLat, s.Snapshot(t0.Add(time.Duration(total)*gap)))
	if util < 0.9 {
		t.Errorf("utilization = %.3f, want ≥ 0.9", util)
	}
	if maxLat > 2*svc {
		t.Errorf("max latency = %v, want ≤ %v", maxLat, 2*svc)
	}
}

// TestBBRAllocatesNothing: Acquire and Release of the CPU shedder
// allocate nothing. Its name has "Allocat", so that CI's allocation step
// (without -race) runs it too.
func TestBBRAllocatesNothing(t *testing.T) {
	s, now := bbrWithHistory(t, 10, 100*time.Millisecond)
	if a := testing.AllocsPerRun(1000, func() {
		if v, _ := s.Acquire(now, 0.9, Critical); v == Admitted {
			s.Release(now, time.Millisecond)
		}
	}); a != 0 {
		t.Errorf("allocs = %v, want 0", a)
	}
}
