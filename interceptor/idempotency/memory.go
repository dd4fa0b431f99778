package idempotency

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// Defaults of [NewMemoryStore].
const (
	DefaultMaxEntries     = 100_000
	DefaultMaxBytes       = 64 << 20
	DefaultMaxRecordBytes = 1 << 20
	DefaultShards         = 16
	// DefaultMinRetention is how long a completed record is kept at least
	// (or until its TTL, if shorter) before it may be evicted for room.
	DefaultMinRetention = time.Minute
)

// entryOverhead is the heap an entry holds besides its strings and record:
// its slot in the shard's slice (which grows by a quarter at a time, so a
// quarter more on average at worst) and its index map slot (8 bytes, with
// the control byte and load factor of the map, and its doubling).
const entryOverhead = int(unsafe.Sizeof(memEntry{}))*5/4 + 24

// MemoryOption configures [NewMemoryStore].
type MemoryOption interface{ apply(*memoryOptions) }

type memoryOptions struct {
	maxEntries     int
	maxBytes       int64
	maxRecordBytes int
	shards         int
	minRetention   time.Duration
	scopeEntries   int   // 0: no per-scope bound
	scopeBytes     int64 // 0: no per-scope bound
	quotaSet       bool
	now            func() time.Time // nil: the monotonic clock
	nowSet         bool
}

type memoryOptionFunc func(*memoryOptions)

func (f memoryOptionFunc) apply(o *memoryOptions) { f(o) }

// WithMaxEntries bounds the number of keys held, in progress or completed
// (default DefaultMaxEntries). Each shard holds at most n/shards.
func WithMaxEntries(n int) MemoryOption {
	return memoryOptionFunc(func(o *memoryOptions) { o.maxEntries = n })
}

// WithMaxBytes bounds the heap held by the store's entries (default
// DefaultMaxBytes): each record as [Record.Size] estimates it, plus each
// entry's slot, index and key strings, rounded as the Go allocator rounds
// them; within 20% of what runtime.MemStats measures. Each shard holds at
// most n/shards, checked when a key is claimed (see the package
// documentation).
func WithMaxBytes(n int64) MemoryOption {
	return memoryOptionFunc(func(o *memoryOptions) { o.maxBytes = n })
}

// WithMaxRecordBytes bounds the size of one record, as [Record.Size]
// estimates it (default DefaultMaxRecordBytes). Complete refuses larger
// records with ErrRecordTooLarge.
func WithMaxRecordBytes(n int) MemoryOption {
	return memoryOptionFunc(func(o *memoryOptions) { o.maxRecordBytes = n })
}

// WithMinRetention sets how long a completed record is kept at least
// before it may be evicted to make room (default DefaultMinRetention),
// unless its TTL is shorter. When room is needed and every completed record
// that could go is younger, the store refuses new claims (a [*FullError])
// rather than evict one: a duplicate within the minimum retention never runs
// again because others filled the store. 0 evicts the oldest record as soon
// as room is needed, as a cache does.
func WithMinRetention(d time.Duration) MemoryOption {
	return memoryOptionFunc(func(o *memoryOptions) { o.minRetention = d })
}

// WithScopeQuota bounds what one scope ([RecordKey.Scope], one caller or
// tenant) holds: at most entries keys, in progress or completed, and
// about bytes bytes, counted as [WithMaxBytes] counts them. 0 leaves that
// bound off; WithScopeQuota(0, 0) turns the quota off, so that the store's
// bounds apply to all scopes together.
//
// By default a scope holds at most a quarter of the store: a quarter of
// its entries and of its bytes (with the defaults, 25,000 entries and
// 16 MiB). What it protects: one caller's flood of unique keys (or a bug
// that makes a key per attempt) fills at most a quarter of the store, and
// every other scope keeps claiming keys. The cost: one scope can never use
// more than that quarter. A server with one scope for every caller
// (server.SharedScope), or with one heavy tenant, sets
// the quota it wants, or WithScopeQuota(0, 0) to let a scope use the whole
// store (the risk: one scope can then fill it, and every scope's new
// claims are refused until records age past the minimum retention).
//
// A claim that would pass its scope's quota first drops the scope's ended
// entries and evicts its own oldest completed records past the minimum
// retention ([WithMinRetention]); if the quota is still full, the claim is
// refused with a [*FullError] that wraps ErrScopeFull and says when to
// retry, and no other scope's record is touched. Like the other bounds, the
// quota is split among the shards: each holds at most entries/shards keys
// and bytes/shards bytes of one scope, so a scope is refused somewhat before
// it reaches the quota when its keys hash unevenly.
func WithScopeQuota(entries int, bytes int64) MemoryOption {
	return memoryOptionFunc(func(o *memoryOptions) { o.scopeEntries, o.scopeBytes, o.quotaSet = entries, bytes, true })
}

// WithShards sets the number of shards, each with its own lock and its share
// of the bounds (default DefaultShards).
func WithShards(n int) MemoryOption {
	return memoryOptionFunc(func(o *memoryOptions) { o.shards = n })
}

// WithNow sets the clock the store reads (default time.Now). Tests pass a
// fake clock's Now.
func WithNow(now func() time.Time) MemoryOption {
	return memoryOptionFunc(func(o *memoryOptions) { o.now, o.nowSet = now, true })
}

// MemoryStore is a Store in process memory: the embedded default for a
// single replica. See the package documentation for its bounds and eviction.
//
// Layout: each shard keeps its entries in one slice of slots, indexed by a
// map from 32 bits of a seeded hash of the record key to the first slot
// with those bits; such slots are chained and compared by their full key.
// The map holds no pointers, a slot holds a fingerprint of up to 32 bytes
// inline, and owner tokens are carved from shared chunks, so claiming and
// completing a key allocate nothing (but a chunk per 256 claims) and the
// garbage collector has few objects to mark however many entries are held:
// a slot points at the caller's key strings and record, nothing else.
type MemoryStore struct {
	clock          func() int64 // nanoseconds since the store was made
	maxRecordBytes int
	minRetention   time.Duration
	seed           maphash.Seed
	shards         []memShard
	testHash       func(RecordKey) uint64 // set by tests to force collisions; nil otherwise
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
		minRetention:   DefaultMinRetention,
	}
	for _, opt := range opts {
		opt.apply(&o)
	}
	if err := o.checkQuota(); err != nil {
		return nil, err
	}
	if !o.quotaSet && o.shards > 0 {
		// A quarter of the store, and never below what checkQuota asks of
		// an explicit quota.
		o.scopeEntries = max(o.maxEntries/4, o.shards)
		o.scopeBytes = max(o.maxBytes/4, int64(o.shards)*int64(4*entryOverhead))
	}
	switch {
	case o.shards < 1:
		return nil, fmt.Errorf("idempotency: shards %d: must be positive", o.shards)
	case o.maxEntries < o.shards:
		return nil, fmt.Errorf("idempotency: max entries %d: must be at least the number of shards (%d)", o.maxEntries, o.shards)
	case o.maxEntries/o.shards > math.MaxInt32:
		return nil, fmt.Errorf("idempotency: max entries %d: at most %d per shard", o.maxEntries, math.MaxInt32)
	case o.maxRecordBytes < 1:
		return nil, fmt.Errorf("idempotency: max record bytes %d: must be positive", o.maxRecordBytes)
	case o.maxBytes/int64(o.shards) < int64(o.maxRecordBytes+entryOverhead):
		return nil, fmt.Errorf("idempotency: max bytes %d: each of the %d shards must hold a record of max record bytes (%d) plus %d",
			o.maxBytes, o.shards, o.maxRecordBytes, entryOverhead)
	case o.nowSet && o.now == nil:
		return nil, errors.New("idempotency: now: must not be nil")
	}
	s := &MemoryStore{
		maxRecordBytes: o.maxRecordBytes,
		minRetention:   o.minRetention,
		seed:           maphash.MakeSeed(),
		shards:         make([]memShard, o.shards),
	}
	if now := o.now; now != nil {
		base := now()
		s.clock = func() int64 { return int64(now().Sub(base)) }
	} else {
		// time.Since reads only the monotonic clock: half the cost of
		// time.Now.
		base := time.Now()
		s.clock = func() int64 { return int64(time.Since(base)) }
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.index = make(map[uint32]int32)
		sh.free = -1
		sh.leases = memList{-1, -1}
		sh.records = memList{-1, -1}
		sh.maxEntries = o.maxEntries / o.shards
		sh.maxBytes = o.maxBytes / int64(o.shards)
		if o.scopeEntries > 0 || o.scopeBytes > 0 {
			sh.scopes = make(map[string]*memScope)
			sh.scopeEntries, sh.scopeBytes = math.MaxInt, math.MaxInt64
			if o.scopeEntries > 0 {
				sh.scopeEntries = o.scopeEntries / o.shards
			}
			if o.scopeBytes > 0 {
				sh.scopeBytes = o.scopeBytes / int64(o.shards)
			}
		}
	}
	return s, nil
}

// checkQuota validates the minimum retention and the scope quota.
func (o *memoryOptions) checkQuota() error {
	switch {
	case o.minRetention < 0:
		return fmt.Errorf("idempotency: min retention %v: must not be negative", o.minRetention)
	case o.quotaSet && (o.scopeEntries < 0 || o.scopeBytes < 0):
		return fmt.Errorf("idempotency: scope quota %d entries, %d bytes: must not be negative", o.scopeEntries, o.scopeBytes)
	case o.scopeEntries > 0 && o.shards > 0 && o.scopeEntries < o.shards:
		return fmt.Errorf("idempotency: scope quota %d entries: must be at least the number of shards (%d)", o.scopeEntries, o.shards)
	case o.scopeBytes > 0 && o.shards > 0 && o.scopeBytes/int64(o.shards) < int64(4*entryOverhead):
		return fmt.Errorf("idempotency: scope quota %d bytes: each of the %d shards must hold %d", o.scopeBytes, o.shards, 4*entryOverhead)
	}
	return nil
}

// memScope is what one scope holds in one shard, when scope quotas are
// on. Guarded by the shard's lock.
type memScope struct {
	entries int
	bytes   int64
	records memList // the scope's completed slots, oldest first, linked by sprev and snext
}

// memEntry is one key, in a slot of its shard. Fields are guarded by the
// shard's lock. A free slot is zero but for its links, and next links the
// free list.
type memEntry struct {
	key     RecordKey // the caller's strings, not copied
	token   string    // owner token while in progress; "" once completed
	fpLong  string    // a copy of the fingerprint when longer than fpInline
	rec     *Record   // nil while in progress
	fp      [fpInline]byte
	fpLen   int32  // length of the fingerprint, or fpInline+1 when in fpLong
	tag     uint32 // of key's hash; sh.index leads to the slot through the chain
	expires int64  // store clock: end of the lease while in progress, of the TTL once completed
	young   int64  // store clock: once completed, the record is not evicted for room before this
	size    int64  // bytes counted against the shard
	// scope is the entry's scope's account when scope quotas are on, else
	// nil; sprev and snext link a completed slot in scope.records.
	scope        *memScope
	sprev, snext int32
	// prev and next link the slot in the shard's leases list while in
	// progress, its records list once completed, or (next only) the free
	// list. chain is the next slot with the same hash. -1 ends each.
	prev, next, chain int32
}

// fpInline is the longest fingerprint a slot holds without allocating: a
// SHA-256.
const fpInline = 32

func (e *memEntry) sameFingerprint(fp []byte) bool {
	if len(fp) <= fpInline {
		return int(e.fpLen) == len(fp) && string(e.fp[:len(fp)]) == string(fp)
	}
	return e.fpLen > fpInline && e.fpLong == string(fp)
}

func (e *memEntry) is(k RecordKey) bool {
	return e.key.Key == k.Key && e.key.FullMethod == k.FullMethod && e.key.Scope == k.Scope
}

// memList is a doubly linked list of slots in insertion order, oldest first.
type memList struct{ head, tail int32 } // -1 when empty

type memShard struct {
	mu         sync.Mutex
	index      map[uint32]int32 // tag of the record key's hash -> first slot of its chain; guarded by mu
	slots      []memEntry       // guarded by mu; len(slots) <= maxEntries
	free       int32            // first free slot, -1 when none; guarded by mu
	leases     memList          // in-progress slots, in claim order; guarded by mu
	records    memList          // completed slots, in completion order; guarded by mu
	n          int              // slots in use; guarded by mu
	bytes      int64            // sum of the entries' sizes; guarded by mu
	tokens     memTokens        // guarded by mu
	maxEntries int              // immutable
	maxBytes   int64            // immutable
	// scopes holds the scopes' accounts when scope quotas are on, else nil;
	// an account is dropped with the scope's last entry. Guarded by mu.
	scopes       map[string]*memScope
	scopeEntries int    // immutable
	scopeBytes   int64  // immutable
	evicted      uint64 // completed records evicted for room before their TTL; guarded by mu
	refused      uint64 // claims refused for room; guarded by mu
}

func (s *MemoryStore) hash(k RecordKey) uint64 {
	if s.testHash != nil {
		return s.testHash(k)
	}
	return maphash.Comparable(s.seed, k)
}

// hashTag is the part of a record key's hash that indexes its shard: the
// high half, as the low half picks the shard. Half a hash keeps the index
// small; a collision only lengthens a chain.
func hashTag(h uint64) uint32 { return uint32(h >> 32) }

func (s *MemoryStore) shard(h uint64) *memShard {
	return &s.shards[h%uint64(len(s.shards))]
}

// deadline returns now+d, saturated.
func deadline(now int64, d time.Duration) int64 {
	if d > 0 && now > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return now + int64(d)
}

// Claim implements Store.
func (s *MemoryStore) Claim(_ context.Context, key RecordKey, fingerprint []byte, lease time.Duration) (Claim, error) {
	h := s.hash(key)
	now := s.clock()
	sh := s.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if i := sh.live(h, key, now); i >= 0 {
		e := &sh.slots[i]
		switch {
		case !e.sameFingerprint(fingerprint):
			return Claim{State: Mismatch}, nil
		case e.rec != nil:
			return Claim{State: Completed, Record: e.rec}, nil
		}
		return Claim{State: InProgress, RetryAfter: time.Duration(e.expires - now)}, nil
	}
	size := entrySize(key, fingerprint)
	if sh.scopes != nil {
		if err := sh.scopeRoom(now, key.Scope, size, s.minRetention); err != nil {
			return Claim{}, err
		}
	}
	if !sh.makeRoom(now, 1, size) {
		sh.refused++
		return Claim{}, &FullError{RetryAfter: sh.retryHint(now, nil, s.minRetention),
			msg: fmt.Sprintf("a shard holds %d keys, in progress or younger than the minimum retention", sh.n)}
	}
	i := sh.insert(h, key, fingerprint, size, deadline(now, lease))
	return Claim{State: Owned, Token: sh.slots[i].token}, nil
}

// insert adds an in-progress entry for key, whose hash is h, with a fresh
// token, counted as size bytes, its lease ending at expires; the caller has
// made room. It returns its slot.
func (sh *memShard) insert(h uint64, key RecordKey, fingerprint []byte, size, expires int64) int32 {
	i := sh.alloc()
	e := &sh.slots[i]
	*e = memEntry{
		key:     key,
		token:   sh.tokens.next(),
		fpLen:   int32(min(len(fingerprint), fpInline+1)),
		tag:     hashTag(h),
		expires: expires,
		size:    size,
		chain:   -1,
	}
	if len(fingerprint) <= fpInline {
		copy(e.fp[:], fingerprint)
	} else {
		e.fpLong = string(fingerprint)
	}
	if first, ok := sh.index[e.tag]; ok {
		e.chain = first
	}
	sh.index[e.tag] = i
	sh.n++
	sh.bytes += size
	sh.pushBack(&sh.leases, i)
	if sh.scopes != nil {
		sc := sh.scopes[key.Scope]
		if sc == nil {
			sc = &memScope{records: memList{-1, -1}}
			sh.scopes[key.Scope] = sc
		}
		e.scope = sc
		sc.entries++
		sc.bytes += size
	}
	return i
}

// entrySize is the heap an entry of key holds before it completes: its
// overhead and its strings, the key and scope that the caller allocated and
// the fingerprint when it does not fit the slot. The full method is not
// counted: it is the generated code's constant, shared by every call.
func entrySize(key RecordKey, fingerprint []byte) int64 {
	n := entryOverhead + heapBytes(len(key.Scope)) + heapBytes(len(key.Key))
	if len(fingerprint) > fpInline {
		n += heapBytes(len(fingerprint))
	}
	return int64(n)
}

// Complete implements Store. When key is absent (the owner's lease ended
// and no one claimed it since), it adds the record if the shard, and the
// caller's scope quota, have room for one more entry, and otherwise returns
// a *FullError.
func (s *MemoryStore) Complete(_ context.Context, key RecordKey, token string, rec *Record, ttl time.Duration) error {
	recSize := rec.Size()
	h := s.hash(key)
	now := s.clock()
	sh := s.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.owned(h, key, token, now)
	if i < 0 {
		if sh.live(h, key, now) >= 0 {
			return ErrNotOwner
		}
		if recSize > s.maxRecordBytes {
			return fmt.Errorf("%w: %d bytes, bound %d", ErrRecordTooLarge, recSize, s.maxRecordBytes)
		}
		size := entrySize(key, rec.Fingerprint)
		if sh.scopes != nil {
			// As a claim would: the caller's scope may not grow past its
			// quota by letting its leases end before completing.
			if err := sh.scopeRoom(now, key.Scope, size, s.minRetention); err != nil {
				return err
			}
		}
		if !sh.makeRoom(now, 1, size) {
			sh.refused++
			return &FullError{RetryAfter: sh.retryHint(now, nil, s.minRetention), msg: "no room to store the outcome of a call whose lease ended"}
		}
		i = sh.insert(h, key, rec.Fingerprint, size, now)
	}
	if recSize > s.maxRecordBytes {
		return fmt.Errorf("%w: %d bytes, bound %d", ErrRecordTooLarge, recSize, s.maxRecordBytes)
	}
	// Unlink the entry while making room, so that it is not evicted for
	// itself; it keeps its slot, already counted. The record is stored even
	// when no record can be evicted (all younger than the minimum
	// retention): the handler has run, and refusing its outcome would run it
	// again. Claims are refused while the shard or the scope is over its
	// bound, so the excess is at most the records of the calls in flight.
	// The scope evicts its own records first, as a claim does, so that the
	// shard's bound evicts another scope's only when that was not enough.
	sh.unlink(&sh.leases, i)
	e := &sh.slots[i]
	if sc := e.scope; sc != nil {
		sh.scopeEvict(now, sc, 0, int64(recSize))
	}
	sh.makeRoom(now, 0, int64(recSize)) // removes entries only: e stays valid
	if sc := e.scope; sc != nil {
		sc.bytes += int64(recSize)
		sh.scopePush(sc, i)
	}
	e.token, e.rec, e.expires = "", rec, deadline(now, ttl)
	e.young = deadline(now, s.minRetention)
	e.size += int64(recSize)
	sh.bytes += int64(recSize)
	sh.pushBack(&sh.records, i)
	return nil
}

// Renew implements Store.
func (s *MemoryStore) Renew(_ context.Context, key RecordKey, token string, lease time.Duration) error {
	sh, i, now := s.lockOwned(key, token)
	defer sh.mu.Unlock()
	if i < 0 {
		return ErrNotOwner
	}
	sh.slots[i].expires = deadline(now, lease)
	// Keep the list in claim-or-renewal order, so that ended leases are
	// found at its head.
	sh.unlink(&sh.leases, i)
	sh.pushBack(&sh.leases, i)
	return nil
}

// Release implements Store.
func (s *MemoryStore) Release(_ context.Context, key RecordKey, token string) error {
	sh, i, _ := s.lockOwned(key, token)
	defer sh.mu.Unlock()
	if i < 0 {
		return ErrNotOwner
	}
	sh.remove(i)
	return nil
}

// lockOwned locks the shard of key and finds the live in-progress entry that
// token owns: its slot, or -1. The caller unlocks sh.mu.
func (s *MemoryStore) lockOwned(key RecordKey, token string) (sh *memShard, i int32, now int64) {
	h := s.hash(key)
	now = s.clock()
	sh = s.shard(h)
	sh.mu.Lock()
	return sh, sh.owned(h, key, token, now), now
}

// Len returns the number of keys held, in progress or completed, including
// expired ones not yet dropped.
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

// MemoryStats are a MemoryStore's counts, as [MemoryStore.Stats] returns them.
type MemoryStats struct {
	// Entries is the number of keys held, in progress or completed,
	// including ended ones not yet dropped.
	Entries int
	// Bytes is the bytes counted against the bounds.
	Bytes int64
	// Evicted counts the completed records dropped to make room before their
	// TTL ended, since the store was made. A duplicate of an evicted call
	// runs it again.
	Evicted uint64
	// Refused counts the claims refused for room (a [*FullError]): the store,
	// a shard or a scope was full of live leases and records younger than
	// the minimum retention.
	Refused uint64
}

// Stats returns the store's counts. It locks each shard in turn, so the
// counts of different shards may be from slightly different instants.
func (s *MemoryStore) Stats() MemoryStats {
	var st MemoryStats
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Entries += sh.n
		st.Bytes += sh.bytes
		st.Evicted += sh.evicted
		st.Refused += sh.refused
		sh.mu.Unlock()
	}
	return st
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

// lookup returns the slot of key, whose hash is h, or -1.
func (sh *memShard) lookup(h uint64, key RecordKey) int32 {
	i, ok := sh.index[hashTag(h)]
	if !ok {
		return -1
	}
	for ; i >= 0; i = sh.slots[i].chain {
		if sh.slots[i].is(key) {
			return i
		}
	}
	return -1
}

// live returns the slot of key if its entry has not expired at now,
// dropping the entry if it has, and -1 otherwise.
func (sh *memShard) live(h uint64, key RecordKey, now int64) int32 {
	i := sh.lookup(h, key)
	if i >= 0 && now >= sh.slots[i].expires {
		sh.remove(i)
		return -1
	}
	return i
}

// owned returns the slot of key's live in-progress entry if token owns it,
// and -1 otherwise.
func (sh *memShard) owned(h uint64, key RecordKey, token string, now int64) int32 {
	i := sh.live(h, key, now)
	if i < 0 || sh.slots[i].rec != nil || sh.slots[i].token != token {
		return -1
	}
	return i
}

// alloc returns a slot for a new entry: a free one, else a new one. It may
// move the slots: pointers to entries are invalid after it.
func (sh *memShard) alloc() int32 {
	if i := sh.free; i >= 0 {
		sh.free = sh.slots[i].next
		return i
	}
	sh.slots = append(sh.slots, memEntry{})
	return int32(len(sh.slots) - 1)
}

// remove drops the entry in slot i: from its list, its hash chain and the
// counts, and frees the slot.
func (sh *memShard) remove(i int32) {
	e := &sh.slots[i]
	if e.rec == nil {
		sh.unlink(&sh.leases, i)
	} else {
		sh.unlink(&sh.records, i)
	}
	if first := sh.index[e.tag]; first == i {
		if e.chain < 0 {
			delete(sh.index, e.tag)
		} else {
			sh.index[e.tag] = e.chain
		}
	} else {
		p := first
		for sh.slots[p].chain != i {
			p = sh.slots[p].chain
		}
		sh.slots[p].chain = e.chain
	}
	if sc := e.scope; sc != nil {
		if e.rec != nil {
			sh.scopeUnlink(sc, i)
		}
		sc.entries--
		sc.bytes -= e.size
		if sc.entries == 0 {
			delete(sh.scopes, e.key.Scope)
		}
	}
	sh.n--
	sh.bytes -= e.size
	*e = memEntry{next: sh.free, prev: -1, chain: -1}
	sh.free = i
}

func (sh *memShard) pushBack(l *memList, i int32) {
	e := &sh.slots[i]
	e.prev, e.next = l.tail, -1
	if l.tail >= 0 {
		sh.slots[l.tail].next = i
	} else {
		l.head = i
	}
	l.tail = i
}

func (sh *memShard) unlink(l *memList, i int32) {
	e := &sh.slots[i]
	if e.prev >= 0 {
		sh.slots[e.prev].next = e.next
	} else {
		l.head = e.next
	}
	if e.next >= 0 {
		sh.slots[e.next].prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = -1, -1
}

// makeRoom drops expired entries from the front of both lists, then evicts
// the oldest completed records past their minimum retention until n more
// entries of size bytes fit. Live leases and younger records are never
// evicted. It reports whether they fit.
func (sh *memShard) makeRoom(now int64, n int, size int64) bool {
	if sh.fits(n, size) {
		return true
	}
	for _, l := range [...]*memList{&sh.leases, &sh.records} {
		for i := l.head; i >= 0 && now >= sh.slots[i].expires; i = l.head {
			sh.remove(i)
		}
	}
	for !sh.fits(n, size) && sh.records.head >= 0 && now >= sh.slots[sh.records.head].young {
		sh.evict(sh.records.head)
	}
	if !sh.fits(n, size) {
		sh.dropEndedLeases(now)
	}
	return sh.fits(n, size)
}

// dropEndedLeases drops every lease that has ended: leases of different
// durations end out of order, so it looks at all.
func (sh *memShard) dropEndedLeases(now int64) {
	for i := sh.leases.head; i >= 0; {
		next := sh.slots[i].next
		if now >= sh.slots[i].expires {
			sh.remove(i)
		}
		i = next
	}
}

// evict drops the completed record in slot i for room, and counts it.
func (sh *memShard) evict(i int32) {
	sh.evicted++
	sh.remove(i)
}

func (sh *memShard) fits(n int, size int64) bool {
	return sh.n+n <= sh.maxEntries && sh.bytes+size <= sh.maxBytes
}

func (sh *memShard) scopeFits(sc *memScope, n int, size int64) bool {
	return sc.entries+n <= sh.scopeEntries && sc.bytes+size <= sh.scopeBytes
}

// scopeRoom makes room in the quota of the scope named for one more entry
// of size bytes, touching that scope's entries only: it drops the scope's
// ended records and evicts its oldest records past the minimum retention,
// then, if that is not enough, drops ended leases. It returns a
// [*FullError] wrapping ErrScopeFull when the quota stays full.
func (sh *memShard) scopeRoom(now int64, scope string, size int64, minRetention time.Duration) error {
	sc := sh.scopes[scope]
	if sc == nil {
		sc = &memScope{records: memList{-1, -1}} // empty, not stored
	}
	if sh.scopeFits(sc, 1, size) {
		return nil
	}
	sh.scopeEvict(now, sc, 1, size)
	if !sh.scopeFits(sc, 1, size) {
		sh.dropEndedLeases(now)
	}
	if sh.scopeFits(sc, 1, size) {
		return nil
	}
	sh.refused++
	return &FullError{Scope: true, RetryAfter: sh.retryHint(now, sc, minRetention),
		msg: fmt.Sprintf("the caller's scope holds %d keys and %d bytes in this shard, its quota %d and %d",
			sc.entries, sc.bytes, sh.scopeEntries, sh.scopeBytes)}
}

// scopeEvict drops the scope's ended records and evicts its oldest records
// past their minimum retention, from the front of its list, until n more
// entries of size bytes fit its quota. When the scope's last entry goes,
// its account leaves the map; sc then stays empty.
func (sh *memShard) scopeEvict(now int64, sc *memScope, n int, size int64) {
	for i := sc.records.head; i >= 0 && !sh.scopeFits(sc, n, size); i = sc.records.head {
		switch e := &sh.slots[i]; {
		case now >= e.expires:
			sh.remove(i)
		case now >= e.young:
			sh.evict(i)
		default:
			return
		}
	}
}

// retryHint is when a refused claim may find room: when the oldest record
// of the scope sc (or of the shard, sc nil) passes its minimum retention,
// or when the oldest lease of the shard ends, whichever comes first; at
// least a millisecond, and the minimum retention when nothing is known.
func (sh *memShard) retryHint(now int64, sc *memScope, minRetention time.Duration) time.Duration {
	hint := int64(minRetention)
	records := &sh.records
	if sc != nil {
		records = &sc.records
	}
	if i := records.head; i >= 0 {
		hint = min(hint, sh.slots[i].young-now)
	}
	if i := sh.leases.head; i >= 0 {
		hint = min(hint, sh.slots[i].expires-now)
	}
	return max(time.Duration(hint), time.Millisecond)
}

func (sh *memShard) scopePush(sc *memScope, i int32) {
	e := &sh.slots[i]
	e.sprev, e.snext = sc.records.tail, -1
	if sc.records.tail >= 0 {
		sh.slots[sc.records.tail].snext = i
	} else {
		sc.records.head = i
	}
	sc.records.tail = i
}

func (sh *memShard) scopeUnlink(sc *memScope, i int32) {
	e := &sh.slots[i]
	if e.sprev >= 0 {
		sh.slots[e.sprev].snext = e.snext
	} else {
		sc.records.head = e.snext
	}
	if e.snext >= 0 {
		sh.slots[e.snext].sprev = e.sprev
	} else {
		sc.records.tail = e.sprev
	}
	e.sprev, e.snext = -1, -1
}

// memTokens hands out the owner tokens of a shard: a counter, as 13 base-32
// digits, so no token repeats. They are carved from chunks of
// memTokenChunk tokens, one allocation each; a chunk is freed once none of
// its tokens is held.
type memTokens struct {
	n     uint64 // tokens handed out
	chunk string // the current chunk; tokens n-n%memTokenChunk on
}

const (
	memTokenLen   = 13  // base-32 digits of a uint64
	memTokenChunk = 256 // a power of two up to 32*32: the tokens of a chunk differ in their last two digits only
	memDigits     = "0123456789abcdefghijklmnopqrstuv"
)

func (t *memTokens) next() string {
	i := int(t.n % memTokenChunk)
	if i == 0 {
		var d [memTokenLen]byte
		v := t.n
		for k := memTokenLen - 1; k >= 0; k-- {
			d[k] = memDigits[v&31]
			v >>= 5
		}
		var b strings.Builder
		b.Grow(memTokenLen * memTokenChunk)
		for j := range uint64(memTokenChunk) {
			v := t.n + j // t.n is a multiple of the chunk: only the last two digits change
			d[memTokenLen-2], d[memTokenLen-1] = memDigits[(v>>5)&31], memDigits[v&31]
			b.Write(d[:])
		}
		t.chunk = b.String()
	}
	t.n++
	return t.chunk[i*memTokenLen : (i+1)*memTokenLen]
}
