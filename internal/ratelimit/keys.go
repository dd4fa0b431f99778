package ratelimit

import (
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// dead is the TAT of an entry that a sweep forgot: a decision that finds
// it looks the key up again. fresh is the TAT of a new entry: a full
// bucket at any instant.
const (
	dead  = math.MinInt64
	fresh = math.MinInt64 + 1
)

// entry is one key's state: for a Limiter, its TAT, the only state a
// decision reads and writes, by compare-and-swap; for a Shared limiter, v
// under its own lock. key is written before the entry is published in a
// table and never after. A key of up to inlineKey bytes is held in inline,
// so that the entry and its key are one allocation and, for a lookup, one
// cache line.
type entry[V any] struct {
	tat    atomic.Int64 // theoretical arrival time, ns after the Limiter's epoch; dead once forgotten
	key    string
	inline [inlineKey]byte
	v      V
}

// inlineKey is the longest key held within its entry (an entry is then 64
// bytes, a cache line).
const inlineKey = 40

// newEntry returns a fresh entry holding a copy of key: a Limiter never
// keeps the caller's backing array.
func newEntry[V any](key string) *entry[V] {
	e := &entry[V]{}
	if len(key) <= inlineKey {
		n := copy(e.inline[:], key)
		e.key = unsafe.String(&e.inline[0], n)
	} else {
		e.key = strings.Clone(key)
	}
	e.tat.Store(fresh)
	return e
}

// forgetTAT is the forget of a Limiter's keys: an entry whose bucket is
// full again (TAT ≤ now) holds nothing, since a fresh entry would decide
// every call exactly as it does; the compare-and-swap to dead races with
// decisions, which either move the TAT first or find it dead.
func forgetTAT[V any](e *entry[V], now int64) (bool, int64) {
	tat := e.tat.Load()
	if tat != dead && tat <= now && e.tat.CompareAndSwap(tat, dead) {
		return true, 0
	}
	return false, e.tat.Load()
}

// table is an open-addressing hash table of entries with linear probing,
// at most half full, so that a probe always ends on an empty slot. Readers
// search it without locks; only the goroutine holding keys.mu adds to it,
// by storing a new entry into an empty slot (a reader sees the slot empty
// or the entry whole), and the set only shrinks by replacing the whole
// table (rebuild).
type table[V any] struct {
	slots []slot[V]
	mask  uint64
	n     int // entries stored; guarded by keys.mu
}

// slot is one place of a table: empty while hash is 0; else e is the
// entry of a key whose hash is hash (stored before hash, so a reader that
// sees the hash sees the entry), so that a probe compares keys only when
// their hashes match.
type slot[V any] struct {
	hash atomic.Uint64
	e    atomic.Pointer[entry[V]]
}

func newTable[V any](size int) *table[V] {
	return &table[V]{slots: make([]slot[V], size), mask: uint64(size - 1)}
}

// find returns the entry of key, whose hash is h (never 0), or nil.
func (t *table[V]) find(h uint64, key string) *entry[V] {
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		switch t.slots[i].hash.Load() {
		case 0:
			return nil
		case h:
			if e := t.slots[i].e.Load(); e.key == key {
				return e
			}
		}
	}
}

// put stores e, whose key's hash is h, in the first empty slot of its
// probe sequence. The caller holds keys.mu and has made sure that e's key
// is not stored and that the table stays at most half full.
func (t *table[V]) put(h uint64, e *entry[V]) {
	i := h & t.mask
	for t.slots[i].hash.Load() != 0 {
		i = (i + 1) & t.mask
	}
	t.slots[i].e.Store(e)
	t.slots[i].hash.Store(h)
	t.n++
}

// keys is a Limiter's set of buckets: one per key, up to max, plus the
// default bucket (the empty key) and the overflow bucket that every key
// beyond max shares, as does every key longer than MaxKeyLen.
//
// Lookups take no lock: an atomic load of the table, a hash and a probe.
// A key seen for the first time is added under mu. When max keys are
// remembered and a new one comes, the entries that are idle (a full
// bucket: nothing would be lost by starting them afresh) are forgotten by
// a sweep, at most once until the earliest instant at which one of the
// remaining entries can have become idle, so that a flood of new keys
// against a full set costs each one O(1) and they share the overflow
// bucket meanwhile. Below the bound nothing is forgotten, so a key set
// that fits stays allocated once and for all.
type keys[V any] struct {
	seed maphash.Seed // immutable
	max  int          // immutable
	// forget marks e dead and returns true when it holds nothing at now;
	// otherwise it returns false and the earliest instant at which e can
	// hold nothing (for a Limiter, its TAT). Called under mu, by sweeps.
	forget func(e *entry[V], now int64) (dead bool, idleAt int64) // immutable

	tab      atomic.Pointer[table[V]]
	def      entry[V]      // the empty key's bucket
	over     entry[V]      // the bucket of the keys beyond max or MaxKeyLen
	overflow atomic.Uint64 // decisions on keys that went to the overflow bucket

	mu sync.Mutex
	// nextSweep is no later than the earliest instant at which an entry
	// of the table can have become idle: each entry's TAT at the last
	// sweep, or at its insertion plus one emission interval, whichever
	// is least. Guarded by mu.
	nextSweep int64
}

const minTable = 16

func (k *keys[V]) init(max int, forget func(*entry[V], int64) (bool, int64)) {
	k.seed = maphash.MakeSeed()
	k.max = max
	k.forget = forget
	k.tab.Store(newTable[V](minTable))
	k.def.tat.Store(fresh)
	k.over.tat.Store(fresh)
	k.nextSweep = math.MaxInt64
}

// get returns the bucket of key, remembering key when it is new and there
// is room. now (ns after the epoch) is when the caller decides, and t the
// emission interval (for the sweep schedule). It allocates only for a key
// it remembers anew.
func (k *keys[V]) get(now, t int64, key string) *entry[V] {
	if key == "" {
		return &k.def
	}
	if len(key) > MaxKeyLen {
		k.overflow.Add(1)
		return &k.over
	}
	h := maphash.String(k.seed, key) | 1 // 0 marks an empty slot
	if e := k.tab.Load().find(h, key); e != nil {
		return e
	}
	return k.insert(now, t, h, key)
}

// insert is get's slow path, for a key not found in the table.
func (k *keys[V]) insert(now, t int64, h uint64, key string) *entry[V] {
	k.mu.Lock()
	defer k.mu.Unlock()
	tab := k.tab.Load()
	if e := tab.find(h, key); e != nil { // added meanwhile
		return e
	}
	if tab.n >= k.max {
		if now >= k.nextSweep {
			tab = k.rebuild(now, len(tab.slots), true)
		}
		if tab.n >= k.max {
			k.overflow.Add(1)
			return &k.over
		}
	}
	if 2*(tab.n+1) > len(tab.slots) {
		tab = k.rebuild(now, 2*len(tab.slots), false) // below the bound, the table stays at most half full
	}
	e := newEntry[V](key)
	tab.put(h, e)
	k.nextSweep = min(k.nextSweep, now+t)
	return e
}

// rebuild replaces the table by one of size slots holding the same
// entries, less, when sweep is set, the idle ones, which forget marks dead
// first (a decision that races with the sweep either moves the entry
// first, and it stays, or finds it dead and looks its key up again). It
// sets nextSweep after a sweep. The caller holds mu.
func (k *keys[V]) rebuild(now int64, size int, sweep bool) *table[V] {
	old := k.tab.Load()
	nt := newTable[V](size)
	next := int64(math.MaxInt64)
	for i := range old.slots {
		h := old.slots[i].hash.Load()
		if h == 0 {
			continue
		}
		e := old.slots[i].e.Load()
		if sweep {
			forgotten, idleAt := k.forget(e, now)
			if forgotten {
				continue
			}
			next = min(next, idleAt)
		}
		nt.put(h, e)
	}
	if sweep {
		k.nextSweep = next
	}
	k.tab.Store(nt)
	return nt
}

// len returns the keys remembered.
func (k *keys[V]) len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.tab.Load().n
}
