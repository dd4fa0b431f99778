package ratelimit

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// TestKeysBeyondMaxShareOverflow: with MaxKeys 3, a fourth busy key
// shares the overflow bucket (one burst for all of the keys beyond), and
// so does a key longer than MaxKeyLen; the empty key has a bucket of its
// own that does not count.
func TestKeysBeyondMaxShareOverflow(t *testing.T) {
	l := mustNew(t, Config{Rate: 1, Burst: 1, MaxKeys: 3})
	for _, k := range []string{"a", "b", "c", ""} {
		if ok, _ := l.Allow(t0, k, Critical); !ok {
			t.Fatalf("key %q refused on a fresh bucket", k)
		}
	}
	if ok, _ := l.Allow(t0, "d", Critical); !ok {
		t.Fatal(`key "d" (the overflow bucket's first call) refused`)
	}
	if ok, _ := l.Allow(t0, "e", Critical); ok {
		t.Fatal(`key "e" admitted: keys beyond MaxKeys must share the overflow bucket, which "d" emptied`)
	}
	if ok, _ := l.Allow(t0, strings.Repeat("x", MaxKeyLen+1), Critical); ok {
		t.Fatal("a key longer than MaxKeyLen admitted: it must share the overflow bucket")
	}
	if s := l.Stats(); s.Keys != 3 || s.Overflowed != 3 {
		t.Fatalf("Stats = %+v, want 3 keys, 3 decisions on the overflow bucket", s)
	}
	if ok, _ := l.Allow(t0, strings.Repeat("x", MaxKeyLen), Critical); ok {
		t.Fatal("a key of MaxKeyLen bytes at the key bound must go to the (empty) overflow bucket too")
	}
}

// TestIdleKeysForgottenAtTheBound: once a remembered key's bucket is full
// again it is forgotten when a new key needs its place, and forgetting it
// changes no decision (a full bucket is what a new key gets).
func TestIdleKeysForgottenAtTheBound(t *testing.T) {
	l := mustNew(t, Config{Rate: 10, Burst: 2, MaxKeys: 2})
	l.Allow(t0, "a", Critical)
	l.Allow(t0, "b", Critical)
	l.Allow(t0, "b", Critical)
	// At 100ms, a is full again (1 token used, 1 came); b is not (2 used).
	if ok, _ := l.Allow(at(100*time.Millisecond), "c", Critical); !ok {
		t.Fatal(`key "c" refused: "a" was idle and should have made room`)
	}
	if s := l.Stats(); s.Keys != 2 || s.Overflowed != 0 {
		t.Fatalf("Stats = %+v, want 2 keys (b, c) and no overflow", s)
	}
	// b still holds its state: one token back at 100ms, none more.
	if ok, _ := l.Allow(at(100*time.Millisecond), "b", Critical); !ok {
		t.Fatal(`key "b" lost its refilled token`)
	}
	if ok, wait := l.Allow(at(100*time.Millisecond), "b", Critical); ok || wait != 100*time.Millisecond {
		t.Fatalf(`key "b" after its token: %v, %v; want refused for 100ms (its state was kept)`, ok, wait)
	}
	// a comes back as a fresh key would: the full burst.
	l.Allow(at(time.Second), "zz", Critical) // b, c idle by now: room
	for i := range 2 {
		if ok, _ := l.Allow(at(time.Second), "a", Critical); !ok {
			t.Fatalf(`forgotten key "a", call %d refused: it must start with a full bucket`, i)
		}
	}
}

// TestSweepScheduledByEarliestIdle: with the bound reached by busy keys,
// new keys go to the overflow bucket without a sweep until the earliest
// instant a remembered key can be idle, and are remembered from then on.
func TestSweepScheduledByEarliestIdle(t *testing.T) {
	l := mustNew(t, Config{Rate: 1, Burst: 10, MaxKeys: 100})
	for i := range 100 {
		for range 5 { // 5 tokens of 10: idle again in 5 s
			l.Allow(t0, "k"+strconv.Itoa(i), Critical)
		}
	}
	for i := range 1000 {
		l.Allow(at(time.Second), "new"+strconv.Itoa(i), Critical)
	}
	l.keys.mu.Lock()
	next := l.keys.nextSweep
	l.keys.mu.Unlock()
	if want := int64(5 * time.Second); next != want {
		t.Fatalf("next sweep at %v, want %v (the earliest TAT of the busy keys)", time.Duration(next), time.Duration(want))
	}
	if s := l.Stats(); s.Keys != 100 || s.Overflowed != 1000 {
		t.Fatalf("Stats = %+v, want the 100 busy keys and 1000 overflowed decisions", s)
	}
	l.Allow(at(5*time.Second), "late", Critical)
	if s := l.Stats(); s.Keys != 1 {
		t.Fatalf("after every key went idle, %d keys remembered, want 1 (the new one)", s.Keys)
	}
}

// TestTableGrowsAndKeepsState: keys added past several doublings keep
// their buckets (a rebuild copies entries, never their state).
func TestTableGrowsAndKeepsState(t *testing.T) {
	l := mustNew(t, Config{Rate: 1, Burst: 1, MaxKeys: 5000})
	for i := range 5000 {
		if ok, _ := l.Allow(t0, "k"+strconv.Itoa(i), Critical); !ok {
			t.Fatalf("key %d refused on its first call", i)
		}
	}
	for i := range 5000 {
		if ok, _ := l.Allow(t0, "k"+strconv.Itoa(i), Critical); ok {
			t.Fatalf("key %d admitted twice at one instant with a burst of 1: its state was lost", i)
		}
	}
	if got := len(l.keys.tab.Load().slots); got != 16384 {
		t.Fatalf("table of %d slots for 5000 keys, want 16384 (at most half full)", got)
	}
}

// TestSweepRacesWithDecisions: many goroutines decide on more keys than
// the bound, across instants that make keys idle and busy again, while
// sweeps forget idle ones. No key is ever admitted beyond its bucket: at
// each instant, per key, at most the burst plus the tokens since its
// previous call. A decision on an entry a sweep just forgot must look the
// key up again, never write into the dead entry.
func TestSweepRacesWithDecisions(t *testing.T) {
	const (
		keysN   = 64
		burst   = 2
		workers = 8
		steps   = 400
	)
	l := mustNew(t, Config{Rate: 10, Burst: burst, MaxKeys: 16})
	// admitted[step][key] counts admissions at instant step·50ms
	var admitted [steps][keysN]atomic.Int32
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			for s := range steps {
				now := at(time.Duration(s) * 50 * time.Millisecond)
				for i := range keysN {
					k := (i*7 + g) % keysN
					if ok, _ := l.Allow(now, "key-"+strconv.Itoa(k), Critical); ok {
						admitted[s][k].Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	// At one instant a key can take at most its whole burst (a fresh or
	// forgotten key: a full bucket), and, being overflowed, shares one.
	for s := range steps {
		for k := range keysN {
			if n := admitted[s][k].Load(); n > burst {
				t.Fatalf("step %d key %d: %d admitted at one instant, burst %d", s, k, n, burst)
			}
		}
	}
	// Over the run, every bucket (16 remembered at a time, plus the
	// overflow one) earns at most burst + 20 s × 10/s per key-lifetime;
	// the total is bounded by every key having a bucket of its own.
	total := 0
	for s := range steps {
		for k := range keysN {
			total += int(admitted[s][k].Load())
		}
	}
	if max := keysN * (burst + 200); total > max {
		t.Fatalf("%d admitted in all, more than %d keys could earn on buckets of their own", total, max)
	}
	if s := l.Stats(); s.Keys > 16 {
		t.Fatalf("%d keys remembered, bound 16", s.Keys)
	}
}

// TestKeyNotRetainedByCaller: a remembered key is a copy, so a caller's
// large buffer is not kept alive (nor changed under the table) by it.
func TestKeyNotRetainedByCaller(t *testing.T) {
	l := mustNew(t, Config{Rate: 1, Burst: 1})
	buf := []byte("tenant-a and a long tail the key must not pin; " + strings.Repeat("x", inlineKey))
	l.Allow(t0, unsafe.String(&buf[0], 8), Critical)        // held inline
	l.Allow(t0, unsafe.String(&buf[0], len(buf)), Critical) // too long to be
	found := 0
	for i := range l.keys.tab.Load().slots {
		if e := l.keys.tab.Load().slots[i].e.Load(); e != nil {
			found++
			if !strings.HasPrefix(string(buf), e.key) || unsafe.StringData(e.key) == &buf[0] {
				t.Fatalf("remembered key %q shares the caller's buffer", e.key)
			}
		}
	}
	if found != 2 {
		t.Fatalf("%d keys remembered, want 2", found)
	}
}
