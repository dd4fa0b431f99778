package budget

import (
	"sync"
	"testing"
)

// TestAllowance pins the allowance: full at first (the burst), then each
// event credits its share, a returned action is back, and it never holds
// more than the burst.
func TestAllowance(t *testing.T) {
	const burst = 4
	a := NewAllowance(0.1, burst)
	for i := range burst {
		if !a.Take() {
			t.Fatalf("Take %d of a full allowance of %d = false", i+1, burst)
		}
	}
	if a.Take() {
		t.Fatal("Take of an empty allowance = true")
	}
	for range 9 {
		a.Credit()
	}
	if a.Take() {
		t.Fatal("Take after 9 events of share 0.1 = true, want false (0.9 of an action)")
	}
	a.Credit()
	if !a.Take() {
		t.Fatal("Take after 10 events of share 0.1 = false, want true")
	}
	a.Return()
	if !a.Take() {
		t.Fatal("Take after an action was returned = false")
	}
	for range 1000 {
		a.Credit()
	}
	n := 0
	for a.Take() {
		n++
	}
	if n != burst {
		t.Errorf("a full allowance held %d actions, want the burst, %d", n, burst)
	}
	var zero Allowance
	if zero.Take() {
		t.Error("Take of the zero Allowance = true, want false")
	}
}

// TestAllowanceUnderContention pins the count when events and actions race:
// over 1000 events of share 0.25 from 8 goroutines and as many Takes, at
// most 250 plus the burst succeed, and no more than were credited.
func TestAllowanceUnderContention(t *testing.T) {
	a := NewAllowance(0.25, 2)
	var taken sync.WaitGroup
	var mu sync.Mutex
	got := 0
	for range 8 {
		taken.Go(func() {
			for range 125 {
				a.Credit()
				if a.Take() {
					mu.Lock()
					got++
					mu.Unlock()
				}
			}
		})
	}
	taken.Wait()
	if got > 250+2 {
		t.Errorf("%d actions taken over 1000 events of share 0.25 and a burst of 2, want at most 252", got)
	}
}

func TestAllowanceAllocatesNothing(t *testing.T) {
	a := NewAllowance(0.1, 4)
	if n := testing.AllocsPerRun(1000, func() {
		a.Credit()
		if a.Take() {
			a.Return()
		}
	}); n != 0 {
		t.Errorf("Credit, Take, Return: %v allocs, want 0", n)
	}
}
