package redisstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
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
	if cc, ok := client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return s.checkPolicy(ctx, node, node.Options().Addr)
		})
	} else {
		err = s.checkPolicy(ctx, client, "")
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

// checkPolicy is Open's check of one server, named node in messages when
// node is not empty (a cluster's primary). It is safe for concurrent use.
func (s *Store) checkPolicy(ctx context.Context, client redis.UniversalClient, node string) error {
	o := s.opts
	where, attrs := "", []any{}
	if node != "" {
		where, attrs = " on node "+node, []any{"node", node}
	}
	res, err := client.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		if isCommandRefused(err) {
			o.logger.Warn("redisstore: cannot read maxmemory-policy (CONFIG is disabled); make sure it is noeviction, "+
				"or Redis may drop live claims and records under memory pressure", append(attrs, "error", err)...)
			return nil
		}
		return fmt.Errorf("redisstore: reading maxmemory-policy%s: %w", where, err)
	}
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

// WithLogger sets the logger of [Open]'s warnings (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return optionFunc(func(o *options) { o.logger = l }) }

// Store is an idempotency.Store in Redis. Its methods are safe for
// concurrent use by many goroutines and many processes.
type Store struct {
	opts    options               // immutable
	client  redis.UniversalClient // immutable
	orphans orphans
}

var _ idempotency.Store = (*Store)(nil)

// New returns a Store on client. It does not contact Redis; [Open] also
// checks the server's eviction policy, and is what a server should call at
// startup. It returns an
// error when client is nil or the record bound is not positive.
func New(client redis.UniversalClient, opts ...Option) (*Store, error) {
	o := options{prefix: DefaultKeyPrefix, maxRecordBytes: DefaultMaxRecordBytes, logger: slog.Default()}
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
	return &Store{opts: o, client: client}, nil
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

// redisKey returns the Redis key of k: the prefix, then, inside a Redis
// Cluster hash tag, the unpadded base64url SHA-256 of the scope and the
// method, each preceded by its length, and the key. One record is one key,
// hence one slot; the client's text is not in it, so a client cannot choose
// the slot (a "{t}" in its key is hashed like any other byte), and the key's
// length does not grow with the client's key.
func (s *Store) redisKey(k idempotency.RecordKey) string {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(k.Scope)))
	h.Write(n[:])
	h.Write([]byte(k.Scope))
	binary.BigEndian.PutUint64(n[:], uint64(len(k.FullMethod)))
	h.Write(n[:])
	h.Write([]byte(k.FullMethod))
	h.Write([]byte(k.Key))
	var sum [sha256.Size]byte
	var tag [43]byte // base64.RawURLEncoding.EncodedLen(sha256.Size)
	base64.RawURLEncoding.Encode(tag[:], h.Sum(sum[:0]))
	// One allocation: the key itself.
	var b strings.Builder
	b.Grow(len(s.opts.prefix) + 2 + len(tag))
	b.WriteString(s.opts.prefix)
	b.WriteByte('{')
	b.Write(tag[:])
	b.WriteByte('}')
	return b.String()
}

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
	cmd, err := s.run(ctx, claimScript, rkey, claimWrote, fingerprint, token, millis(lease))
	var res []any
	if err == nil {
		res, err = cmd.Slice()
	}
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

// claimWrote and completeWrote report whether a reply of claimScript and
// completeScript says that the script took the key or stored the record.
func claimWrote(cmd *redis.Cmd) bool {
	res, _ := cmd.Slice()
	return len(res) > 0 && res[0] == int64(1)
}

func completeWrote(cmd *redis.Cmd) bool {
	n, _ := cmd.Int()
	return n == 1
}

// run runs script on rkey. With WithMinReplicas, it runs it on one
// connection to rkey's primary and then, when wrote reports that the script
// wrote, WAITs on that connection (WAIT counts the acknowledgements of the
// connection's own last write); the error is then that of the wait, or
// wraps ErrNotReplicated, and cmd holds the script's reply. Without, it is
// script.Run on the client.
func (s *Store) run(ctx context.Context, script *redis.Script, rkey string, wrote func(*redis.Cmd) bool, args ...any) (*redis.Cmd, error) {
	if s.opts.minReplicas == 0 {
		return script.Run(ctx, s.client, []string{rkey}, args...), nil
	}
	var node *redis.Client
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		var err error
		if node, err = c.MasterForKey(ctx, rkey); err != nil {
			return nil, err
		}
	case *redis.Client:
		node = c
	}
	conn := node.Conn()
	defer conn.Close()
	cmd := script.Run(ctx, conn, []string{rkey}, args...)
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
	cmd, err := s.run(ctx, completeScript, s.redisKey(key), completeWrote, token, data, millis(ttl), rec.Fingerprint)
	var ok int
	if err == nil {
		ok, err = cmd.Int()
	}
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
