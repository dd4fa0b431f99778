package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
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

// Store is an idempotency.Store in Redis. Its methods are safe for
// concurrent use by many goroutines and many processes.
type Store struct {
	client         redis.UniversalClient // immutable
	prefix         string                // immutable
	maxRecordBytes int                   // immutable
	orphans        orphans
}

var _ idempotency.Store = (*Store)(nil)

// New returns a Store on client. It does not contact Redis. It returns an
// error when client is nil or the record bound is not positive.
func New(client redis.UniversalClient, opts ...Option) (*Store, error) {
	o := options{prefix: DefaultKeyPrefix, maxRecordBytes: DefaultMaxRecordBytes}
	for _, opt := range opts {
		opt.apply(&o)
	}
	if client == nil {
		return nil, errors.New("redisstore: client must not be nil")
	}
	if o.maxRecordBytes < 1 {
		return nil, fmt.Errorf("redisstore: max record bytes %d: must be positive", o.maxRecordBytes)
	}
	return &Store{client: client, prefix: o.prefix, maxRecordBytes: o.maxRecordBytes}, nil
}

// Each record key is one Redis hash with a TTL: field f holds the
// fingerprint, o the owner token while in progress, r the marshalled record
// once completed. The scripts make every transition one atomic step.
var (
	// claimScript: KEYS[1]; ARGV fingerprint, token, lease ms.
	// Returns {1} owned, {2, record} completed, {3, pttl} in progress,
	// {4} mismatch.
	// A claim by the token that holds the key is owned again, with a new
	// lease: a Claim retried with the token of one whose reply was lost.
	claimScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'f', 'r', 'o')
if not v[1] then
  redis.call('HSET', KEYS[1], 'f', ARGV[1], 'o', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1}
end
if v[1] ~= ARGV[1] then return {4} end
if v[2] then return {2, v[2]} end
if v[3] == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1}
end
return {3, redis.call('PTTL', KEYS[1])}
`)

	// completeScript: KEYS[1]; ARGV token, record, ttl ms, fingerprint.
	// Returns 1 when stored, 0 when the token does not own the key. An
	// absent key (the owner's lease ended, no one claimed it since) takes
	// the record with the fingerprint.
	completeScript = redis.NewScript(`
local o = redis.call('HGET', KEYS[1], 'o')
if o ~= ARGV[1] then
  if o or redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
  redis.call('HSET', KEYS[1], 'f', ARGV[4])
end
redis.call('HDEL', KEYS[1], 'o')
redis.call('HSET', KEYS[1], 'r', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
`)

	// renewScript: KEYS[1]; ARGV token, lease ms. Returns 1 when renewed,
	// 0 when the token does not own the key.
	renewScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

	// releaseScript: KEYS[1]; ARGV token. Returns 1 when released, 0 when
	// the token does not own the key.
	releaseScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
`)
)

// redisKey returns the Redis key of k: the prefix, then the scope and the
// method each preceded by its length, then the key, so that no two record
// keys share a Redis key.
func (s *Store) redisKey(k idempotency.RecordKey) string {
	b := make([]byte, 0, len(s.prefix)+len(k.Scope)+len(k.FullMethod)+len(k.Key)+12)
	b = append(b, s.prefix...)
	b = strconv.AppendInt(b, int64(len(k.Scope)), 10)
	b = append(b, ':')
	b = append(b, k.Scope...)
	b = strconv.AppendInt(b, int64(len(k.FullMethod)), 10)
	b = append(b, ':')
	b = append(b, k.FullMethod...)
	b = append(b, k.Key...)
	return string(b)
}

func millis(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

// newToken returns a fresh owner token: 128 random bits.
func newToken() string {
	var tok [16]byte
	_, _ = rand.Read(tok[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(tok[:])
}

// Claim implements idempotency.Store in one round trip (once Redis has
// cached the script; the first use of a script on a server costs one more).
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
// token is used by that one Claim only, so it never makes two owners.
func (s *Store) Claim(ctx context.Context, key idempotency.RecordKey, fingerprint []byte, lease time.Duration) (idempotency.Claim, error) {
	rkey := s.redisKey(key)
	token, ok := s.orphans.take(rkey, fingerprint)
	if !ok {
		token = newToken()
	}
	sent := time.Now()
	res, err := claimScript.Run(ctx, s.client, []string{rkey}, fingerprint, token, millis(lease)).Slice()
	if err != nil {
		s.abandon(ctx, rkey, fingerprint, token, sent.Add(lease))
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
	}
	return idempotency.Claim{}, fmt.Errorf("redisstore: claim: unexpected reply %v", res)
}

// abandon undoes a Claim of rkey with token whose outcome is unknown: it
// releases the key, if token holds it, on a context that ctx's cancellation
// does not reach, bounded by releaseTimeout. Unless Redis confirms the
// release, the claim may outlive the call (the release failed, or ran before
// a delayed claim), so the token is remembered until until, the latest end
// of the claim's lease, for the next Claim of rkey for fingerprint.
func (s *Store) abandon(ctx context.Context, rkey string, fingerprint []byte, token string, until time.Time) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if n, err := releaseScript.Run(rctx, s.client, []string{rkey}, token).Int(); err == nil && n == 1 {
		return
	}
	s.orphans.put(rkey, fingerprint, token, until)
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

// Complete implements idempotency.Store in one round trip.
func (s *Store) Complete(ctx context.Context, key idempotency.RecordKey, token string, rec *idempotency.Record, ttl time.Duration) error {
	if n := rec.Size(); n > s.maxRecordBytes {
		return fmt.Errorf("redisstore: %w: %d bytes, bound %d", idempotency.ErrRecordTooLarge, n, s.maxRecordBytes)
	}
	data, err := rec.MarshalBinary()
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	ok, err := completeScript.Run(ctx, s.client, []string{s.redisKey(key)}, token, data, millis(ttl), rec.Fingerprint).Int()
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
	ok, err := renewScript.Run(ctx, s.client, []string{s.redisKey(key)}, token, millis(lease)).Int()
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
	ok, err := releaseScript.Run(ctx, s.client, []string{s.redisKey(key)}, token).Int()
	if err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	if ok != 1 {
		return fmt.Errorf("redisstore: release: %w", idempotency.ErrNotOwner)
	}
	return nil
}
