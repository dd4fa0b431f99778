package trail

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestTrailRemembersPicks(t *testing.T) {
	c := NewContext(context.Background(), time.Time{})
	tr := FromContext(c)
	if tr == nil {
		t.Fatal("FromContext(NewContext) = nil")
	}
	if tr.Has(7) || tr.Len() != 0 {
		t.Error("a new Trail has a pick")
	}
	if slot := tr.Add(7); slot != 0 {
		t.Errorf("Add = %d, want slot 0", slot)
	}
	if !tr.Has(7) || tr.Has(8) || tr.Len() != 1 {
		t.Error("Has: the recorded pick not found, or another one found")
	}
	if FromContext(context.Background()) != nil {
		t.Error("FromContext(Background) != nil")
	}
	type other struct{}
	if v := context.WithValue(c, other{}, 1); FromContext(v) != tr || v.Value(other{}) != 1 {
		t.Error("values of the parent and children lost")
	}
}

func TestTrailForgetsPicksPastSize(t *testing.T) {
	tr := FromContext(NewContext(context.Background(), time.Time{}))
	for id := range uint64(Size + 3) {
		slot := tr.Add(id + 1)
		if want := int(id); id >= Size && slot != -1 || id < Size && slot != want {
			t.Errorf("Add(%d) = slot %d", id+1, slot)
		}
	}
	if !tr.Has(Size) || tr.Has(Size+1) || tr.Len() != Size {
		t.Error("Has after overflow: want the first Size picks only")
	}
}

func TestTrailConcurrentAdds(t *testing.T) {
	tr := FromContext(NewContext(context.Background(), time.Time{}))
	var wg sync.WaitGroup
	for i := range uint64(4) {
		wg.Go(func() { tr.Add(i + 1); tr.Has(i + 1) })
	}
	wg.Wait()
	for i := range uint64(4) {
		if !tr.Has(i + 1) {
			t.Errorf("pick %d lost", i+1)
		}
	}
}

// TestResetStartsAFreshTrail pins Reset: an embedded Context takes its
// parent's values and starts with no pick, mark or bound.
func TestResetStartsAFreshTrail(t *testing.T) {
	var c Context
	type k struct{}
	c.Reset(context.WithValue(context.Background(), k{}, "v"), time.Time{})
	tr := c.Trail()
	if tr.Len() != 0 || tr.TimedOut(0) || tr.OwnDeadline(time.Unix(1, 0)) {
		t.Fatal("a new Context has state")
	}
	if FromContext(&c) != tr || c.Value(k{}) != "v" {
		t.Fatal("Reset: the trail or the parent's value is lost")
	}
	tr.Add(1)
	tr.MarkTimedOut()
	tr.MarkEnded()
	if !tr.Ended() || !tr.TimedOut(0) {
		t.Fatal("MarkEnded or MarkTimedOut not recorded")
	}
	c.Reset(context.Background(), time.Time{})
	if tr.Len() != 0 || tr.TimedOut(0) || tr.Ended() {
		t.Fatal("Reset keeps the last call's picks, timer or end")
	}
}

// TestWantCountsPoliciesPerTarget pins the registry the Client asks before
// it makes a Trail: wanted while a policy on the target lives, per target,
// and not after every release (a release is idempotent).
func TestWantCountsPoliciesPerTarget(t *testing.T) {
	if Wanted("a") {
		t.Fatal("Wanted before any Want")
	}
	r1, r2 := Want("a"), Want("a")
	r3 := Want("b")
	if !Wanted("a") || !Wanted("b") || Wanted("c") {
		t.Fatal("Wanted: the live targets are a and b")
	}
	r1()
	r1()
	if !Wanted("a") {
		t.Fatal("one release of two (the second a repeat) unwanted a")
	}
	r2()
	r3()
	if Wanted("a") || Wanted("b") {
		t.Fatal("wanted after every release")
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				Want("c")()
			}
		})
	}
	wg.Wait()
	if Wanted("c") || anyWanted.Load() != 0 {
		t.Fatal("concurrent Want/release left c wanted")
	}
}

// TestOwnDeadlineTellsThePerAttemptTimeoutFromTheCallers pins OwnBound and
// OwnDeadline: with a caller's deadline dl and headroom h, an attempt
// deadline before dl − h is the per-attempt timeout's; at or after it, the
// caller's (or its headroom's); with no caller deadline any attempt
// deadline is the per-attempt timeout's; with no bound (a call option's
// timeout), none is.
func TestOwnDeadlineTellsThePerAttemptTimeoutFromTheCallers(t *testing.T) {
	dl := time.Unix(1000, 0)
	tests := []struct {
		name    string
		own     time.Time
		attempt time.Time
		want    bool
	}{
		{"per-attempt binds", OwnBound(dl, time.Second), dl.Add(-2 * time.Second), true},
		{"headroom binds", OwnBound(dl, time.Second), dl.Add(-time.Second), false},
		{"caller binds, no headroom", OwnBound(dl, 0), dl, false},
		{"no caller deadline", OwnBound(time.Time{}, time.Second), dl.Add(time.Hour), true},
		{"no bound", time.Time{}, dl.Add(-time.Hour), false},
	}
	for _, tt := range tests {
		var c Context
		c.Reset(context.Background(), tt.own)
		if got := c.Trail().OwnDeadline(tt.attempt); got != tt.want {
			t.Errorf("%s: OwnDeadline = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestMarkTimedOutMarksTheLatestPick pins the stream timer's mark: it
// lands on the latest pick (the attempt the timer belongs to), and a mark
// with no pick is a no-op.
func TestMarkTimedOutMarksTheLatestPick(t *testing.T) {
	tr := FromContext(NewContext(context.Background(), time.Time{}))
	tr.MarkTimedOut()
	a := tr.Add(1)
	b := tr.Add(2)
	tr.MarkTimedOut()
	if tr.TimedOut(a) || !tr.TimedOut(b) || tr.TimedOut(-1) || tr.TimedOut(Size) {
		t.Fatalf("TimedOut(%d, %d) = %v, %v; want false, true", a, b, tr.TimedOut(a), tr.TimedOut(b))
	}
}

func TestResetLookupAndWantedAllocateNothing(t *testing.T) {
	defer Want("t")()
	var c Context
	parent := context.Background()
	if n := testing.AllocsPerRun(1000, func() {
		c.Reset(parent, time.Time{})
		FromContext(&c).Add(1)
		_ = Wanted("t")
	}); n != 0 {
		t.Fatalf("Reset+FromContext+Add+Wanted: %v allocs, want 0", n)
	}
}
