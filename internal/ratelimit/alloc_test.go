package ratelimit

import (
	"strconv"
	"testing"
	"time"
)

// TestAllowAllocations pins 0 allocations per decision for a remembered
// key, admitted or refused, on one key and among 10,000.
func TestAllowAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are checked without -race")
	}
	l := mustNew(t, Config{Rate: 1e6, Burst: 10, MaxKeys: 10_000})
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa(i)
		l.Allow(t0, keys[i], Critical)
	}
	var i int
	now := t0
	for _, tt := range []struct {
		name string
		f    func()
	}{
		{"one key", func() { now = now.Add(time.Microsecond); l.Allow(now, "tenant-1", Critical) }},
		{"refused", func() { l.Allow(t0, "tenant-2", Sheddable) }},
		{"10,000 keys", func() { i++; l.Allow(now, keys[i%len(keys)], Critical) }},
		{"default key", func() { l.Allow(now, "", Critical) }},
		{"reserve", func() { l.Reserve(now, "tenant-3", Critical, time.Second) }},
	} {
		if n := testing.AllocsPerRun(1000, tt.f); n != 0 {
			t.Errorf("%s: %v allocations per decision, want 0", tt.name, n)
		}
	}
}

// TestSharedDecideAllocations pins 0 allocations for a decision a Shared
// limiter makes from the tokens it holds (admitted or refused); only a
// decision that asks for a lease allocates (the Lease).
func TestSharedDecideAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are checked without -race")
	}
	s, err := NewShared(SharedConfig{Config: Config{Rate: 1e6, Burst: 10}}, t0)
	if err != nil {
		t.Fatal(err)
	}
	_, l := s.Decide(t0, "k", Critical)
	s.Deliver(l, t0, Grant{Tokens: 1 << 30, FirstSlot: -time.Second, Left: 10, Replicas: 1}, nil)
	now := t0
	if n := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Microsecond)
		if d, l := s.Decide(now, "k", Critical); !d.OK || l != nil {
			t.Fatalf("decision %+v, lease %v", d, l)
		}
	}); n != 0 {
		t.Errorf("%v allocations per decision from held tokens, want 0", n)
	}
}
