package redisquota

import (
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
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	quota "github.com/grpc-resilience/resilience/interceptor/ratelimit"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/internal/ratelimit"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Defaults of New.
const (
	DefaultKeyPrefix    = "rl:"
	DefaultLeaseTimeout = 100 * time.Millisecond
)

// ErrClosed is the failure of the leases asked after Store.Close.
var ErrClosed = errors.New("redisquota: store closed")

// Option configures New.
type Option interface{ apply(*options) }

type options struct {
	prefix  string
	timeout time.Duration
	logger  *slog.Logger
	mp      metric.MeterProvider
	errs    []string
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

// WithKeyPrefix sets the prefix of every Redis key the store writes
// (default DefaultKeyPrefix). Stores with different prefixes share
// nothing. It must not contain '{' or '}'.
func WithKeyPrefix(p string) Option { return optionFunc(func(o *options) { o.prefix = p }) }

// WithLeaseTimeout bounds how long a call waits for a lease before the
// limiter gives Redis up and decides by its fallback (default
// DefaultLeaseTimeout, 100ms), and the context of each lease's script.
func WithLeaseTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) {
		if d <= 0 {
			o.errs = append(o.errs, fmt.Sprintf("WithLeaseTimeout(%v): must be positive", d))
		}
		o.timeout = d
	})
}

// WithLogger sets the logger of the fallback's transitions (default
// slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) {
		if l == nil {
			o.errs = append(o.errs, "WithLogger(nil): logger must not be nil")
		}
		o.logger = l
	})
}

// WithMeterProvider records the store's metrics with mp (see the package
// documentation); without it nothing is recorded.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(o *options) {
		if mp == nil {
			o.errs = append(o.errs, "WithMeterProvider(nil): provider must not be nil")
		}
		o.mp = mp
	})
}

// Store is the Redis side of the distributed rate limits of one server
// replica: the Limiters it makes lease tokens of Redis through it. It is
// safe for concurrent use. Close it when the server stops: it waits for
// the leases in flight.
type Store struct {
	client  redis.UniversalClient // immutable
	opts    options               // immutable
	replica string                // this replica's id in Redis: 128 random bits; immutable
	metrics *metrics              // immutable

	mu       sync.Mutex
	closed   bool                // guarded by mu
	names    map[string]struct{} // the Limiters' names; guarded by mu
	inflight sync.WaitGroup      // the leases' goroutines; Add under mu while !closed
}

// New returns a Store on client. It does not contact Redis. It returns an
// error naming the option when an option is out of range or client is nil.
//
// A lease's goroutine is bounded by the lease timeout only when go-redis
// applies contexts to its socket I/O (ContextTimeoutEnabled in its
// options); otherwise by its ReadTimeout and WriteTimeout (3 s by
// default). Calls never wait past the lease timeout either way, but Close
// waits for the goroutines: New logs a warning when the client is a
// *redis.Client or *redis.ClusterClient without ContextTimeoutEnabled.
func New(client redis.UniversalClient, opts ...Option) (*Store, error) {
	o := options{prefix: DefaultKeyPrefix, timeout: DefaultLeaseTimeout, logger: slog.Default()}
	for _, opt := range opts {
		opt.apply(&o)
	}
	switch {
	case client == nil:
		return nil, errors.New("redisquota: client must not be nil")
	case len(o.errs) > 0:
		return nil, errors.New("redisquota: " + strings.Join(o.errs, "; "))
	case strings.ContainsAny(o.prefix, "{}"):
		return nil, fmt.Errorf("redisquota: key prefix %q: must not contain '{' or '}', which would make it the Cluster hash tag of every key", o.prefix)
	}
	ctxTimeouts := true
	switch c := client.(type) {
	case *redis.Client:
		ctxTimeouts = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		ctxTimeouts = c.Options().ContextTimeoutEnabled
	}
	if !ctxTimeouts {
		o.logger.Warn("redisquota: the Redis client does not apply contexts to its socket I/O (ContextTimeoutEnabled is false): " +
			"a lease to an unresponsive Redis holds its goroutine, and Close, until the client's read timeout")
	}
	m, err := newMetrics(o.mp)
	if err != nil {
		return nil, err
	}
	var id [16]byte
	_, _ = rand.Read(id[:])
	return &Store{client: client, opts: o, replica: base64.RawURLEncoding.EncodeToString(id[:]),
		metrics: m, names: map[string]struct{}{}}, nil
}

// Fallback is what a Limiter decides while Redis cannot be reached, for
// the calls its leased tokens do not cover.
type Fallback uint8

const (
	// FallbackLocalShare (the default) limits each replica to the rate
	// divided by the replicas that leased tokens of the key recently.
	FallbackLocalShare Fallback = iota
	// FallbackOpen admits every call.
	FallbackOpen
	// FallbackClosed refuses every call the held tokens do not cover.
	FallbackClosed
)

// String returns "localShare", "open" or "closed", as the server document
// names them.
func (f Fallback) String() string {
	switch f {
	case FallbackOpen:
		return string(serviceconfig.FallbackOpen)
	case FallbackClosed:
		return string(serviceconfig.FallbackClosed)
	}
	return string(serviceconfig.FallbackLocalShare)
}

// Limit is one distributed rate limit: Rate calls per Per for each key,
// summed over every replica, with bursts of Burst.
type Limit struct {
	Rate    float64
	Per     time.Duration // 0: one second
	Burst   int
	MaxKeys int // keys this replica remembers; 0: 10,000
	// Fallback is what the Limiter does while Redis is unreachable.
	Fallback Fallback
	// LeasePeriod is how far ahead of Redis's clock a key's leases may
	// reach: what a replica that dies takes with it. 0: 200ms.
	LeasePeriod time.Duration
	// ProbeInterval is how often a Limiter in fallback asks Redis again.
	// 0: 250ms.
	ProbeInterval time.Duration
	// ReplicaWindow is how long a replica counts among a key's after its
	// last lease, for the local share. 0: 10 s.
	ReplicaWindow time.Duration
}

// LimitOf returns the Limit of a distributed limit of the server
// document.
func LimitOf(r *serviceconfig.RateLimit) Limit {
	l := Limit{Rate: r.Rate, Per: r.Per, Burst: r.Burst, MaxKeys: r.MaxKeys}
	switch r.Fallback {
	case serviceconfig.FallbackOpen:
		l.Fallback = FallbackOpen
	case serviceconfig.FallbackClosed:
		l.Fallback = FallbackClosed
	}
	return l
}

// Limiter is one distributed rate limit of this replica. Its Allow decides
// from the tokens it leased, without a round trip; a lease goes to Redis
// in the background when they run low.
type Limiter struct {
	name   string            // immutable
	store  *Store            // immutable
	shared *ratelimit.Shared // immutable
	limit  Limit             // immutable
	sets   limitSets         // immutable
}

// Limiter returns the Limiter of the limit named name (unique in the
// store: the name is part of its Redis keys, so replicas that give a
// limit the same name share it) with the settings of l. It returns an
// error naming what is out of range.
func (s *Store) Limiter(name string, l Limit) (*Limiter, error) {
	if name == "" || len(name) > serviceconfig.MaxRateLimitName || strings.ContainsAny(name, "{}") {
		return nil, fmt.Errorf("redisquota: limit name %q: want 1 to %d bytes, no braces", name, serviceconfig.MaxRateLimitName)
	}
	sh, err := ratelimit.NewShared(ratelimit.SharedConfig{
		Config:      ratelimit.Config{Rate: l.Rate, Per: l.Per, Burst: l.Burst, MaxKeys: l.MaxKeys},
		LeasePeriod: l.LeasePeriod, Fallback: ratelimit.FallbackMode(l.Fallback), ProbeInterval: l.ProbeInterval,
		ReplicaWindow: l.ReplicaWindow,
	}, time.Now())
	if err != nil {
		return nil, fmt.Errorf("redisquota: limit %q: %w", name, err)
	}
	if l.Fallback > FallbackClosed {
		return nil, fmt.Errorf("redisquota: limit %q: unknown Fallback %d", name, l.Fallback)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.names[name]; dup {
		return nil, fmt.Errorf("redisquota: limit %q: a Limiter of that name exists in this store", name)
	}
	s.names[name] = struct{}{}
	lim := &Limiter{name: name, store: s, shared: sh, limit: l, sets: s.metrics.sets(name)}
	s.metrics.watch(lim)
	return lim, nil
}

// Decision is a Limiter's decision on one call (see ratelimit.Decision).
type Decision = quota.Decision

// criticality maps the wire's criticality to the engine's: the same
// order and numbers.
func criticality(c wire.Criticality) ratelimit.Criticality { return ratelimit.Criticality(c) }

// Allow decides a call of criticality c for key. It does not wait for
// Redis unless this replica holds no token of key and a lease is on its
// way (the key's first call, or one that finds its tokens spent): then it
// waits for the lease, at most the lease timeout and until ctx ends; past
// the timeout, the Limiter gives Redis up (fallback) and decides by its
// fallback. The error is ctx's, when it ended first.
func (l *Limiter) Allow(ctx context.Context, key string, c wire.Criticality) (Decision, error) {
	for waited := false; ; waited = true {
		d, lease := l.shared.Decide(time.Now(), key, criticality(c))
		if lease != nil {
			l.send(lease)
		}
		if d.Pending != nil && waited {
			// Another lease is on its way already (another call asked for
			// it): refuse rather than wait twice, told to come back after
			// an interval.
			return Decision{Wait: l.shared.Interval()}, nil
		}
		if d.Pending == nil {
			return Decision{OK: d.OK, Wait: d.Wait, Fallback: d.Fallback}, nil
		}
		timer := time.NewTimer(l.store.opts.timeout)
		select {
		case <-d.Pending:
			timer.Stop()
		case <-timer.C:
			l.transition(l.shared.Expire(time.Now()), fmt.Errorf("no answer within the lease timeout (%v)", l.store.opts.timeout))
		case <-ctx.Done():
			timer.Stop()
			return Decision{}, ctx.Err()
		}
	}
}

// Refund gives back the token of a call Allow admitted for key and that
// did not run (another limit refused it): the earliest lease held takes
// it back, or, in the local share of the fallback, the share does. A
// token whose lease has ended since is lost, as is a refund in
// FallbackOpen.
func (l *Limiter) Refund(key string) { l.shared.Refund(time.Now(), key) }

// RateLimiter returns the Limiter of the distributed limit r of a server
// document (Limiter(r.Name, LimitOf(&r))): it makes a Store the
// server's quota store (server.Limits.Quota).
func (s *Store) RateLimiter(r serviceconfig.RateLimit) (quota.Limiter, error) {
	l, err := s.Limiter(r.Name, LimitOf(&r))
	if err != nil {
		return nil, err
	}
	return l, nil
}

var (
	_ quota.Store   = (*Store)(nil)
	_ quota.Limiter = (*Limiter)(nil)
)

// InFallback reports whether the Limiter is in fallback: Redis did not
// answer its last lease.
func (l *Limiter) InFallback() bool { return l.shared.InFallback() }

// Name returns the limit's name.
func (l *Limiter) Name() string { return l.name }

// send asks Redis for lease in a goroutine of the store's, and delivers
// the answer.
func (l *Limiter) send(lease *ratelimit.Lease) {
	s := l.store
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.transition(l.shared.Deliver(lease, time.Now(), ratelimit.Grant{}, ErrClosed), ErrClosed)
		return
	}
	s.inflight.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.inflight.Done()
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.timeout)
		defer cancel()
		start := time.Now()
		g, err := l.lease(ctx, lease)
		s.metrics.leased(ctx, l, g, err, time.Since(start))
		l.transition(l.shared.Deliver(lease, time.Now(), g, err), err)
	}()
}

// transition logs and counts a change of the Limiter's fallback.
func (l *Limiter) transition(tr ratelimit.Transition, err error) {
	switch tr {
	case ratelimit.EnteredFallback:
		l.store.opts.logger.Warn("redisquota: Redis is unreachable: the rate limit decides by its fallback",
			"limit", l.name, "fallback", l.limit.Fallback.String(), "error", err)
		l.store.metrics.fallback(l, true)
	case ratelimit.LeftFallback:
		l.store.opts.logger.Info("redisquota: Redis answers again: the rate limit leases tokens again", "limit", l.name)
		l.store.metrics.fallback(l, false)
	}
}

// Close stops the store's leases: it waits for those in flight, and the
// Limiters decide by their fallback from then on. It is safe to call more
// than once.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.inflight.Wait()
	return s.metrics.close()
}

// leaseScript is GCRA with leases, on the key's hash: field t is the TAT
// (µs on Redis's clock, as text, exact to the bit), and a field "r:<id>"
// per replica holds when it last leased. ARGV: t, tau and horizon (µs),
// want, min, this replica's id, the replica window (µs). It returns
// {tokens, first slot − now (ns), tokens left, replicas, retry after
// (ns)}. The key lives while its bucket refills or a replica counts.
var leaseScript = redis.NewScript(`
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local t = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local h = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local mn = tonumber(ARGV[5])
local me = 'r:' .. ARGV[6]
local win = tonumber(ARGV[7])
local tat = 0
local n = 1
local f = redis.call('HGETALL', KEYS[1])
for i = 1, #f, 2 do
  local k = f[i]
  if k == 't' then
    tat = tonumber(f[i + 1])
  elseif k ~= me then
    if now - tonumber(f[i + 1]) <= win then n = n + 1 else redis.call('HDEL', KEYS[1], k) end
  end
end
redis.call('HSET', KEYS[1], me, now)
local base = math.max(tat, now)
local room = math.floor((now + tau + h - base) / t)
local k = math.min(want, room)
if k < mn then
  redis.call('PEXPIRE', KEYS[1], math.ceil(math.max(base - now, win) / 1000) + 1)
  return {0, 0, 0, n, math.ceil((base + mn * t - (now + tau + h)) * 1000)}
end
local nt = base + k * t
redis.call('HSET', KEYS[1], 't', string.format('%.17g', nt))
redis.call('PEXPIRE', KEYS[1], math.ceil(math.max(nt - now, win) / 1000) + 1)
return {k, math.floor((base + t - tau - now) * 1000), math.max(0, math.floor((now + tau - nt) / t)), n, 0}
`)

// redisKey is the Redis key of key's bucket in the limit: prefix + "{" +
// name + ":" + the unpadded base64url of the first 12 bytes of key's
// SHA-256 + "}". The braces are the Redis Cluster hash tag: each key of
// each limit is a slot of its own, chosen by the hash, so a caller who
// chooses the key (a tenant name) cannot choose the slot or grow the name.
func (l *Limiter) redisKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return l.store.opts.prefix + "{" + l.name + ":" + base64.RawURLEncoding.EncodeToString(sum[:12]) + "}"
}

// overflowKey is the Redis key of the bucket that the keys beyond MaxKeys
// share (ratelimit.Lease.Overflow): prefix + "{" + name + ":overflow}",
// which no key's hash (16 base64url characters) can equal.
func (l *Limiter) overflowKey() string { return l.store.opts.prefix + "{" + l.name + ":overflow}" }

// lease runs the script for lease.
func (l *Limiter) lease(ctx context.Context, lease *ratelimit.Lease) (ratelimit.Grant, error) {
	s := l.store
	key := l.overflowKey()
	if !lease.Overflow {
		key = l.redisKey(lease.Key)
	}
	res, err := leaseScript.Run(ctx, s.client, []string{key},
		micros(lease.Interval), micros(lease.Tau), micros(lease.Horizon), lease.Want, lease.Min, s.replica,
		micros(lease.ReplicaWindow)).Int64Slice()
	if err != nil {
		return ratelimit.Grant{}, fmt.Errorf("redisquota: lease: %w", err)
	}
	if len(res) != 5 {
		return ratelimit.Grant{}, fmt.Errorf("redisquota: lease: unexpected reply %v", res)
	}
	return ratelimit.Grant{Tokens: int(res[0]), FirstSlot: time.Duration(res[1]), Left: int(res[2]),
		Replicas: int(res[3]), RetryAfter: time.Duration(res[4])}, nil
}

// micros writes d in microseconds, exactly (Redis's clock is in µs; the
// script reads a decimal fraction).
func micros(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Microsecond), 'f', -1, 64)
}
