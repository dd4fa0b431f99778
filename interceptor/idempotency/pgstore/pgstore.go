package pgstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// Defaults of [New] and [Open].
const (
	DefaultSchema         = "public"
	DefaultMaxRecordBytes = 1 << 20
	// DefaultScopeBytes is each scope's quota of bytes (see WithScopeQuota):
	// with DefaultMaxRecordBytes records, at least a thousand of them.
	DefaultScopeBytes = 1 << 30
	// DefaultScopePartitions is the number of partitions of each scope (see
	// WithScopePartitions).
	DefaultScopePartitions = 8
	// DefaultMinRetention is how long a completed record is kept at least
	// before its scope may evict it to make room within its quota (or until
	// its TTL, if shorter).
	DefaultMinRetention = time.Minute
	// DefaultLockTimeout bounds the store's own waits for a lock in joined
	// mode (see WithLockTimeout).
	DefaultLockTimeout = time.Second
	// DefaultTxIdleTimeout ends a joined transaction left idle that long
	// (see WithTxIdleTimeout).
	DefaultTxIdleTimeout = time.Minute
	// DefaultConnCheckInterval is how often PostgreSQL checks, during a
	// statement of a joined transaction, that the store's connection is
	// still there (see WithConnCheckInterval).
	DefaultConnCheckInterval = 250 * time.Millisecond
	// DefaultPhaseRetention is how long a call's committed phases are kept
	// for a retry to resume (see WithPhaseRetention).
	DefaultPhaseRetention = 24 * time.Hour
	// DefaultReapInterval and DefaultReapBatch: the reaper of Open deletes
	// rows past their end every minute, in batches of 1,000.
	DefaultReapInterval = time.Minute
	DefaultReapBatch    = 1000
)

// Bounds of the store's own statements on a context detached from the
// caller's.
const (
	// cleanupTimeout bounds a rollback, and the release that follows a
	// failed Claim.
	cleanupTimeout = 5 * time.Second
	// releaseTimeout bounds the release after a failed Claim, whose reply
	// may have been lost.
	releaseTimeout = 500 * time.Millisecond
)

// Option configures [New] and [Open].
type Option interface{ apply(*options) }

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

type options struct {
	schema         string
	maxRecordBytes int
	scopeEntries   int64
	scopeBytes     int64
	partitions     int
	minRetention   time.Duration
	lockTimeout    time.Duration
	txIdleTimeout  time.Duration
	connCheck      time.Duration
	phaseRetention time.Duration
	reapInterval   time.Duration
	reapBatch      int
	txOptions      pgx.TxOptions
	logger         *slog.Logger
	txPerScope     int // 0: the default share of the pool
	txTotal        int // 0: the default share of the pool
}

// WithSchema sets the schema that holds the store's tables and functions
// (default DefaultSchema). Stores with different schemas share nothing.
// [Migrate] creates them there; the schema itself must exist.
func WithSchema(name string) Option { return optionFunc(func(o *options) { o.schema = name }) }

// WithMaxRecordBytes bounds the size of one record, as
// idempotency.Record.Size estimates it (default DefaultMaxRecordBytes). In
// lease mode, Complete refuses a larger record with
// idempotency.ErrRecordTooLarge and keeps the claim; in joined mode, the
// transaction is rolled back (the handler's writes with it) and Commit
// returns that error.
func WithMaxRecordBytes(n int) Option { return optionFunc(func(o *options) { o.maxRecordBytes = n }) }

// WithScopeQuota bounds what one scope (idempotency.RecordKey.Scope, one
// caller or tenant) holds in the table: at most entries rows and about
// bytes bytes (each row's record, fingerprint, method and key, and a fixed
// overhead for the row and its index entries). 0 leaves that bound off;
// WithScopeQuota(0, 0) turns the quota off: rows are then not counted, and
// no claim touches the quota table. The default is DefaultScopeBytes and no
// bound on entries.
//
// Lease mode: the quota is exact per partition (see WithScopePartitions):
// a claim checks it and counts itself in one statement, under the lock of
// the partition's quota row. A claim that would pass it first drops the
// partition's ended rows and evicts its completed records past the minimum
// retention ([WithMinRetention]), oldest first; if that is not enough, the
// Claim fails with an [*idempotency.FullError] (Scope true, RetryAfter the
// soonest end of a lease or retention in the partition), and the
// interceptor answers RESOURCE_EXHAUSTED. An owner's outcome is always
// stored, even past the quota.
//
// Joined mode: a claim reads its partition's count without a lock, and a
// committed row is counted after its transaction commits, in a short
// transaction of its own (so no quota row is ever locked across a
// handler). The quota may then be passed by the calls in flight at once,
// and a row whose process died between the two commits is not counted.
//
// The cost: the quota row of a partition is written by every claim
// (lease mode) or completion (joined mode) of its scope; see
// WithScopePartitions for the contention this brings.
func WithScopeQuota(entries int, bytes int64) Option {
	return optionFunc(func(o *options) { o.scopeEntries, o.scopeBytes = int64(entries), bytes })
}

// WithScopePartitions sets the number of partitions of each scope (default
// DefaultScopePartitions). A scope's keys are spread over its partitions by
// a hash of the record key; each partition has its own quota row, with its
// share of the quota (entries/n and bytes/n). Lease-mode claims of one
// partition take its quota row's lock in turn, each for one short
// statement and its commit, so more partitions let more claims of one
// scope (the shared scope's, or a big tenant's) commit at once; fewer make
// the quota more exact (a scope is refused somewhat before its whole quota
// when its keys hash unevenly). Changing it moves no row: rows keep the
// partition they were counted in.
func WithScopePartitions(n int) Option { return optionFunc(func(o *options) { o.partitions = n }) }

// WithMinRetention sets how long a completed record is kept at least
// before its scope, at its quota, may evict it to make room (default
// DefaultMinRetention), unless its TTL is shorter.
func WithMinRetention(d time.Duration) Option {
	return optionFunc(func(o *options) { o.minRetention = d })
}

// WithLockTimeout bounds the store's own waits for a lock in joined mode
// (PostgreSQL's lock_timeout, default DefaultLockTimeout), for the claim's
// statement only: the handler's statements run under the session's own
// lock_timeout, restored in the same statement. A claim never waits for
// another call's transaction (a duplicate sees the key's advisory lock
// held and is InProgress at once); it waits for a store statement that
// holds the key's row for a moment, or for a lock on the store's table (a
// migration's, an operator's): past the bound it fails, and the
// interceptor answers UNAVAILABLE with its retry hint. It also bounds the
// wait of a phase's next transaction for the key's lock, and the end of a
// call for its handler's statements still under way (see Tx). It is the
// RetryAfter of an InProgress claim and of a refusal by WithJoinedTxLimit.
func WithLockTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) { o.lockTimeout = d })
}

// WithTxIdleTimeout sets PostgreSQL's idle_in_transaction_session_timeout
// for the joined transactions (default DefaultTxIdleTimeout): a
// transaction that sends nothing for that long has its session ended by
// the server, which rolls it back and frees its key. It bounds how long an
// owner that is cut off (a network partition, a frozen process) holds its
// key; a crashed process's connection closes, and its transaction ends at
// once. A handler must not stay idle in its transaction longer (a slow
// foreign call belongs in a Phase of its own, or before the write). Keep it
// above the server's bound on a detached handler
// (server.Idempotency.DetachedMax, 30 s), so that a session ends only after
// the handler's context has.
//
// 0 leaves the setting of the server, database or role: the risky choice,
// since PostgreSQL's own default, 0, never ends such a session, and a
// cut-off owner then holds its key until TCP gives up on the connection
// (keepalives: hours by default).
func WithTxIdleTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) { o.txIdleTimeout = d })
}

// WithConnCheckInterval sets PostgreSQL's client_connection_check_interval
// for the joined transactions (default DefaultConnCheckInterval):
// during a statement, the server checks that often whether the store's
// connection is still there, and, when it is gone (the owner's process
// died), cancels the statement and rolls the transaction back. Without it
// a dead owner's statement runs to its end (a slow query, a lock wait)
// before its transaction is rolled back, and its key stays held until then;
// with it, the key is free within about the interval. (An idle
// transaction's dead connection is noticed at once either way.) It needs
// PostgreSQL 14 or later on Linux, macOS or BSD: [Open] checks. 0 leaves
// the server's setting (PostgreSQL's default, 0, is off).
func WithConnCheckInterval(d time.Duration) Option {
	return optionFunc(func(o *options) { o.connCheck = d })
}

// WithPhaseRetention sets how long a call's committed phases (see Phase)
// are kept after the last one, for a retry to resume them, when the call
// does not complete (default DefaultPhaseRetention; see Completer, which
// finishes them sooner), and how long the store's verdict on a handler that
// ended its joined transaction itself is kept (see Tx).
func WithPhaseRetention(d time.Duration) Option {
	return optionFunc(func(o *options) { o.phaseRetention = d })
}

// WithReaper sets the reaper that [Open] starts: every interval, it deletes
// rows past their end in batches of batch rows, until none is left
// (default DefaultReapInterval and DefaultReapBatch). An interval of 0
// starts none: then call [Store.Reap] yourself, or rows past their end stay
// until their key is claimed again or their scope needs room.
func WithReaper(interval time.Duration, batch int) Option {
	return optionFunc(func(o *options) { o.reapInterval, o.reapBatch = interval, batch })
}

// WithTxOptions sets the options of the joined transactions, such as their
// isolation level (default: PostgreSQL's default, READ COMMITTED unless the
// server says otherwise). BeginQuery and CommitQuery are not supported.
// Under REPEATABLE READ and SERIALIZABLE, a serialization failure (or a
// deadlock, or a lock or statement timeout, under any level) is never
// stored as the call's outcome: the
// interceptor answers ABORTED with its retry hint, and the retry runs the
// call again (see Tx).
func WithTxOptions(opts pgx.TxOptions) Option {
	return optionFunc(func(o *options) { o.txOptions = opts })
}

// WithJoinedTxLimit bounds the transactions that joined mode holds open at
// once: at most perScope for the keyed calls of one scope
// (idempotency.RecordKey.Scope: one caller or tenant, or every caller with
// server.SharedScope), and at most total in all. Each holds a pool
// connection while its handler runs, slow or not. A claim past a bound,
// after its lookup (so a replay of a completed key, or a duplicate of a
// call in progress, never counts), waits for a slot, holding no pool
// connection, up to the lock timeout and half of the caller's time left: a
// burst of fast calls queues for a moment. Past it, the claim is refused with an [*idempotency.FullError]
// (Scope true when the scope's bound is what is full, RetryAfter the lock
// timeout): the interceptor answers RESOURCE_EXHAUSTED with a RetryInfo,
// which clients honour as a pushback. See the package documentation for
// sizing the pool.
//
// 0 takes the default, a share of the pool's MaxConns: half of it per scope,
// so that one caller's slow calls never hold more than half the
// connections; and all but a quarter of it in all, so that some
// connections are always left for lookups (a replay is one, and so is the
// first step of every claim) and the application's own statements, however
// many scopes are slow at once. Both are at least 1: MaxConns 2 gives 1 and
// 1; 4 (pgxpool's least default) 2 and 3; 10 gives 5 and 8. Neither may
// pass MaxConns, nor perScope total; perScope = total = MaxConns turns the
// bounds off (the risky choice: slow calls may then take every connection,
// and other calls wait for one in the pool until their deadline).
func WithJoinedTxLimit(perScope, total int) Option {
	return optionFunc(func(o *options) { o.txPerScope, o.txTotal = perScope, total })
}

// WithLogger sets the logger of the store's warnings and of its reaper
// (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return optionFunc(func(o *options) { o.logger = l }) }

// Store is an idempotency.Store in PostgreSQL in lease mode: a key is held
// by a row under a lease, as in the memory and Redis stores. [Store.Joined]
// returns the same store in joined mode. Its methods are safe for
// concurrent use by many goroutines and many processes.
type Store struct {
	pool  *pgxpool.Pool // immutable
	opts  options       // immutable
	sql   statements    // immutable
	quota quota         // each partition's share; immutable
	slots *txSlots      // joined transactions open; immutable pointer

	reaper *reaper // nil without one; set by Open
	close  sync.Once
}

var _ idempotency.Store = (*Store)(nil)

// quota is a partition's share of the scope quota.
type quota struct{ entries, bytes int64 }

func (q quota) on() bool { return q.entries > 0 || q.bytes > 0 }

// New returns a Store on pool. It does not contact PostgreSQL, so it does
// not check that the schema was migrated ([Open] does, and starts the
// reaper). It returns an error naming the option when pool is nil or an
// option is out of range.
func New(pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	o := options{
		schema: DefaultSchema, maxRecordBytes: DefaultMaxRecordBytes, scopeBytes: DefaultScopeBytes,
		partitions: DefaultScopePartitions, minRetention: DefaultMinRetention, lockTimeout: DefaultLockTimeout,
		txIdleTimeout: DefaultTxIdleTimeout, connCheck: DefaultConnCheckInterval, phaseRetention: DefaultPhaseRetention,
		reapInterval: DefaultReapInterval, reapBatch: DefaultReapBatch, logger: slog.Default(),
	}
	for _, opt := range opts {
		opt.apply(&o)
	}
	if err := o.validate(pool); err != nil {
		return nil, err
	}
	slots, err := o.slots(int(pool.Config().MaxConns))
	if err != nil {
		return nil, err
	}
	return &Store{pool: pool, opts: o, sql: newStatements(o.schema, o.txOptions), quota: o.share(), slots: slots}, nil
}

// slots returns the bounds of WithJoinedTxLimit for a pool of maxConns.
func (o *options) slots(maxConns int) (*txSlots, error) {
	perScope, total := joinedTxDefaults(maxConns)
	if o.txPerScope != 0 {
		perScope = o.txPerScope
	}
	if o.txTotal != 0 {
		total = o.txTotal
	}
	if o.txPerScope < 0 || o.txTotal < 0 || total > maxConns || perScope > total {
		return nil, fmt.Errorf("pgstore: WithJoinedTxLimit(%d, %d): need 0 (the default) or 1 to the pool's MaxConns (%d) "+
			"for each, and perScope no more than total (%d and %d with the defaults)", o.txPerScope, o.txTotal, maxConns, perScope, total)
	}
	return &txSlots{perScope: perScope, total: total, retryAfter: o.lockTimeout}, nil
}

func (o *options) validate(pool *pgxpool.Pool) error {
	switch {
	case pool == nil:
		return errors.New("pgstore: pool must not be nil")
	case o.schema == "":
		return errors.New("pgstore: WithSchema(\"\"): the schema must be named")
	case len(o.schema) > maxIdentifier || strings.ContainsRune(o.schema, 0):
		return fmt.Errorf("pgstore: WithSchema(%q): a PostgreSQL identifier is at most %d bytes, without NUL", o.schema, maxIdentifier)
	case o.maxRecordBytes < 1:
		return fmt.Errorf("pgstore: WithMaxRecordBytes(%d): must be positive", o.maxRecordBytes)
	case o.scopeEntries < 0 || o.scopeBytes < 0:
		return fmt.Errorf("pgstore: WithScopeQuota(%d, %d): must not be negative", o.scopeEntries, o.scopeBytes)
	case o.partitions < 1 || o.partitions > 1<<15:
		return fmt.Errorf("pgstore: WithScopePartitions(%d): must be 1 to 32768", o.partitions)
	case o.scopeEntries > 0 && o.scopeEntries < int64(o.partitions):
		return fmt.Errorf("pgstore: WithScopeQuota(%d, ...): fewer entries than the %d partitions of a scope "+
			"(WithScopePartitions); each partition needs one at least", o.scopeEntries, o.partitions)
	case o.minRetention < 0:
		return fmt.Errorf("pgstore: WithMinRetention(%v): must not be negative", o.minRetention)
	case o.lockTimeout < time.Millisecond:
		return fmt.Errorf("pgstore: WithLockTimeout(%v): must be at least 1ms", o.lockTimeout)
	case o.txIdleTimeout < 0 || o.txIdleTimeout > 0 && o.txIdleTimeout < time.Millisecond:
		return fmt.Errorf("pgstore: WithTxIdleTimeout(%v): must be 0 (the server's setting) or at least 1ms", o.txIdleTimeout)
	case o.connCheck < 0 || o.connCheck > 0 && o.connCheck < time.Millisecond:
		return fmt.Errorf("pgstore: WithConnCheckInterval(%v): must be 0 (the server's setting) or at least 1ms", o.connCheck)
	case o.phaseRetention < time.Millisecond:
		return fmt.Errorf("pgstore: WithPhaseRetention(%v): must be at least 1ms", o.phaseRetention)
	case o.reapInterval < 0 || o.reapInterval > 0 && o.reapBatch < 1:
		return fmt.Errorf("pgstore: WithReaper(%v, %d): need interval >= 0, and batch >= 1 with an interval", o.reapInterval, o.reapBatch)
	case o.logger == nil:
		return errors.New("pgstore: WithLogger(nil): logger must not be nil")
	case o.txOptions.BeginQuery != "" || o.txOptions.CommitQuery != "":
		return errors.New("pgstore: WithTxOptions: BeginQuery and CommitQuery are not supported (the store begins and commits)")
	case !slices.Contains([]pgx.TxIsoLevel{"", pgx.Serializable, pgx.RepeatableRead, pgx.ReadCommitted, pgx.ReadUncommitted}, o.txOptions.IsoLevel):
		return fmt.Errorf("pgstore: WithTxOptions: IsoLevel %q: want one of pgx's TxIsoLevel constants", o.txOptions.IsoLevel)
	case !slices.Contains([]pgx.TxAccessMode{"", pgx.ReadWrite}, o.txOptions.AccessMode):
		return fmt.Errorf("pgstore: WithTxOptions: AccessMode %q: a joined transaction writes its record; want pgx.ReadWrite or none", o.txOptions.AccessMode)
	case !slices.Contains([]pgx.TxDeferrableMode{"", pgx.Deferrable, pgx.NotDeferrable}, o.txOptions.DeferrableMode):
		return fmt.Errorf("pgstore: WithTxOptions: DeferrableMode %q: want one of pgx's TxDeferrableMode constants", o.txOptions.DeferrableMode)
	}
	return nil
}

// maxIdentifier is PostgreSQL's bound on an identifier's length in bytes
// (NAMEDATALEN - 1): a longer schema name would be cut.
const maxIdentifier = 63

// share returns each partition's share of the scope quota (at least 1 of a
// bound that is set).
func (o *options) share() quota {
	q := quota{entries: o.scopeEntries, bytes: o.scopeBytes}
	p := int64(o.partitions)
	if q.entries > 0 {
		q.entries = max(q.entries/p, 1)
	}
	if q.bytes > 0 {
		q.bytes = max(q.bytes/p, 1)
	}
	return q
}

// Open returns a Store on pool, as New does, after checking that the schema
// was migrated ([Check]: the tables and functions exist, at this package's
// version) and that the server accepts WithConnCheckInterval's setting, and
// starts the reaper (see WithReaper). Close stops it.
func Open(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	s, err := New(pool, opts...)
	if err != nil {
		return nil, err
	}
	if err := Check(ctx, pool, s.opts.schema); err != nil {
		return nil, err
	}
	if s.opts.connCheck > 0 {
		// PostgreSQL 13 does not know the setting, and a server on a
		// platform without the kernel's support refuses any value but 0.
		if _, err := pool.Exec(ctx, "SELECT set_config('client_connection_check_interval', $1, true)",
			strconv.FormatInt(s.opts.connCheck.Milliseconds(), 10)); err != nil {
			return nil, fmt.Errorf("pgstore: WithConnCheckInterval(%v): the server refuses client_connection_check_interval "+
				"(PostgreSQL 14 or later, on Linux, macOS or BSD): %w; WithConnCheckInterval(0) leaves it to the server", s.opts.connCheck, err)
		}
	}
	if s.opts.reapInterval > 0 {
		s.reaper = startReaper(s)
	}
	return s, nil
}

// Close stops the reaper, if Open started one, and waits for it. It does
// not close the pool. It is safe to call more than once.
func (s *Store) Close() error {
	s.close.Do(func() {
		if s.reaper != nil {
			s.reaper.stop()
		}
	})
	return nil
}

// recordKey is a RecordKey as the table keys it.
type recordKey struct {
	id    []byte // SHA-256 of the parts, each length-prefixed
	scope []byte // SHA-256 of the scope
	part  int16
	rk    idempotency.RecordKey
}

func (s *Store) recordKey(k idempotency.RecordKey) recordKey {
	h := sha256.New()
	var n [4]byte
	for _, p := range [...]string{k.Scope, k.FullMethod, k.Key} {
		binary.BigEndian.PutUint32(n[:], uint32(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	id := h.Sum(nil)
	scope := sha256.Sum256([]byte(k.Scope))
	part := int16(binary.BigEndian.Uint32(id[:4]) % uint32(s.opts.partitions))
	return recordKey{id: id, scope: scope[:], part: part, rk: k}
}

// rowOverhead is what a row holds besides its variable fields, as the
// quota counts it: the tuple header and fixed columns, the two hashes, and
// the entries of its indexes.
const rowOverhead = 256

// rowSize is the size the quota counts for a row of k with a record of
// recordBytes (0 while in progress).
func rowSize(k *recordKey, fingerprint []byte, recordBytes int) int32 {
	return int32(rowOverhead + len(fingerprint) + len(k.rk.FullMethod) + len(k.rk.Key) + recordBytes)
}

// newToken returns a fresh owner token: 128 random bits.
func newToken() string {
	var tok [16]byte
	_, _ = rand.Read(tok[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(tok[:])
}

func millis(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

// Claim states, as the SQL functions return them.
const (
	stOwned      = 1
	stCompleted  = 2
	stInProgress = 3
	stMismatch   = 4
	stFull       = 5
)

// claimResult turns a claim function's answer into a Claim; token is the
// claimer's, for an owned key.
func claimResult(state int16, record []byte, waitMs int64, token string) (idempotency.Claim, error) {
	switch state {
	case stOwned:
		return idempotency.Claim{State: idempotency.Owned, Token: token}, nil
	case stCompleted:
		rec := new(idempotency.Record)
		if err := rec.UnmarshalBinary(record); err != nil {
			return idempotency.Claim{}, fmt.Errorf("pgstore: stored record: %w", err)
		}
		return idempotency.Claim{State: idempotency.Completed, Record: rec}, nil
	case stInProgress:
		return idempotency.Claim{State: idempotency.InProgress, RetryAfter: time.Duration(waitMs) * time.Millisecond}, nil
	case stMismatch:
		return idempotency.Claim{State: idempotency.Mismatch}, nil
	case stFull:
		return idempotency.Claim{}, &idempotency.FullError{Scope: true, RetryAfter: time.Duration(waitMs) * time.Millisecond}
	}
	return idempotency.Claim{}, fmt.Errorf("pgstore: claim returned state %d", state)
}

// Claim implements idempotency.Store in one round trip: one statement,
// which checks the scope's quota (see WithScopeQuota) and takes the key.
//
// A Claim that fails may have taken the key all the same: the statement
// committed, and its reply was lost (the caller's deadline passed first,
// the connection broke). So that such an orphan claim does not hold the key
// for its whole lease, a failed Claim releases its token before it
// returns, on a context detached from ctx and bounded by its own short
// timeout (500 ms); if that fails too, the key is free at the lease's end.
func (s *Store) Claim(ctx context.Context, key idempotency.RecordKey, fingerprint []byte, lease time.Duration) (idempotency.Claim, error) {
	k := s.recordKey(key)
	token := newToken()
	var (
		state  int16
		record []byte
		waitMs int64
	)
	err := s.pool.QueryRow(ctx, s.sql.claim, k.id, k.scope, k.part, key.FullMethod, key.Key, fingerprint, token,
		millis(lease), rowSize(&k, fingerprint, 0), s.quota.entries, s.quota.bytes, millis(s.opts.lockTimeout)).Scan(&state, &record, &waitMs)
	if isLockTimeout(err) { // a joined transaction holds the key: nothing was claimed
		return idempotency.Claim{State: idempotency.InProgress, RetryAfter: s.opts.lockTimeout}, nil
	}
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		_ = s.Release(rctx, key, token)
		cancel()
		return idempotency.Claim{}, fmt.Errorf("pgstore: claim: %w", err)
	}
	return claimResult(state, record, waitMs, token)
}

// isLockTimeout reports whether err is PostgreSQL's lock_not_available: a
// wait for another transaction's row passed lock_timeout.
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// Complete implements idempotency.Store in one round trip.
func (s *Store) Complete(ctx context.Context, key idempotency.RecordKey, token string, rec *idempotency.Record, ttl time.Duration) error {
	data, err := s.marshal(rec)
	if err != nil {
		return err
	}
	k := s.recordKey(key)
	var ok bool
	err = s.pool.QueryRow(ctx, s.sql.complete, k.id, k.scope, k.part, key.FullMethod, key.Key, rec.Fingerprint, token,
		data, rowSize(&k, rec.Fingerprint, len(data)), millis(ttl), millis(min(s.opts.minRetention, ttl)),
		s.quota.on()).Scan(&ok)
	if err != nil {
		return fmt.Errorf("pgstore: complete: %w", err)
	}
	if !ok {
		return fmt.Errorf("pgstore: complete: %w", idempotency.ErrNotOwner)
	}
	return nil
}

// marshal checks rec against the record bound and marshals it.
func (s *Store) marshal(rec *idempotency.Record) ([]byte, error) {
	if n := rec.Size(); n > s.opts.maxRecordBytes {
		return nil, fmt.Errorf("pgstore: a record of %d bytes, over the bound of %d: %w", n, s.opts.maxRecordBytes, idempotency.ErrRecordTooLarge)
	}
	data, err := rec.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("pgstore: marshalling the record: %w", err)
	}
	return data, nil
}

// Renew implements idempotency.Store in one round trip. A lease that has
// ended is renewed too while no other claim has taken the key (the row
// still holds the token): a late renewal keeps the key rather than lose it
// to no one.
func (s *Store) Renew(ctx context.Context, key idempotency.RecordKey, token string, lease time.Duration) error {
	k := s.recordKey(key)
	tag, err := s.pool.Exec(ctx, s.sql.renew, k.id, token, millis(lease))
	if err != nil {
		return fmt.Errorf("pgstore: renew: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: renew: %w", idempotency.ErrNotOwner)
	}
	return nil
}

// Release implements idempotency.Store in one round trip.
func (s *Store) Release(ctx context.Context, key idempotency.RecordKey, token string) error {
	k := s.recordKey(key)
	var ok bool
	if err := s.pool.QueryRow(ctx, s.sql.release, k.id, token).Scan(&ok); err != nil {
		return fmt.Errorf("pgstore: release: %w", err)
	}
	if !ok {
		return fmt.Errorf("pgstore: release: %w", idempotency.ErrNotOwner)
	}
	return nil
}

// Reap deletes up to the reaper's batch of rows past their end (see
// WithReaper; DefaultReapBatch when it is off), oldest first, and returns
// how many it deleted. One replica reaps at a time: on the others it
// returns 0 at once.
func (s *Store) Reap(ctx context.Context) (int, error) {
	batch := s.opts.reapBatch
	if batch < 1 {
		batch = DefaultReapBatch
	}
	var n int32
	if err := s.pool.QueryRow(ctx, s.sql.reap, int32(batch)).Scan(&n); err != nil {
		return 0, fmt.Errorf("pgstore: reap: %w", err)
	}
	return int(n), nil
}
