package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// Defaults of [New].
const (
	DefaultKeyPrefix      = "idem:"
	DefaultMaxRecordBytes = 1 << 20
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
	client         redis.UniversalClient
	prefix         string
	maxRecordBytes int
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
	claimScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'f', 'r')
if not v[1] then
  redis.call('HSET', KEYS[1], 'f', ARGV[1], 'o', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1}
end
if v[1] ~= ARGV[1] then return {4} end
if v[2] then return {2, v[2]} end
return {3, redis.call('PTTL', KEYS[1])}
`)

	// completeScript: KEYS[1]; ARGV token, record, ttl ms. Returns 1 when
	// stored, 0 when the token does not own the key.
	completeScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'o')
redis.call('HSET', KEYS[1], 'r', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
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

// Claim implements idempotency.Store in one round trip (once Redis has
// cached the script; the first use of a script on a server costs one more).
func (s *Store) Claim(ctx context.Context, key idempotency.RecordKey, fingerprint []byte, lease time.Duration) (idempotency.Claim, error) {
	var tok [16]byte
	_, _ = rand.Read(tok[:]) // never fails (crypto/rand)
	token := base64.RawURLEncoding.EncodeToString(tok[:])
	res, err := claimScript.Run(ctx, s.client, []string{s.redisKey(key)}, fingerprint, token, millis(lease)).Slice()
	if err != nil {
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

// Complete implements idempotency.Store in one round trip.
func (s *Store) Complete(ctx context.Context, key idempotency.RecordKey, token string, rec *idempotency.Record, ttl time.Duration) error {
	if n := rec.Size(); n > s.maxRecordBytes {
		return fmt.Errorf("redisstore: %w: %d bytes, bound %d", idempotency.ErrRecordTooLarge, n, s.maxRecordBytes)
	}
	data, err := rec.MarshalBinary()
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	ok, err := completeScript.Run(ctx, s.client, []string{s.redisKey(key)}, token, data, millis(ttl)).Int()
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	if ok != 1 {
		return fmt.Errorf("redisstore: complete: %w", idempotency.ErrNotOwner)
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
