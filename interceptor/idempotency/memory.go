package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of [NewMemoryStore].
const (
	DefaultMaxEntries     = 100_000
	DefaultMaxBytes       = 64 << 20
	DefaultMaxRecordBytes = 1 << 20
	DefaultShards         = 16
)

// entryOverhead is the bytes counted for an entry besides its key,
// fingerprint and record: map slot, list links, times.
const entryOverhead = 128

// MemoryOption configures [NewMemoryStore].
type MemoryOption interface{ apply(*memoryOptions) }

type memoryOptions struct {
	maxEntries     int
	maxBytes       int64
	maxRecordBytes int
	shards         int
	now            func() time.Time
}

type memoryOptionFunc func(*memoryOptions)

func (f memoryOptionFunc) apply(o *memoryOptions) { f(o) }

// WithMaxEntries bounds the number of keys held, in progress or completed
// (default DefaultMaxEntries). Each shard holds at most n/shards.
func WithMaxEntries(n int) MemoryOption {
	return memoryOptionFunc(func(o *memoryOptions) { o.maxEntries = n })
}

// WithMaxBytes bounds the bytes held by keys, fingerprints and records, as
// estimated by [Record.Size] plus a fixed overhead per entry (default
// DefaultMaxBytes). Each shard holds at most n/shards.
func WithMaxBytes(n int64) MemoryOption {
	return memoryOptionFunc(func(o *memoryOptions) { o.maxBytes = n })
}

// WithMaxRecordBytes bounds the size of one record, as [Record.Size]
// estimates it (default DefaultMaxRecordBytes). Complete refuses larger
// records with ErrRecordTooLarge.
func WithMaxRecordBytes(n int) MemoryOption {
	return memoryOptionFunc(func(o *memoryOptions) { o.maxRecordBytes = n })
}

// WithShards sets the number of shards, each with its own lock and its share
// of the bounds (default DefaultShards).
func WithShards(n int) MemoryOption {
	return memoryOptionFunc(func(o *memoryOptions) { o.shards = n })
}

// WithNow sets the clock the store reads (default time.Now). Tests pass a
// fake clock's Now.
func WithNow(now func() time.Time) MemoryOption {
	return memoryOptionFunc(func(o *memoryOptions) { o.now = now })
}

// MemoryStore is a Store in process memory: the embedded default for a
// single replica. See the package documentation for its bounds and eviction.
type MemoryStore struct {
	now            func() time.Time
	maxRecordBytes int
	seed           maphash.Seed
	shards         []memShard
	tokens         atomic.Uint64 // last token handed out; tokens are never reused
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore. It returns an error when a
// bound is not positive, when a shard could not hold one entry, or when a
// shard's byte bound is below the record bound.
func NewMemoryStore(opts ...MemoryOption) (*MemoryStore, error) {
	o := memoryOptions{
		maxEntries:     DefaultMaxEntries,
		maxBytes:       DefaultMaxBytes,
		maxRecordBytes: DefaultMaxRecordBytes,
		shards:         DefaultShards,
		now:            time.Now,
	}
	for _, opt := range opts {
		opt.apply(&o)
	}
	switch {
	case o.shards < 1:
		return nil, fmt.Errorf("idempotency: shards %d: must be positive", o.shards)
	case o.maxEntries < o.shards:
		return nil, fmt.Errorf("idempotency: max entries %d: must be at least the number of shards (%d)", o.maxEntries, o.shards)
	case o.maxRecordBytes < 1:
		return nil, fmt.Errorf("idempotency: max record bytes %d: must be positive", o.maxRecordBytes)
	case o.maxBytes/int64(o.shards) < int64(o.maxRecordBytes)+entryOverhead:
		return nil, fmt.Errorf("idempotency: max bytes %d: each of the %d shards must hold a record of max record bytes (%d) plus %d",
			o.maxBytes, o.shards, o.maxRecordBytes, entryOverhead)
	case o.now == nil:
		return nil, errors.New("idempotency: now: must not be nil")
	}
	s := &MemoryStore{
		now:            o.now,
		maxRecordBytes: o.maxRecordBytes,
		seed:           maphash.MakeSeed(),
		shards:         make([]memShard, o.shards),
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.entries = make(map[RecordKey]*memEntry)
		sh.maxEntries = o.maxEntries / o.shards
		sh.maxBytes = o.maxBytes / int64(o.shards)
		sh.leases.init()
		sh.records.init()
	}
	return s, nil
}

// memEntry is one key. Fields are guarded by the shard's lock.
type memEntry struct {
	key         RecordKey
	fingerprint []byte    // a copy of the claimer's fingerprint
	token       string    // owner token while in progress; "" once completed
	expires     time.Time // end of the lease while in progress, of the TTL once completed
	rec         *Record   // nil while in progress
	size        int64     // bytes counted against the shard
	prev, next  *memEntry // links in the shard's leases or records list
}

// memList is a circular doubly linked list of entries in insertion order,
// oldest first, with a sentinel.
type memList struct{ root memEntry }

func (l *memList) init()            { l.root.next, l.root.prev = &l.root, &l.root }
func (l *memList) front() *memEntry { return l.root.next }
func (l *memList) end() *memEntry   { return &l.root }

func (l *memList) pushBack(e *memEntry) {
	e.prev, e.next = l.root.prev, &l.root
	l.root.prev.next = e
	l.root.prev = e
}

func unlink(e *memEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

type memShard struct {
	mu         sync.Mutex
	entries    map[RecordKey]*memEntry // guarded by mu
	leases     memList                 // in-progress entries, in claim order; guarded by mu
	records    memList                 // completed entries, in completion order; guarded by mu
	bytes      int64                   // sum of the entries' sizes; guarded by mu
	maxEntries int                     // immutable
	maxBytes   int64                   // immutable
}

func (s *MemoryStore) shard(k RecordKey) *memShard {
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteString(k.Scope)
	h.WriteByte(0)
	h.WriteString(k.FullMethod)
	h.WriteByte(0)
	h.WriteString(k.Key)
	return &s.shards[h.Sum64()%uint64(len(s.shards))]
}

// Claim implements Store.
func (s *MemoryStore) Claim(_ context.Context, key RecordKey, fingerprint []byte, lease time.Duration) (Claim, error) {
	now := s.now()
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.live(key, now); e != nil {
		switch {
		case !bytes.Equal(e.fingerprint, fingerprint):
			return Claim{State: Mismatch}, nil
		case e.rec != nil:
			return Claim{State: Completed, Record: e.rec}, nil
		}
		return Claim{State: InProgress, RetryAfter: e.expires.Sub(now)}, nil
	}
	size := int64(entryOverhead + len(key.Scope) + len(key.FullMethod) + len(key.Key) + len(fingerprint))
	if !sh.makeRoom(now, 1, size) {
		return Claim{}, fmt.Errorf("%w: %d keys in progress", ErrStoreFull, len(sh.entries))
	}
	e := &memEntry{
		key:         key,
		fingerprint: bytes.Clone(fingerprint),
		token:       strconv.FormatUint(s.tokens.Add(1), 36),
		expires:     now.Add(lease),
		size:        size,
	}
	sh.entries[key] = e
	sh.bytes += size
	sh.leases.pushBack(e)
	return Claim{State: Owned, Token: e.token}, nil
}

// Complete implements Store.
func (s *MemoryStore) Complete(_ context.Context, key RecordKey, token string, rec *Record, ttl time.Duration) error {
	recSize := rec.Size()
	now := s.now()
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.owned(key, token, now)
	if e == nil {
		return ErrNotOwner
	}
	if recSize > s.maxRecordBytes {
		return fmt.Errorf("%w: %d bytes, bound %d", ErrRecordTooLarge, recSize, s.maxRecordBytes)
	}
	// Unlink e while making room, so that it is not evicted for itself; it
	// keeps its map slot, already counted.
	unlink(e)
	if !sh.makeRoom(now, 0, int64(recSize)) {
		sh.leases.pushBack(e) // the caller still owns the claim
		return fmt.Errorf("%w: no room for a record of %d bytes", ErrStoreFull, recSize)
	}
	e.token, e.rec, e.expires = "", rec, now.Add(ttl)
	e.size += int64(recSize)
	sh.bytes += int64(recSize)
	sh.records.pushBack(e)
	return nil
}

// Release implements Store.
func (s *MemoryStore) Release(_ context.Context, key RecordKey, token string) error {
	now := s.now()
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.owned(key, token, now)
	if e == nil {
		return ErrNotOwner
	}
	sh.remove(e)
	return nil
}

// Len returns the number of keys held, in progress or completed, including
// expired ones not yet dropped.
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.entries)
		sh.mu.Unlock()
	}
	return n
}

// Bytes returns the bytes counted against the bound, including expired
// entries not yet dropped.
func (s *MemoryStore) Bytes() int64 {
	var n int64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.bytes
		sh.mu.Unlock()
	}
	return n
}

// live returns key's entry if it has not expired at now, dropping it if it
// has.
func (sh *memShard) live(key RecordKey, now time.Time) *memEntry {
	e := sh.entries[key]
	if e != nil && !now.Before(e.expires) {
		sh.remove(e)
		return nil
	}
	return e
}

// owned returns key's live in-progress entry if token owns it.
func (sh *memShard) owned(key RecordKey, token string, now time.Time) *memEntry {
	e := sh.live(key, now)
	if e == nil || e.rec != nil || e.token != token {
		return nil
	}
	return e
}

func (sh *memShard) remove(e *memEntry) {
	delete(sh.entries, e.key)
	sh.bytes -= e.size
	unlink(e)
}

// makeRoom drops expired entries from the front of both lists, then evicts
// the oldest completed records until n more entries of size bytes fit. Live
// leases are never evicted. It reports whether they fit.
func (sh *memShard) makeRoom(now time.Time, n int, size int64) bool {
	fits := func() bool { return len(sh.entries)+n <= sh.maxEntries && sh.bytes+size <= sh.maxBytes }
	if fits() {
		return true
	}
	for _, l := range []*memList{&sh.leases, &sh.records} {
		for e := l.front(); e != l.end() && !now.Before(e.expires); e = l.front() {
			sh.remove(e)
		}
	}
	for !fits() && sh.records.front() != sh.records.end() {
		sh.remove(sh.records.front())
	}
	if !fits() {
		// Leases of different durations expire out of order: look at all.
		for e := sh.leases.front(); e != sh.leases.end(); {
			next := e.next
			if !now.Before(e.expires) {
				sh.remove(e)
			}
			e = next
		}
	}
	return fits()
}
