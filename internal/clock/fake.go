package clock

import (
	"sort"
	"sync"
	"time"
)

// Fake is a Clock whose time moves only when Advance or Set is called. Timers
// fire, in order of their deadlines, as time passes them. The zero value is
// not usable; use NewFake.
type Fake struct {
	mu     sync.Mutex
	now    time.Time    // guarded by mu
	timers []*fakeTimer // pending timers, guarded by mu
}

// NewFake returns a Fake clock that reads now.
func NewFake(now time.Time) *Fake { return &Fake{now: now} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when the fake time reaches Now()+d. A
// timer with d <= 0 fires at once.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{f: f, at: f.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- f.now
		return t
	}
	f.timers = append(f.timers, t)
	return t
}

// Advance moves the fake time forward by d and fires the timers it passes.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.setLocked(f.now.Add(d))
}

// Set moves the fake time to t (never backwards) and fires the timers it
// passes.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t.After(f.now) {
		f.setLocked(t)
	}
}

// Pending returns the number of timers that have not fired or been stopped.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

func (f *Fake) setLocked(t time.Time) {
	f.now = t
	sort.SliceStable(f.timers, func(i, j int) bool { return f.timers[i].at.Before(f.timers[j].at) })
	n := 0
	for _, tm := range f.timers {
		if tm.at.After(t) {
			f.timers[n] = tm
			n++
			continue
		}
		tm.c <- tm.at
	}
	clear(f.timers[n:])
	f.timers = f.timers[:n]
}

type fakeTimer struct {
	f  *Fake
	at time.Time
	c  chan time.Time // buffered, receives once
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	for i, tm := range t.f.timers {
		if tm == t {
			t.f.timers = append(t.f.timers[:i], t.f.timers[i+1:]...)
			return true
		}
	}
	return false
}
