package clock

import (
	"testing"
	"time"
)

func TestFakeFiresTimersInOrderAsTimePasses(t *testing.T) {
	start := time.Unix(1000, 0)
	f := NewFake(start)
	late := f.NewTimer(2 * time.Second)
	early := f.NewTimer(time.Second)
	stopped := f.NewTimer(time.Second)
	if !stopped.Stop() {
		t.Fatal("Stop() = false for a pending timer, want true")
	}
	f.Advance(time.Second)
	select {
	case at := <-early.C():
		if !at.Equal(start.Add(time.Second)) {
			t.Errorf("early fired at %v, want %v", at, start.Add(time.Second))
		}
	default:
		t.Fatal("early timer did not fire at its deadline")
	}
	select {
	case <-late.C():
		t.Fatal("late timer fired before its deadline")
	case <-stopped.C():
		t.Fatal("stopped timer fired")
	default:
	}
	if got := f.Pending(); got != 1 {
		t.Errorf("Pending() = %d, want 1", got)
	}
	f.Set(start.Add(3 * time.Second))
	if _, ok := <-late.C(); !ok || late.Stop() {
		t.Error("late timer did not fire, or Stop() after firing = true")
	}
	if z := f.NewTimer(0); len(z.C()) != 1 {
		t.Error("NewTimer(0) did not fire at once")
	}
}
