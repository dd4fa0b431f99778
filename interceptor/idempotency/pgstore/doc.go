// Package pgstore keeps idempotency records in PostgreSQL (pgx v5,
// pgxpool), in two modes: joined mode, where a keyed call's handler joins
// the transaction that holds the call's record, so that its database
// writes and the record commit together or not at all; and lease mode, a
// plain idempotency.Store like the memory and Redis stores.
//
// # Why joined mode
//
// With any store outside the handler's database, the handler's business
// write and the idempotency record are two commits. If the process dies,
// or the store is unreachable, between the business COMMIT and the
// record's completion, the key stays claimed until its lease ends and the
// next duplicate runs the handler again: a second charge. No external
// key-value store can close that window. Joined mode closes it the way
// Stripe does (Brandur Leach, "Implementing Stripe-like Idempotency Keys in
// Postgres"): the key is a row in the same transaction as the work.
//
//	store, err := pgstore.Open(ctx, pool)          // after pgstore.Migrate
//	srv, err := server.New(server.WithIdempotency(server.Idempotency{
//		Store: store.Joined(),
//		Scope: tenantOf,
//	}))
//
//	func (s *shop) Charge(ctx context.Context, req *pb.ChargeRequest) (*pb.ChargeReply, error) {
//		tx, ok := pgstore.Tx(ctx) // the call's transaction; false without a key
//		...
//		err := tx.QueryRow(ctx, "INSERT INTO charges ... RETURNING id", ...).Scan(&id)
//		return &pb.ChargeReply{Id: id}, err // the interceptor commits, then replies
//	}
//
// # Joined mode, step by step
//
// For a unary call with an idempotency-key (see package idempotency for
// keys, scopes, fingerprints and the interceptor's options):
//
//  1. Lookup, outside any transaction (one round trip): a completed record
//     is replayed byte for byte (a different request: FAILED_PRECONDITION),
//     and nothing else happens. A replay costs this one round trip.
//  2. Claim: BEGIN, lock_timeout and idle_in_transaction_session_timeout
//     for the transaction, the INSERT of the key's row, and a savepoint, in
//     one pipeline (one round trip). The row is invisible to every other
//     transaction until this one commits.
//  3. The handler runs with the transaction in its context: [Tx] returns it
//     as a pgx.Tx. Its Commit and Rollback return [ErrHandlerCommit];
//     savepoints (Begin) work as usual. The handler must not end the
//     transaction with SQL of its own (Exec of COMMIT or ROLLBACK), nor
//     write on another connection of its pool: those writes commit apart
//     from the record. The store notices the first (the connection left
//     its transaction) and, after a COMMIT, fails closed: the outcome is
//     stored as it is, or, for an unstored code or a panic, the key is held
//     for WithPhaseRetention; no retry runs the handler again, and an error
//     is logged. (After a ROLLBACK the key's row is gone with the writes
//     before it: a retry runs the handler again, and what it wrote after
//     its ROLLBACK, in autocommit, stays.) The transaction, and
//     Tx(ctx).Conn(), are the handler's only until it returns (Conn is nil
//     after). A goroutine the handler started that goes on using the
//     transaction takes turns with the store: each statement holds the
//     connection for its round trip (Exec until it returns, Query until its
//     rows are closed, QueryRow until Scan, SendBatch until its results are
//     closed); a Phase's commit waits for the statements under way and holds
//     back new ones; the settle step waits for them, then every statement
//     fails with pgx.ErrTxClosed. That wait is bounded by the lock timeout:
//     a statement still under way then (rows never closed, a long query)
//     has its connection taken out of the pool and closed, which rolls the
//     transaction back, with an error logged; the call gets UNAVAILABLE and
//     its retry runs it again. (Statements sent on Tx(ctx).Conn() or
//     LargeObjects directly do not take turns: use them from the handler's
//     goroutine.)
//  4. Settle, when the handler returns. Success, or an error whose code is
//     stored (FAILED_PRECONDITION, INVALID_ARGUMENT, ...): the record is
//     written and COMMIT sent in one round trip, and only then is the reply
//     sent. For an error, the handler's writes are first rolled back to the
//     savepoint (even after one of its statements failed and aborted the
//     transaction), so a stored failure never leaves half its work behind.
//     An unstored code (UNAVAILABLE, ABORTED, ...; see
//     server.Idempotency.UnstoredCodes) or a panic rolls back
//     everything, writes and claim: the retry runs the call again.
//
// A first execution thus costs one round trip more than the handler's own
// transaction would (BEGIN, its statements, COMMIT): the lookup (a test
// counts 4 against 3 at the socket). The transaction holds a pool
// connection while the handler runs, slow or not, so their number is
// bounded ([WithJoinedTxLimit]): by default at most half the pool's
// MaxConns for the calls of one scope, and all but a quarter of it in all.
// A claim past a bound is refused at once, after its lookup, with
// RESOURCE_EXHAUSTED and a RetryInfo of the lock timeout (a pushback to
// clients): one caller's slow calls never take every connection, and a
// replay of a completed key (one lookup) always finds one. A burst of fast
// first executions past the bound is refused too, rather than queued for
// a connection: size the pool, or the bound, for a scope's bursts. The claim (steps 1 and 2, with the
// pool's acquisition) is bounded by three lock timeouts plus 5 s whatever
// the caller's deadline: a database that does not answer (a partition, a
// migration's lock on the table) gets the call UNAVAILABLE with the retry
// hint, not a goroutine and a connection held for ever.
//
// The transaction is the server's, not the caller's: the handler runs
// detached from the caller's deadline and cancellation (the interceptor's
// default, server.Idempotency.DetachedMax), and the commit uses a context
// the caller's end does not reach, so a caller that gives up never cancels
// a transaction that is about to commit; its retry replays the outcome.
//
// # Duplicates and crashes
//
// A duplicate in the same process waits for the first call, as with any
// store. A duplicate in another process finds no row at its lookup (the
// first call's row is not committed) and blocks in its claim's INSERT on
// the first transaction: when it commits, the duplicate replays its
// outcome; when it rolls back, the duplicate owns the key; past the lock
// timeout (WithLockTimeout, 1 s) it gets ABORTED with a pushback
// (grpc-retry-pushback-ms), and its client retries. It never runs the
// handler while the first transaction is open. (A duplicate with another
// request learns of the mismatch only once the first commits: until then it
// waits, then gets ABORTED.)
//
// There is no lease to wait out. When the owner's process dies, its
// connection closes and PostgreSQL rolls its transaction back at once:
// writes and claim are gone together, and the next duplicate runs the call.
// An owner that is cut off without closing its connection (a network
// partition, a frozen process) holds the key until
// idle_in_transaction_session_timeout ends its session (WithTxIdleTimeout,
// 1 minute). Keep that timeout above the server's maximum for a detached
// handler (server.Idempotency.DetachedMax, 30 s): the session
// then ends after the handler's context has, so a duplicate elsewhere
// never runs while the first handler may still make a foreign call.
//
// # A COMMIT whose outcome is unknown
//
// When the connection breaks while COMMIT is under way, the server cannot
// know whether it committed. It does not reply with the outcome: the
// handler's writes may not exist. The caller gets UNAVAILABLE with a retry
// hint, and the outcome is not shared with in-process waiters. Its retry,
// with the same key, finds one of two things, and either way the call has
// run exactly once:
//
//   - the record, committed: the COMMIT happened, with the handler's writes
//     in the same transaction; the retry replays the stored reply and the
//     handler does not run;
//   - no record: the COMMIT did not happen, so neither did the writes,
//     which were in the same transaction; the key is free (its row was
//     never committed), and the retry runs the call, for the first time as
//     far as the database is concerned.
//
// There is no third case: the record and the writes are one atomic
// commit. The same holds for a process killed between COMMIT and the
// reply: a test kills a real server process at random points, a thousand
// times, and counts the writes (see examples/failuremodes).
//
// What joined mode does not cover: writes the handler makes anywhere but
// through [Tx] (another database, a file, a foreign API). Make a foreign
// call inside a [Phase], with the key [ForeignKey] gives it, so the foreign
// API deduplicates it too.
//
// # Phases
//
// [Phase] runs a step of the handler and commits it, with a recovery point
// (the phase's name and the bytes the step returns), before the handler
// goes on, in a new transaction that takes the row's lock again. A retry of
// the call, after its process died, resumes after the last committed phase:
// [Phase] returns the bytes it recorded instead of running the step again.
// A foreign call made in a phase carries [ForeignKey]'s key, derived from
// the call's key and the phase's name, the same on every run of that
// phase. Between phases the row is visible, in progress, under a lease
// (server.Idempotency.Lease) renewed at each phase: a duplicate
// waits on the owner's lock and gets ABORTED; once the owner has died and
// the lease has ended, a retry of the same request takes the row over and
// resumes. Each phase costs two round trips.
//
// # Lease mode
//
// [Store] itself is an idempotency.Store (it passes the storetest suite):
// Claim, Complete, Renew and Release are one statement each (one round
// trip), on the same table, under a lease renewed by the interceptor, as
// with Redis, for teams with PostgreSQL and no Redis. Its guarantee is the
// Redis store's: the record commits apart from the handler's writes, so a
// crash between the two runs the call again once the lease has ended. A
// lease-mode claim of a key that a joined transaction holds waits for it up
// to the lock timeout, then reports it in progress; the two modes may share
// one schema.
//
// # Per-scope quota and retention
//
// Each scope holds at most DefaultScopeBytes (1 GiB) by default
// ([WithScopeQuota]), counted in a quota table with one row per scope
// partition ([WithScopePartitions], 8): a scope at its quota evicts its own
// completed records past their minimum retention ([WithMinRetention], 1
// minute), oldest first, and is otherwise refused with an
// idempotency.FullError (RESOURCE_EXHAUSTED with a RetryInfo). Lease mode
// checks it exactly, per partition, in the claim's statement; joined mode
// reads it at the claim and counts a row after its transaction commits, so
// the calls in flight may pass it. WithScopeQuota(0, 0) turns it off.
//
// # Schema
//
// [Migrate] creates, in one schema ([WithSchema], default public): the
// table resilience_idempotency (one row per record key: the SHA-256 of the
// scope, method and key as primary key, the scope's hash, the method and
// key for operators, the fingerprint, the owner's token and lease, the
// record, its retention and end, its size, and the phases), with an index
// on the rows' end (the reaper's) and two per scope partition (its ended
// rows, its completed records by retention); resilience_idempotency_quota;
// resilience_idempotency_version; and the functions the store calls, each
// transition one statement. Times are the database's clock. [SQL] returns
// the migration for teams that apply their own; [Check] (which [Open]
// runs) reports a schema that is missing or at another version, and the
// command github.com/grpc-resilience/resilience/cmd/pgstore checks
// (check), applies (migrate) or prints (sql) it from a shell.
//
// Rows past their end are deleted by the reaper [Open] starts
// ([WithReaper]: every minute, in batches of 1,000, one replica at a time);
// [Store.Close] stops it. A claim of an ended row replaces it in any case.
//
// # Concurrency
//
// Stores are safe for concurrent use by many goroutines and processes.
// The transaction [Tx] returns belongs to one call, until its handler
// returns: its statements take turns with the store's (step 3 above), and
// fail with pgx.ErrTxClosed after. Statements of the handler's goroutines
// at once are its own to order, as on any pgx connection.
package pgstore
