package redisstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// Defaults of [New].
const (
	DefaultKeyPrefix      = "idem:"
	DefaultMaxRecordBytes = 1 << 20
)

// Bounds of the clean-up after a failed Claim (see [Store.Claim]).
const (
	// releaseTimeout bounds the release that follows a failed Claim. It runs
	// on a context detached from the caller's, whose end may be what lost
	// the claim's reply.
	releaseTimeout = 500 * time.Millisecond
	// maxOrphans bounds the tokens of unconfirmed claims a Store remembers.
	// Past it, an orphan claim whose release failed ends with its lease.
	maxOrphans = 1024
)

// Option configures [New].
type Option interface{ apply(*options) }

type options struct {
	prefix         string
	maxRecordBytes int
	allowEvicting  bool
	logger         *slog.Logger
	minReplicas    int           // WithMinReplicas; 0: no WAIT
	replicaTimeout time.Duration // WithMinReplicas
	scopeEntries   int           // WithScopeQuota; 0: no bound
	scopeBytes     int64         // WithScopeQuota, or the default; 0: no bound
	quotaSet       bool          // WithScopeQuota was given
	partitions     int           // WithScopePartitions; 0 until New sets the default
	minRetention   time.Duration // WithMinRetention
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

// WithKeyPrefix sets the prefix of every Redis key the store writes (default
// DefaultKeyPrefix). Stores with different prefixes share nothing.
func WithKeyPrefix(p string) Option { return optionFunc(func(o *options) { o.prefix = p }) }

// WithMaxRecordBytes bounds the size of one record, as
// idempotency.Record.Size estimates it (default DefaultMaxRecordBytes).
// Complete refuses larger records with idempotency.ErrRecordTooLarge before
// sending anything to Redis.
func WithMaxRecordBytes(n int) Option { return optionFunc(func(o *options) { o.maxRecordBytes = n }) }

// ErrEvictingPolicy is wrapped by the error of [Open] when the server's
// maxmemory-policy is not noeviction (and WithAllowEvictingPolicy is not
// given): under memory pressure Redis would drop live claims and records,
// and a duplicate would run its call again, concurrently.
var ErrEvictingPolicy = errors.New("redisstore: Redis may evict keys (maxmemory-policy is not noeviction)")

// Open returns a Store on client, as New does, after reading the server's
// maxmemory-policy (CONFIG GET). When the policy is not noeviction, it
// returns an error wrapping ErrEvictingPolicy that names the policy and the
// fix (CONFIG SET maxmemory-policy noeviction), unless
// WithAllowEvictingPolicy accepts it, with a warning. When CONFIG is
// disabled or not permitted (managed Redis services often rename it), it
// logs that the policy could not be checked and goes on. Any other error
// (Redis unreachable) is returned. Warnings go to the logger of WithLogger,
// by default slog.Default().
//
// With a *redis.ClusterClient it reads the policy of every primary
// (ForEachMaster), and the warnings and errors name the node; one evicting
// primary is enough to refuse, since the records of its slots are at risk.
func Open(ctx context.Context, client redis.UniversalClient, opts ...Option) (*Store, error) {
	s, err := New(client, opts...)
	if err != nil {
		return nil, err
	}
	var mem maxmemory
	if cc, ok := client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return s.checkPolicy(ctx, node, node.Options().Addr, &mem)
		})
	} else {
		err = s.checkPolicy(ctx, client, "", &mem)
	}
	if err != nil {
		return nil, err
	}
	if !s.opts.quotaSet {
		if least, ok := mem.least(); ok {
			s.opts.scopeBytes = s.opts.defaultScopeBytes(least)
			s.quota = s.opts.share()
		}
	}
	return s, nil
}

// maxmemory collects the maxmemory of the servers Open checks: the least
// one set, and whether any server's could not be read or was not set.
type maxmemory struct {
	mu      sync.Mutex
	min     int64 // the least positive maxmemory read; 0: none
	unknown bool  // a server's maxmemory could not be read, or is 0 (unbounded)
}

func (m *maxmemory) add(v int64, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !ok || v <= 0 {
		m.unknown = true
		return
	}
	if m.min == 0 || v < m.min {
		m.min = v
	}
}

// least returns the least maxmemory when every server's was read and set.
func (m *maxmemory) least() (int64, bool) {
	return m.min, !m.unknown && m.min > 0
}

// checkPolicy is Open's check of one server, named node in messages when
// node is not empty (a cluster's primary); it adds the server's maxmemory
// to mem. It is safe for concurrent use.
func (s *Store) checkPolicy(ctx context.Context, client redis.UniversalClient, node string, mem *maxmemory) error {
	o := s.opts
	where, attrs := "", []any{}
	if node != "" {
		where, attrs = " on node "+node, []any{"node", node}
	}
	res, err := client.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		if isCommandRefused(err) {
			o.logger.Warn("redisstore: cannot read maxmemory-policy (CONFIG is disabled); make sure it is noeviction, "+
				"or Redis may drop live claims and records under memory pressure", append(attrs, "error", err)...)
			mem.add(0, false)
			return nil
		}
		return fmt.Errorf("redisstore: reading maxmemory-policy%s: %w", where, err)
	}
	limit, perr := strconv.ParseInt(res["maxmemory"], 10, 64)
	mem.add(limit, perr == nil)
	policy, ok := res["maxmemory-policy"]
	if !ok {
		o.logger.Warn("redisstore: the server did not report maxmemory-policy; make sure it is noeviction", attrs...)
		return nil
	}
	if policy == "noeviction" {
		return nil
	}
	if !o.allowEvicting {
		return fmt.Errorf("%w: it is %s%s; set it to noeviction (CONFIG SET maxmemory-policy noeviction, "+
			"or maxmemory-policy noeviction in redis.conf), or accept the risk with WithAllowEvictingPolicy",
			ErrEvictingPolicy, policy, where)
	}
	o.logger.Warn("redisstore: maxmemory-policy is not noeviction: under memory pressure Redis may evict live claims "+
		"and records, and a duplicate may then run its call again, concurrently; set maxmemory-policy noeviction",
		append(attrs, "maxmemory-policy", policy)...)
	return nil
}

// isCommandRefused reports whether err says the server refuses the command
// itself: unknown (renamed or disabled) or not permitted (ACL).
func isCommandRefused(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "NOPERM") || strings.Contains(msg, "unknown command")
}

// WithAllowEvictingPolicy makes [Open] accept a server whose
// maxmemory-policy is not noeviction, with a warning, where by default it
// refuses it. The risk is the one ErrEvictingPolicy names: under memory
// pressure Redis evicts live claims (volatile-ttl evicts them first: their
// TTL is the shortest) and records, and a duplicate then runs its call
// again, concurrently with its owner or after it. Use it only for a Redis
// that never reaches maxmemory, or for calls that may run twice.
func WithAllowEvictingPolicy() Option {
	return optionFunc(func(o *options) { o.allowEvicting = true })
}

// ErrNotReplicated is wrapped by the error of a Claim or Complete whose
// write fewer replicas than WithMinReplicas asks acknowledged in time.
var ErrNotReplicated = errors.New("redisstore: write not acknowledged by enough replicas")

// WithMinReplicas makes the store's writes that decide exactly once wait,
// with Redis's WAIT, until n replicas of the key's primary have
// acknowledged them, at most timeout: a Claim that takes a key, and a
// Complete. WAIT runs on the connection of the write, right after it: one
// more round trip for those two operations, none for replays. When fewer
// than n replicas acknowledge in time:
//
//   - Claim releases the claim it took (as a failed Claim does) and
//     returns an error wrapping ErrNotReplicated, so the handler does not
//     run (the interceptor fails closed with UNAVAILABLE, or runs it
//     unrecorded when it fails open): a replica promoted after a claim that
//     was acknowledged holds it, and no second execution starts there;
//   - Complete returns an error wrapping ErrNotReplicated: the record is
//     stored on the primary, not known to be on the replicas.
//
// This narrows the failover window (see the package documentation), it
// does not close it: WAIT does not make Redis strongly consistent (a
// promoted replica may not be one that acknowledged, unless n counts them
// all), and Renew does not wait. With a *redis.ClusterClient, the
// operation runs on the key's primary without following redirections, so
// during a slot migration a Claim or Complete of a migrating key fails (and
// the caller retries). It needs a *redis.Client or a *redis.ClusterClient
// (New returns an error for other clients), n >= 1 and timeout > 0.
func WithMinReplicas(n int, timeout time.Duration) Option {
	return optionFunc(func(o *options) { o.minReplicas, o.replicaTimeout = n, timeout })
}

// WithLogger sets the logger of [Open]'s warnings and of the store's own
// (Redis out of memory) (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return optionFunc(func(o *options) { o.logger = l }) }

// Store is an idempotency.Store in Redis. Its methods are safe for
// concurrent use by many goroutines and many processes.
type Store struct {
	opts    options               // immutable once New or Open returns
	quota   quota                 // each scope partition's share; immutable once New or Open returns
	client  redis.UniversalClient // immutable
	orphans orphans
	oomLog  atomic.Int64 // unix nanoseconds of the last warning of an OOM refusal
}

var _ idempotency.Store = (*Store)(nil)

// New returns a Store on client. It does not contact Redis, so it checks
// nothing of the server and each scope's default quota is DefaultScopeBytes;
// [Open] also refuses an evicting maxmemory-policy and sizes the default
// quota to maxmemory, and is what a server should call at startup. It
// returns an error naming the option when client is nil, the record bound
// is not positive, or a quota option is out of range.
func New(client redis.UniversalClient, opts ...Option) (*Store, error) {
	o := options{prefix: DefaultKeyPrefix, maxRecordBytes: DefaultMaxRecordBytes, logger: slog.Default(),
		minRetention: DefaultMinRetention}
	for _, opt := range opts {
		opt.apply(&o)
	}
	if client == nil {
		return nil, errors.New("redisstore: client must not be nil")
	}
	if o.maxRecordBytes < 1 {
		return nil, fmt.Errorf("redisstore: max record bytes %d: must be positive", o.maxRecordBytes)
	}
	if strings.ContainsAny(o.prefix, "{}") {
		return nil, fmt.Errorf("redisstore: key prefix %q: must not contain '{' or '}', which would make it the Cluster hash tag of every key", o.prefix)
	}
	if o.logger == nil {
		return nil, errors.New("redisstore: WithLogger(nil): logger must not be nil")
	}
	if o.minReplicas != 0 || o.replicaTimeout != 0 {
		switch client.(type) {
		case *redis.Client, *redis.ClusterClient:
		default:
			return nil, fmt.Errorf("redisstore: WithMinReplicas: needs a *redis.Client or *redis.ClusterClient, not %T", client)
		}
		if o.minReplicas < 1 || o.replicaTimeout < time.Millisecond {
			return nil, fmt.Errorf("redisstore: WithMinReplicas(%d, %v): need n >= 1 and timeout >= 1ms", o.minReplicas, o.replicaTimeout)
		}
	}
	if err := o.checkQuota(client); err != nil {
		return nil, err
	}
	return &Store{opts: o, quota: o.share(), client: client}, nil
}

// Each record key is one Redis hash with a TTL: field f holds the
// fingerprint, o the owner token while in progress, r the marshalled record
// once completed. The scripts make every transition one atomic step, with
// the accounting of the scope's partition (luaQuota): KEYS are the record's
// key and the partition's two accounting keys, one hash tag for all three.
var (
	// claimScript: ARGV fingerprint, token, lease ms, member, entry bytes,
	// quota entries, quota bytes, base. Returns {1} owned, {2, record}
	// completed, {3, pttl} in progress, {4} mismatch, {5, ms} refused for
	// the scope's quota, room in ms at the earliest.
	// A claim by the token that holds the key is owned again, with a new
	// lease: a Claim retried with the token of one whose reply was lost.
	claimScript = redis.NewScript(luaQuota + `
local v = redis.call('HMGET', KEYS[1], 'f', 'r', 'o')
local lease = tonumber(ARGV[3])
if v[1] then
  if v[1] ~= ARGV[1] then return {4} end
  if v[2] then return {2, v[2]} end
  if v[3] ~= ARGV[2] then return {3, redis.call('PTTL', KEYS[1])} end
  redis.call('PEXPIRE', KEYS[1], lease)
  account(ARGV[4], now_ms() + lease, tonumber(ARGV[5]), lease)
  return {1}
end
local now = now_ms()
local wait = room(now, tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8])
if wait > 0 then return {5, wait} end
redis.call('HSET', KEYS[1], 'f', ARGV[1], 'o', ARGV[2])
redis.call('PEXPIRE', KEYS[1], lease)
account(ARGV[4], now + lease, tonumber(ARGV[5]), lease)
return {1}
`)

	// completeScript: ARGV token, record, ttl ms, fingerprint, member,
	// entry bytes, retention ms (the minimum retention, at most the TTL),
	// quota bytes, base. Returns 1 when stored, 0 when the token does not
	// own the key. An absent key (the owner's lease ended, no one claimed it
	// since) takes the record with the fingerprint. An owner's outcome is
	// always stored, even past the scope's byte quota: the scope first
	// evicts its own records past their minimum retention, as a claim
	// does, and a record that still does not fit is kept for its minimum
	// retention only (at least 1 ms), not its TTL, so that the excess of a
	// burst of calls in flight goes by itself. The first write is the HDEL,
	// which Redis allows out of memory: a script that has written may go
	// on, so the outcome is stored on a Redis at maxmemory too.
	completeScript = redis.NewScript(luaQuota + `
local o = redis.call('HGET', KEYS[1], 'o')
if o ~= ARGV[1] and (o or redis.call('EXISTS', KEYS[1]) == 1) then return 0 end
redis.call('HDEL', KEYS[1], 'o')
local now = now_ms()
local size = tonumber(ARGV[6])
local ttl = tonumber(ARGV[3])
local old = tonumber(redis.call('HGET', KEYS[3], ARGV[5]) or '0')
if room(now, size - old, 0, tonumber(ARGV[8]), ARGV[9]) > 0 then
  ttl = math.max(math.min(ttl, tonumber(ARGV[7])), 1)
end
redis.call('HSET', KEYS[1], 'f', ARGV[4], 'r', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl)
account(ARGV[5], now + tonumber(ARGV[7]), size, ttl)
return 1
`)

	// renewScript: ARGV token, lease ms, member, entry bytes. Returns 1
	// when renewed, 0 when the token does not own the key.
	renewScript = redis.NewScript(luaQuota + `
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] then return 0 end
local lease = tonumber(ARGV[2])
redis.call('PEXPIRE', KEYS[1], lease)
account(ARGV[3], now_ms() + lease, tonumber(ARGV[4]), lease)
return 1
`)

	// releaseScript: ARGV token, member. Returns 1 when released, 0 when
	// the token does not own the key.
	releaseScript = redis.NewScript(luaQuota + `
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
unaccount(ARGV[2])
return 1
`)
)

func millis(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

// newToken returns a fresh owner token: 128 random bits.
func newToken() string {
	var tok [16]byte
	_, _ = rand.Read(tok[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(tok[:])
}

// Claim implements idempotency.Store in one round trip (once Redis has
// cached the script; the first use of a script on a server costs one more;
// with WithMinReplicas, a Claim that takes the key costs one more, WAIT).
// The scope's quota is checked in the same script (see WithScopeQuota): a
// claim over it fails with an error wrapping an [*idempotency.FullError]
// (Scope true), and so, with Scope false, does a claim that Redis refuses
// for memory (an OOM error: maxmemory reached with noeviction), which is
// also logged, at most every 10 s.
//
// A Claim that fails may have taken the key all the same: the script ran,
// and the reply was lost (the caller's deadline passed first, the connection
// broke). So that such an orphan claim does not hold the key for its whole
// lease, a failed Claim releases its token before it returns, on a context
// detached from ctx and bounded by its own short timeout (500 ms). When that
// release does not confirm that the key is free, the Store remembers the
// token until the lease would end: its next Claim of the same key for the
// same fingerprint (the caller's retry of the same request, on this
// replica) claims with that token, and the script, which recognises the
// token that holds the key, hands it over at once with a new lease. The
// token is used by that one Claim only, so it never makes two owners. A
// Claim that returned at its context's end while Redis had not answered
// (see bounded) and whose script then took the key releases it when the
// reply comes.
func (s *Store) Claim(ctx context.Context, key idempotency.RecordKey, fingerprint []byte, lease time.Duration) (idempotency.Claim, error) {
	rk := s.recordKeys(key)
	token, ok := s.orphans.take(rk.keys[0], fingerprint)
	if !ok {
		token = newToken()
	}
	if ctx.Done() != nil {
		// bounded may return before the script has run, and its late
		// function remembers the fingerprint of an orphan claim: neither
		// may read the caller's slice once Claim has returned (the server
		// reuses its buffer for the next call's fingerprint).
		fingerprint = bytes.Clone(fingerprint)
	}
	sent := time.Now()
	res, err := bounded(ctx, func() ([]any, error) {
		cmd, err := s.run(ctx, claimScript, rk.keys[:], claimWrote, fingerprint, token, millis(lease),
			rk.member, s.leaseBytes(&rk), s.quota.entries, s.quota.bytes, rk.base)
		if cmd == nil {
			return nil, err
		}
		res, rerr := cmd.Slice()
		if rerr != nil {
			return nil, rerr
		}
		return res, err // err: WithMinReplicas's WAIT after the script's reply
	}, func(res []any, err error) {
		// The caller has gone, and the claim came back after all: a key
		// it took is no one's, whether or not its WAIT failed, unless a
		// retry of the same request on this replica took its token from
		// the orphans (the release below found the key free, before the
		// script ran) and owns the key with it: the script found its own
		// token and said it took the key. So the late release goes only
		// while the token is still an orphan's, which it takes; when it
		// is not (taken by a retry, the release below freed the key, or
		// it is yet to run and will find the key taken), the release is
		// no one's to send. (An error of the script leaves it unknown:
		// the release below, and the lease, deal with that.)
		if claimTook(res) && s.orphans.drop(rk.keys[0], fingerprint, token) {
			s.abandon(ctx, &rk, fingerprint, token, sent.Add(lease))
		}
	})
	if err != nil {
		if isOOM(err) { // refused at its first write: nothing was claimed
			return idempotency.Claim{}, s.outOfMemory(err)
		}
		s.abandon(ctx, &rk, fingerprint, token, sent.Add(lease))
		return idempotency.Claim{}, fmt.Errorf("redisstore: claim: %w", err)
	}
	state, _ := res[0].(int64)
	switch state {
	case 1:
		return idempotency.Claim{State: idempotency.Owned, Token: token}, nil
	case 2:
		raw, _ := res[1].(string)
		rec := new(idempotency.Record)
		if err := rec.UnmarshalBinary([]byte(raw)); err != nil {
			return idempotency.Claim{}, fmt.Errorf("redisstore: claim: %w", err)
		}
		return idempotency.Claim{State: idempotency.Completed, Record: rec}, nil
	case 3:
		pttl, _ := res[1].(int64)
		return idempotency.Claim{State: idempotency.InProgress, RetryAfter: time.Duration(max(pttl, 0)) * time.Millisecond}, nil
	case 4:
		return idempotency.Claim{State: idempotency.Mismatch}, nil
	case 5:
		wait, _ := res[1].(int64)
		return idempotency.Claim{}, fmt.Errorf("redisstore: claim: %w",
			&idempotency.FullError{Scope: true, RetryAfter: time.Duration(max(wait, 1)) * time.Millisecond})
	}
	return idempotency.Claim{}, fmt.Errorf("redisstore: claim: unexpected reply %v", res)
}

// leaseBytes is what a claimed key counts against its scope's quota: its
// key names, a SHA-256 fingerprint, the owner token and entryOverhead.
func (s *Store) leaseBytes(rk *recordKeys) int64 {
	return s.entryBytes(rk, sha256.Size+leasePayload)
}

// entryBytes is what an entry of rk with payload bytes of fields counts
// against its scope's quota: its key in the keyspace, its member in the
// partition's sorted set and sizes hash, and entryOverhead.
func (s *Store) entryBytes(rk *recordKeys, payload int) int64 {
	return int64(entryOverhead + len(rk.keys[0]) + 2*len(rk.member) + payload)
}

// isOOM reports whether err is Redis's refusal of a write for memory:
// maxmemory reached, with nothing it may evict.
func isOOM(err error) bool { return strings.HasPrefix(err.Error(), "OOM ") }

// outOfMemory returns the error of a Claim that Redis refused for memory:
// a FullError of the store, not of a scope, so the interceptor answers
// RESOURCE_EXHAUSTED with a retry hint rather than UNAVAILABLE, and logs
// the refusal for the operator, at most every 10 s.
func (s *Store) outOfMemory(err error) error {
	now := time.Now().UnixNano()
	if last := s.oomLog.Load(); now-last >= int64(10*time.Second) && s.oomLog.CompareAndSwap(last, now) {
		s.opts.logger.Warn("redisstore: Redis is out of memory (maxmemory reached, noeviction): keyed calls are refused "+
			"with RESOURCE_EXHAUSTED until room comes; lower the scope quotas (WithScopeQuota), shorten the TTL, or raise maxmemory",
			"error", err)
	}
	return fmt.Errorf("redisstore: claim: Redis is out of memory (%v): %w", err,
		&idempotency.FullError{RetryAfter: oomRetryAfter})
}

// abandon undoes a Claim of rk with token whose outcome is unknown: it
// releases the key, if token holds it, on a context that ctx's cancellation
// does not reach, bounded by releaseTimeout (whatever the client does with
// contexts: see bounded). Unless Redis confirms the
// release, the claim may outlive the call (the release failed, or ran before
// a delayed claim), so the token is remembered until until, the latest end
// of the claim's lease, for the next Claim of rk for fingerprint.
func (s *Store) abandon(ctx context.Context, rk *recordKeys, fingerprint []byte, token string, until time.Time) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	n, err := bounded(rctx, func() (int, error) {
		return releaseScript.Run(rctx, s.client, rk.keys[:], token, rk.member).Int()
	}, nil)
	if err == nil && n == 1 {
		return
	}
	s.orphans.put(rk.keys[0], fingerprint, token, until)
}

// orphans are the tokens of claims that failed and may hold their key: by
// Redis key and fingerprint, each until the claim's lease would end. Lookups
// read n first, so that a Claim takes no lock while there are none.
type orphans struct {
	n  atomic.Int32 // len(m)
	mu sync.Mutex
	m  map[orphanKey]orphan // guarded by mu; made on first use
}

type orphanKey struct{ rkey, fingerprint string }

type orphan struct {
	token string
	until time.Time // the latest end of the claim's lease
}

// take removes and returns the token remembered for rkey and fingerprint,
// when there is one whose lease may still run.
func (o *orphans) take(rkey string, fingerprint []byte) (string, bool) {
	if o.n.Load() == 0 {
		return "", false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	k := orphanKey{rkey, string(fingerprint)}
	e, ok := o.m[k]
	if !ok {
		return "", false
	}
	delete(o.m, k)
	o.n.Store(int32(len(o.m)))
	return e.token, time.Now().Before(e.until)
}

// drop removes the token remembered for rkey and fingerprint when it is
// token, and reports whether it was.
func (o *orphans) drop(rkey string, fingerprint []byte, token string) bool {
	if o.n.Load() == 0 {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	k := orphanKey{rkey, string(fingerprint)}
	if e, ok := o.m[k]; !ok || e.token != token {
		return false
	}
	delete(o.m, k)
	o.n.Store(int32(len(o.m)))
	return true
}

// put remembers token for rkey and fingerprint until until. When maxOrphans
// are remembered, it first drops those whose lease has ended; if none has,
// it remembers nothing, and the claim ends with its lease.
func (o *orphans) put(rkey string, fingerprint []byte, token string, until time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = make(map[orphanKey]orphan)
	}
	if len(o.m) >= maxOrphans {
		now := time.Now()
		for k, e := range o.m {
			if !now.Before(e.until) {
				delete(o.m, k)
			}
		}
	}
	if len(o.m) < maxOrphans {
		o.m[orphanKey{rkey, string(fingerprint)}] = orphan{token: token, until: until}
	}
	o.n.Store(int32(len(o.m)))
}

// claimWrote and completeWrote report whether a reply of claimScript and
// completeScript says that the script took the key or stored the record.
func claimWrote(cmd *redis.Cmd) bool {
	res, _ := cmd.Slice()
	return claimTook(res)
}

// claimTook reports whether res, a reply of claimScript, says that the
// script took the key.
func claimTook(res []any) bool { return len(res) > 0 && res[0] == int64(1) }

func completeWrote(cmd *redis.Cmd) bool {
	n, _ := cmd.Int()
	return n == 1
}

// run runs script on keys, which share one hash tag (keys[0] is the
// record's). With WithMinReplicas, it runs it on one connection to the
// keys' primary and then, when wrote reports that the script wrote, WAITs
// on that connection (WAIT counts the acknowledgements of the connection's
// own last write); the error is then that of the wait, or wraps
// ErrNotReplicated, and cmd holds the script's reply. Without, it is
// script.Run on the client.
func (s *Store) run(ctx context.Context, script *redis.Script, keys []string, wrote func(*redis.Cmd) bool, args ...any) (*redis.Cmd, error) {
	if s.opts.minReplicas == 0 {
		return script.Run(ctx, s.client, keys, args...), nil
	}
	var node *redis.Client
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		var err error
		if node, err = c.MasterForKey(ctx, keys[0]); err != nil {
			return nil, err
		}
	case *redis.Client:
		node = c
	}
	conn := node.Conn()
	defer conn.Close()
	cmd := script.Run(ctx, conn, keys, args...)
	if cmd.Err() != nil || !wrote(cmd) {
		return cmd, nil
	}
	n, err := conn.Wait(ctx, s.opts.minReplicas, s.opts.replicaTimeout).Result()
	if err != nil {
		return cmd, fmt.Errorf("WAIT: %w", err)
	}
	if n < int64(s.opts.minReplicas) {
		return cmd, fmt.Errorf("%w: %d of %d replicas within %v", ErrNotReplicated, n, s.opts.minReplicas, s.opts.replicaTimeout)
	}
	return cmd, nil
}

// Complete implements idempotency.Store in one round trip (two with
// WithMinReplicas: the script, then WAIT).
func (s *Store) Complete(ctx context.Context, key idempotency.RecordKey, token string, rec *idempotency.Record, ttl time.Duration) error {
	if n := rec.Size(); n > s.opts.maxRecordBytes {
		return fmt.Errorf("redisstore: %w: %d bytes, bound %d", idempotency.ErrRecordTooLarge, n, s.opts.maxRecordBytes)
	}
	data, err := rec.MarshalBinary()
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	rk := s.recordKeys(key)
	ok, err := bounded(ctx, func() (int, error) {
		cmd, err := s.run(ctx, completeScript, rk.keys[:], completeWrote, token, data, millis(ttl), rec.Fingerprint,
			rk.member, s.entryBytes(&rk, len(data)+len(rec.Fingerprint)), min(s.opts.minRetention, ttl).Milliseconds(),
			s.quota.bytes, rk.base)
		if err != nil {
			return 0, err
		}
		return cmd.Int()
	}, nil)
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	if ok != 1 {
		return fmt.Errorf("redisstore: complete: %w", idempotency.ErrNotOwner)
	}
	return nil
}

// Renew implements idempotency.Store in one round trip.
func (s *Store) Renew(ctx context.Context, key idempotency.RecordKey, token string, lease time.Duration) error {
	rk := s.recordKeys(key)
	ok, err := bounded(ctx, func() (int, error) {
		return renewScript.Run(ctx, s.client, rk.keys[:], token, millis(lease), rk.member, s.leaseBytes(&rk)).Int()
	}, nil)
	if err != nil {
		return fmt.Errorf("redisstore: renew: %w", err)
	}
	if ok != 1 {
		return fmt.Errorf("redisstore: renew: %w", idempotency.ErrNotOwner)
	}
	return nil
}

// Release implements idempotency.Store in one round trip.
func (s *Store) Release(ctx context.Context, key idempotency.RecordKey, token string) error {
	rk := s.recordKeys(key)
	ok, err := bounded(ctx, func() (int, error) {
		return releaseScript.Run(ctx, s.client, rk.keys[:], token, rk.member).Int()
	}, nil)
	if err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	if ok != 1 {
		return fmt.Errorf("redisstore: release: %w", idempotency.ErrNotOwner)
	}
	return nil
}
