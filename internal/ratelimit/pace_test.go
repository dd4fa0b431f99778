package ratelimit

import (
	"testing"
	"time"
)

// TestPaceOneAttemptPerPushback: a server answers every attempt over its
// limit with a pushback of 100ms; 50 calls of a method over one second,
// each willing to wait up to 1 s for its slot, send one attempt per
// pushback period (20, over the 2 s their waits reach; those whose slot is
// further fail at once, locally), where a plain loop sends 50 into the
// limit.
func TestPaceOneAttemptPerPushback(t *testing.T) {
	var p Pace
	attempts := 0
	var sent []time.Duration
	for i := range 50 {
		now := time.Duration(i) * 20 * time.Millisecond
		wait, ok := p.Slot(at(now), time.Second)
		if !ok {
			continue
		}
		attempts++
		sent = append(sent, now+wait)
		p.Pushback(at(now+wait), 100*time.Millisecond) // still over the limit
	}
	for i := 1; i < len(sent); i++ {
		if gap := sent[i] - sent[i-1]; gap < 100*time.Millisecond {
			t.Fatalf("attempts %d and %d %v apart, under the pushback of 100ms", i-1, i, gap)
		}
	}
	if max := int(sent[len(sent)-1]/(100*time.Millisecond)) + 1; attempts > max {
		t.Fatalf("%d attempts over %v: more than one per pushback period", attempts, sent[len(sent)-1])
	}
	t.Logf("%d attempts of 50 calls, slots %v", attempts, sent)
}

// TestPaceDeadlineFailsFast: an attempt whose slot is past what the caller
// may wait takes nothing and is told how long it would be; each success
// halves the spacing, and the pacing ends under a millisecond.
func TestPaceDeadlineFailsFast(t *testing.T) {
	var p Pace
	if w, ok := p.Slot(t0, 0); !ok || w != 0 {
		t.Fatalf("unpaced: %v, %v", w, ok)
	}
	p.Pushback(t0, 300*time.Millisecond)
	if w, ok := p.Slot(t0, 100*time.Millisecond); ok || w != 300*time.Millisecond {
		t.Fatalf("slot past maxWait: %v, %v; want refused, 300ms", w, ok)
	}
	if w, ok := p.Slot(t0, time.Second); !ok || w != 300*time.Millisecond {
		t.Fatalf("slot within maxWait: %v, %v; want 300ms", w, ok)
	}
	if w, ok := p.Slot(t0, time.Second); !ok || w != 600*time.Millisecond {
		t.Fatalf("the next slot: %v, %v; want 600ms: one per pushback period", w, ok)
	}
	p.Success()
	if _, period := p.Snapshot(); period != 150*time.Millisecond {
		t.Fatalf("after a success the period is %v, want 150ms (halved)", period)
	}
	if w, ok := p.Slot(t0, time.Second); !ok || w != 750*time.Millisecond {
		t.Fatalf("the slot after a success: %v, %v; want 750ms (the last taken, 600ms, plus the halved 150ms)", w, ok)
	}
	if w, ok := p.Slot(t0, time.Second); !ok || w != 900*time.Millisecond {
		t.Fatalf("the next slot: %v, %v; want 900ms (150ms after)", w, ok)
	}
	for range 8 { // 150ms halved 8 times: under 1ms
		p.Success()
	}
	if w, ok := p.Slot(t0, 0); !ok || w != 0 || p.Active() {
		t.Fatalf("after the spacing fell under a millisecond: %v, %v, active %v; want unpaced", w, ok, p.Active())
	}
}
