package ratelimit

import (
	"testing"
	"time"
)

// TestBucketReserveTable pins Reserve and Cancel on instants: 10 per
// second with a burst of 2, so a token every 100ms.
func TestBucketReserveTable(t *testing.T) {
	b, err := NewBucket(Config{Rate: 10, Burst: 2}, t0)
	if err != nil {
		t.Fatal(err)
	}
	ms := time.Millisecond
	steps := []struct {
		name     string
		at       time.Duration
		maxWait  time.Duration
		cancel   bool
		wantWait time.Duration
		wantOK   bool
	}{
		{name: "burst 1", at: 0, wantOK: true},
		{name: "burst 2", at: 0, wantOK: true},
		{name: "empty: refused with the exact wait", at: 0, wantWait: 100 * ms},
		{name: "refused 40ms later", at: 40 * ms, wantWait: 60 * ms},
		{name: "reserved within maxWait", at: 40 * ms, maxWait: 60 * ms, wantWait: 60 * ms, wantOK: true},
		{name: "the next is a whole interval further", at: 40 * ms, maxWait: time.Second, wantWait: 160 * ms, wantOK: true},
		{name: "given back", at: 50 * ms, cancel: true},
		{name: "the token given back is taken again", at: 50 * ms, maxWait: time.Second, wantWait: 150 * ms, wantOK: true},
		{name: "full again after a quiet second", at: 2 * time.Second, wantOK: true},
		{name: "cancel on a bucket with room gives nothing", at: 3 * time.Second, cancel: true},
		{name: "still a burst of 2, not 3 (1)", at: 3 * time.Second, wantOK: true},
		{name: "still a burst of 2, not 3 (2)", at: 3 * time.Second, wantOK: true},
		{name: "still a burst of 2, not 3 (3)", at: 3 * time.Second, wantWait: 100 * ms},
	}
	for _, s := range steps {
		if s.cancel {
			b.Cancel(t0.Add(s.at))
			continue
		}
		w, ok := b.Reserve(t0.Add(s.at), s.maxWait)
		if w != s.wantWait || ok != s.wantOK {
			t.Fatalf("%s: Reserve(%v, %v) = %v, %v; want %v, %v", s.name, s.at, s.maxWait, w, ok, s.wantWait, s.wantOK)
		}
	}
	if got := b.Interval(); got != 100*ms {
		t.Fatalf("Interval() = %v, want 100ms", got)
	}
}

// TestBucketRefusesBadConfig: the engine's bounds, with the field named.
func TestBucketRefusesBadConfig(t *testing.T) {
	for _, cfg := range []Config{{Rate: 0, Burst: 1}, {Rate: 1, Burst: 0}, {Rate: 1e10, Burst: 1}, {Rate: 1e-9, Burst: 1 << 40}} {
		if _, err := NewBucket(cfg, t0); err == nil {
			t.Errorf("NewBucket(%+v) = nil error", cfg)
		}
	}
}

// TestPaceCancelLeavesNoQueue: ten callers take the ten slots after a
// pushback and all give up; the next caller finds the first slot, not the
// eleventh.
func TestPaceCancelLeavesNoQueue(t *testing.T) {
	var p Pace
	w := 100 * time.Millisecond
	p.Pushback(at(0), w)
	var tickets []Ticket
	for range 10 {
		_, tk, ok := p.Take(at(0), time.Hour)
		if !ok {
			t.Fatal("Take refused within an hour")
		}
		tickets = append(tickets, tk)
	}
	for _, tk := range tickets {
		p.Cancel(at(time.Millisecond), tk)
	}
	if got, ok := p.Slot(at(time.Millisecond), time.Hour); !ok || got != w-time.Millisecond {
		t.Fatalf("Slot after every caller gave up = %v, %v; want %v, true", got, ok, w-time.Millisecond)
	}
	endPace(&p)
	p.Cancel(at(0), tickets[0]) // inactive: nothing to give back
	if got, ok := p.Slot(at(time.Millisecond), 0); !ok || got != 0 {
		t.Fatalf("Slot after Success = %v, %v; want 0, true", got, ok)
	}
}

// TestPaceCancelGivesBackOnlyASlotOfThePacingInForce: a Cancel with the
// zero Ticket (the attempt passed while nothing was paced) or with a
// Ticket of a pacing that has ended gives back nothing; before Tickets,
// either moved a pushback begun meanwhile back by a whole period, and the
// next attempt went at once.
func TestPaceCancelGivesBackOnlyASlotOfThePacingInForce(t *testing.T) {
	var p Pace
	w := time.Second
	_, none, ok := p.Take(at(0), 0)
	if !ok || none != 0 {
		t.Fatalf("Take with nothing paced = %v, %v; want the zero Ticket, true", none, ok)
	}
	p.Pushback(at(0), w)
	_, old, ok := p.Take(at(0), time.Hour)
	if !ok || old == 0 {
		t.Fatalf("Take in a pushback = %v, %v; want a Ticket", old, ok)
	}
	endPace(&p)
	p.Pushback(at(time.Millisecond), w)
	p.Cancel(at(time.Millisecond), none)
	p.Cancel(at(time.Millisecond), old)
	if next, _ := p.Snapshot(); !next.Equal(at(time.Millisecond + w)) {
		t.Fatalf("next free slot at %v after the cancels of no slot and of an ended pacing's; want %v (the pushback untouched)",
			next.Sub(at(0)), time.Millisecond+w)
	}
	_, cur, _ := p.Take(at(time.Millisecond), time.Hour)
	p.Cancel(at(time.Millisecond), cur)
	if next, _ := p.Snapshot(); !next.Equal(at(time.Millisecond + w)) {
		t.Fatalf("next free slot at %v after its own slot's cancel; want %v", next.Sub(at(0)), time.Millisecond+w)
	}
}

// TestBucketAllocations pins 0 allocations per decision.
func TestBucketAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are checked without -race")
	}
	b, _ := NewBucket(Config{Rate: 1e6, Burst: 10}, t0)
	now := t0
	if n := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Microsecond)
		b.Reserve(now, 0)
	}); n != 0 {
		t.Fatalf("Reserve allocates %v times, want 0", n)
	}
}

// TestPaceEndedAndNewEpisode: Success closes the channel Ended gave the
// waiters, and a later pushback starts afresh: the slots taken in the
// pushback that ended (ten periods ahead) delay nothing.
func TestPaceEndedAndNewEpisode(t *testing.T) {
	var p Pace
	if p.Ended() != nil {
		t.Fatal("Ended() with no pushback in force: want nil")
	}
	w := 100 * time.Millisecond
	p.Pushback(at(0), w)
	for range 10 {
		p.Slot(at(0), time.Hour)
	}
	ended := p.Ended()
	p.Success()
	select {
	case <-ended:
		t.Fatal("one Success (spacing halved to 50ms) closed Ended()")
	default:
	}
	endPace(&p)
	select {
	case <-ended:
	default:
		t.Fatal("the pace ended without closing Ended()")
	}
	p.Success() // twice: no panic
	p.Pushback(at(time.Second), w)
	if got, ok := p.Slot(at(time.Second), time.Hour); !ok || got != w {
		t.Fatalf("Slot in a new pushback = %v, %v; want %v, true (the old slots gone)", got, ok, w)
	}
	if next, period := p.Snapshot(); period != w || !next.Equal(at(time.Second+2*w)) {
		t.Fatalf("Snapshot() = %v, %v", next, period)
	}
}

// endPace records successes until p's pacing ends.
func endPace(p *Pace) {
	for p.Active() {
		p.Success()
	}
}
