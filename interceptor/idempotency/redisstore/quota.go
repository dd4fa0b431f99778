package redisstore

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// Defaults of the per-scope quota (see [WithScopeQuota]).
const (
	// DefaultScopeBytes is a scope's byte quota when the server's
	// maxmemory is not known (New, CONFIG disabled) or not set.
	DefaultScopeBytes = 64 << 20
	// DefaultMinRetention is how long a completed record is kept at least
	// before its scope may evict it to make room within its quota (or
	// until its TTL, if shorter).
	DefaultMinRetention = time.Minute
	// DefaultClusterScopePartitions is the number of partitions of a scope
	// on a *redis.ClusterClient (see WithScopePartitions); on any other
	// client a scope is one partition.
	DefaultClusterScopePartitions = 16
)

// entryOverhead is what Redis holds for one entry besides its key names and
// its fields' values: the keyspace's dictionary entry and key object, the
// expiry entry, the record hash's listpack and the fields' names, and the
// entry's member in the scope's sorted set (skiplist node and dictionary
// entry) and in its sizes hash. TestQuotaBytesCountWhatRedisHolds holds
// the estimate within 25% of what INFO memory's used_memory grows by.
const entryOverhead = 400

// leasePayload is what a claim's hash holds besides the fingerprint: the
// owner token (22 characters) and the field names.
const leasePayload = 32

// oomRetryAfter is the retry hint of a claim that Redis refused for memory.
const oomRetryAfter = time.Second

// WithScopeQuota bounds what one scope ([idempotency.RecordKey].Scope, one
// caller or tenant) holds in Redis: at most entries keys, in progress or
// completed, and about bytes bytes (each entry's key names, fingerprint,
// owner token or record, and the Redis structures that hold them, as
// entryOverhead estimates them). 0 leaves that bound off; WithScopeQuota(0,
// 0) turns the quota off (the accounting below still runs, so that a quota
// set later starts right).
//
// By default a scope holds at most a quarter of the server's maxmemory in
// bytes (the smallest primary's, on a Cluster; read by [Open]), or
// DefaultScopeBytes when Open cannot read it, it is not set, or the store
// comes from [New]; and no bound on entries. What it protects: one tenant's
// flood of unique keys on a noeviction Redis is refused at its quota,
// with a RetryInfo (the interceptor answers RESOURCE_EXHAUSTED), instead of
// filling Redis and failing every tenant's keyed calls (OOM). The cost: one
// scope never holds more than its quota. A server whose callers share one
// scope (server.SharedScope) gives it the quota it may
// use.
//
// The quota is atomic with the claim: the claim's script counts the
// scope's entries and bytes and takes the key in one step, so concurrent
// claims on any number of replicas never pass it together. A claim that
// would pass it first drops the scope's entries that have ended and evicts
// the scope's own oldest completed records past the minimum retention
// ([WithMinRetention]); if that is not enough, the Claim fails with an
// error wrapping an [*idempotency.FullError] whose Scope is true and whose
// RetryAfter is when its oldest entry may go. No other scope's record is
// touched. An owner's outcome is always stored, even past the quota
// (refusing it would run the handler again): the quota is checked when a
// key is claimed, and a record that does not fit when it is completed
// (calls in flight together all passed their claims), after the scope's
// own records past the minimum retention are evicted, is kept for the
// minimum retention only (at least 1 ms), not its TTL, so that the excess
// goes by itself.
//
// Each scope is split in partitions ([WithScopePartitions]), each with its
// share of the quota (entries/partitions and bytes/partitions): a scope is
// refused somewhat before it reaches the whole quota when its keys hash
// unevenly over the partitions (see the package documentation).
func WithScopeQuota(entries int, bytes int64) Option {
	return optionFunc(func(o *options) { o.scopeEntries, o.scopeBytes, o.quotaSet = entries, bytes, true })
}

// WithScopePartitions sets the number of partitions of each scope (default
// 1, or DefaultClusterScopePartitions on a *redis.ClusterClient). A scope's
// keys are spread over its partitions by a hash of the record key; all
// the keys of one partition, and its quota's accounting, share one Redis
// Cluster hash tag, hence one slot. More partitions spread one scope's load
// (the shared scope's, or a big tenant's) over more slots and primaries;
// fewer make its quota more exact. Changing it moves every record to
// another key: duplicates of calls made before the change run again.
func WithScopePartitions(n int) Option {
	return optionFunc(func(o *options) { o.partitions = n })
}

// WithMinRetention sets how long a completed record is kept at least
// before its scope, at its quota, may evict it to make room (default
// DefaultMinRetention), unless its TTL is shorter: a duplicate within the
// minimum retention is replayed whatever its scope's other calls do. 0
// lets a scope at its quota evict its oldest record at once.
func WithMinRetention(d time.Duration) Option {
	return optionFunc(func(o *options) { o.minRetention = d })
}

// quota is the per-partition share of the scope quota.
type quota struct {
	entries int64 // 0: no bound
	bytes   int64 // 0: no bound
}

// checkQuota validates the quota options and sets the defaults that do not
// need Redis: the partitions and, unless the quota was set, the entries.
func (o *options) checkQuota(client redis.UniversalClient) error {
	if o.partitions == 0 {
		o.partitions = 1
		if _, ok := client.(*redis.ClusterClient); ok {
			o.partitions = DefaultClusterScopePartitions
		}
	}
	minBytes := int64(o.partitions) * 4 * (entryOverhead + 128)
	switch {
	case o.partitions < 1 || o.partitions > 16384:
		return fmt.Errorf("redisstore: WithScopePartitions(%d): must be 1 to 16384", o.partitions)
	case o.minRetention < 0:
		return fmt.Errorf("redisstore: WithMinRetention(%v): must not be negative", o.minRetention)
	case !o.quotaSet:
		o.scopeBytes = DefaultScopeBytes // until Open reads maxmemory
	case o.scopeEntries < 0 || o.scopeBytes < 0:
		return fmt.Errorf("redisstore: WithScopeQuota(%d, %d): must not be negative", o.scopeEntries, o.scopeBytes)
	case o.scopeEntries > 0 && o.scopeEntries < o.partitions:
		return fmt.Errorf("redisstore: WithScopeQuota(%d, %d): entries must be at least the scope's %d partitions",
			o.scopeEntries, o.scopeBytes, o.partitions)
	case o.scopeBytes > 0 && o.scopeBytes < minBytes:
		return fmt.Errorf("redisstore: WithScopeQuota(%d, %d): bytes must be at least %d (4 small entries in each of the scope's %d partitions)",
			o.scopeEntries, o.scopeBytes, minBytes, o.partitions)
	}
	return nil
}

// defaultScopeBytes returns the default byte quota for a server whose
// maxmemory is maxmemory: a quarter of it, and enough for 4 small entries
// in each partition.
func (o *options) defaultScopeBytes(maxmemory int64) int64 {
	return max(maxmemory/4, int64(o.partitions)*4*(entryOverhead+128))
}

// share returns each partition's share of the quota.
func (o *options) share() quota {
	return quota{entries: int64(o.scopeEntries / o.partitions), bytes: o.scopeBytes / int64(o.partitions)}
}

// recordKeys are the Redis keys of one record key: the record's hash, and
// the sorted set and hash that account for its scope's partition, all in
// one hash tag; member names the record in those two, and base is the
// prefix and hash tag, base+member being the record's key.
type recordKeys struct {
	keys   [3]string // record, scope set (#z), scope sizes (#s)
	base   string
	member string
}

// recordKeys names k's keys: prefix + "{" + S + ":" + p + "}" + M, where S
// is the unpadded base64url of the first 16 bytes of the SHA-256 of the
// scope (preceded by its length), p the partition (a hash of the record
// key, modulo the partitions), and M the unpadded base64url SHA-256 of
// the scope, the method (each preceded by its length) and the key. The
// partition's accounting keys end in "#z" and "#s", which no M does. One
// allocation: the strings are slices of one.
func (s *Store) recordKeys(k idempotency.RecordKey) recordKeys {
	var n [8]byte
	h := sha256.New()
	binary.BigEndian.PutUint64(n[:], uint64(len(k.Scope)))
	h.Write(n[:])
	h.Write([]byte(k.Scope))
	var scopeSum [sha256.Size]byte
	h.Sum(scopeSum[:0])
	binary.BigEndian.PutUint64(n[:], uint64(len(k.FullMethod)))
	h.Write(n[:])
	h.Write([]byte(k.FullMethod))
	h.Write([]byte(k.Key))
	var sum [sha256.Size]byte
	h.Sum(sum[:0])

	var tag [22]byte // base64.RawURLEncoding.EncodedLen(16)
	base64.RawURLEncoding.Encode(tag[:], scopeSum[:16])
	var member [43]byte // base64.RawURLEncoding.EncodedLen(sha256.Size)
	base64.RawURLEncoding.Encode(member[:], sum[:])
	var pbuf [5]byte
	p := strconv.AppendUint(pbuf[:0], binary.BigEndian.Uint64(sum[:8])%uint64(s.opts.partitions), 10)

	prefix := s.opts.prefix
	baseLen := len(prefix) + 1 + len(tag) + 1 + len(p) + 1
	var b strings.Builder
	b.Grow(3*baseLen + len(member) + 4)
	for i, suffix := range [3]string{"", "#z", "#s"} {
		b.WriteString(prefix)
		b.WriteByte('{')
		b.Write(tag[:])
		b.WriteByte(':')
		b.Write(p)
		b.WriteByte('}')
		if i == 0 {
			b.Write(member[:])
		}
		b.WriteString(suffix)
	}
	all := b.String()
	rec := baseLen + len(member)
	return recordKeys{
		keys:   [3]string{all[:rec], all[rec : rec+baseLen+2], all[rec+baseLen+2:]},
		base:   all[:baseLen],
		member: all[baseLen:rec],
	}
}

// luaQuota is the prelude of the scripts that keep a scope partition's
// accounting: KEYS[1] is the record's key, KEYS[2] the partition's sorted
// set (member -> the time, in Redis milliseconds, when the entry may go:
// its lease's end, or its record's minimum retention), KEYS[3] its hash
// (member -> bytes, and '#' -> their sum). Every entry of the partition is
// in both, from its claim until its release, its eviction, or a claim that
// finds its key gone.
const luaQuota = `
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function extend(ms)
  if redis.call('PTTL', KEYS[2]) < ms then
    redis.call('PEXPIRE', KEYS[2], ms)
    redis.call('PEXPIRE', KEYS[3], ms)
  end
end
local function account(m, score, size, life)
  local old = tonumber(redis.call('HGET', KEYS[3], m) or '0')
  redis.call('ZADD', KEYS[2], score, m)
  redis.call('HSET', KEYS[3], m, size)
  redis.call('HINCRBY', KEYS[3], '#', size - old)
  extend(life)
end
local function unaccount(m)
  local old = redis.call('HGET', KEYS[3], m)
  if old then
    redis.call('HDEL', KEYS[3], m)
    redis.call('HINCRBY', KEYS[3], '#', -tonumber(old))
  end
  redis.call('ZREM', KEYS[2], m)
end
-- room makes room for an entry of size bytes within the quota (maxn
-- entries, maxb bytes; 0 is no bound): it drops the partition's entries
-- whose key is gone and evicts its completed records past their minimum
-- retention, oldest first. It returns 0 when there is room, else the
-- milliseconds until the oldest entry may go.
local function room(now, size, maxn, maxb, base)
  if maxn <= 0 and maxb <= 0 then return 0 end
  for i = 1, 256 do
    local n = redis.call('ZCARD', KEYS[2])
    local b = tonumber(redis.call('HGET', KEYS[3], '#') or '0')
    if (maxn <= 0 or n < maxn) and (maxb <= 0 or b + size <= maxb) then return 0 end
    local low = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    if #low == 0 then return 1 end
    local m, score = low[1], tonumber(low[2])
    local k = base .. m
    local v = redis.call('HMGET', k, 'r', 'o')
    if not v[1] and not v[2] then
      unaccount(m)
    elseif score > now then
      return score - now
    elseif v[2] then
      local pt = redis.call('PTTL', k)
      if pt <= 0 then unaccount(m) else redis.call('ZADD', KEYS[2], now + pt, m) end
    else
      redis.call('DEL', k)
      unaccount(m)
    end
  end
  return 1
end
`
