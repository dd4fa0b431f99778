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
//		var id int64
//		// The call's transaction when it is keyed; a transaction of its own
//		// otherwise (no key, or a store that failed open): one code path.
//		err := pgstore.InTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) error {
//			return tx.QueryRow(ctx, "INSERT INTO charges ... RETURNING id", ...).Scan(&id)
//		})
//		return &pb.ChargeReply{Id: id}, err // the interceptor commits, then replies
//	}
//
// # Joined mode, step by step
//
// For a unary call with an idempotency-key (see package idempotency for
// keys, scopes, fingerprints and the interceptor's options):
//
//  1. Lookup, outside any transaction (one round trip, one statement): the
//     key's row, if any, and a try of the key's advisory lock in SHARE
//     mode. A completed record is replayed byte for byte (a different
//     request: FAILED_PRECONDITION). A key whose lock an owner's
//     transaction holds is in progress: the duplicate gives its connection
//     back at once, and the interceptor polls (or answers ABORTED with a
//     pushback when waiting is off). A replay, and a duplicate of a call in
//     progress, cost this one round trip and hold no connection after it.
//  2. Claim: BEGIN, the claim, and a savepoint, in one pipeline (one round
//     trip). The claim pins the transaction's settings (below), takes the
//     key's advisory lock (never waiting for an owner: a claim that loses
//     the race is in progress), and inserts the key's row, invisible to
//     every other transaction until this one commits.
//  3. The handler runs with the transaction in its context: [Tx] (or
//     [InTx]) gives it as a pgx.Tx. Its Commit and Rollback commit and roll
//     back nothing (they return [ErrHandlerCommit]); savepoints (Begin)
//     work as usual. See [Tx] for what happens to a handler that ends the
//     transaction with SQL of its own. The transaction, and its large
//     objects, are the handler's only until it returns: its Conn is nil. A
//     goroutine the handler started that goes on using the transaction
//     takes turns with the store: each statement holds the connection for
//     its round trip (Exec until it returns, Query until its rows are
//     closed, QueryRow until Scan, SendBatch until its results are closed);
//     a Phase's commit waits for the statements under way and holds back
//     new ones; the settle step waits for them, then every statement fails
//     with pgx.ErrTxClosed. That wait is bounded by the lock timeout: a
//     statement still under way then (rows never closed, a long query) has
//     its connection taken out of the pool and closed, which rolls the
//     transaction back, with an error logged; the call gets UNAVAILABLE and
//     its retry runs it again.
//  4. Settle, when the handler returns. Success, or an error whose code is
//     stored (FAILED_PRECONDITION, INVALID_ARGUMENT, ...): the record is
//     written and COMMIT sent in one round trip, and only then is the reply
//     sent. The record's statement checks that the transaction is still the
//     claim's (its id). For an error, the handler's writes are first rolled
//     back to the savepoint (even after one of its statements failed and
//     aborted the transaction), so a stored failure never leaves half its
//     work behind. An unstored code (UNAVAILABLE, ABORTED, ...; see
//     server.Idempotency.UnstoredCodes) or a panic rolls back everything,
//     writes and claim: the retry runs the call again. So does a
//     serialization failure or a deadlock (SQLSTATE 40001, 40P01), or a
//     wait cut short by lock_timeout or statement_timeout (55P03, 57014),
//     that the handler met and did not recover from (in a savepoint), or
//     that COMMIT met: the call gets ABORTED with the retry hint, and
//     nothing is stored (stored, the error would be replayed for the TTL,
//     long after the other transaction had gone).
//
// A first execution thus costs one round trip more than the handler's own
// transaction would (BEGIN, its statements, COMMIT): the lookup (a test
// counts 4 against 3 at the socket, with the settings pinned). The
// transaction holds a pool connection while the handler runs, slow or not,
// so their number is bounded ([WithJoinedTxLimit]): by default at most
// half the pool's MaxConns for the calls of one scope, and all but a
// quarter of it in all. A claim past a bound waits for a slot, holding no
// connection, up to the lock timeout, then is refused with
// RESOURCE_EXHAUSTED and a RetryInfo (a pushback to clients): one caller's
// slow calls never take every connection, and a replay of a completed key
// (one lookup) always finds one. The claim (steps 1 and 2, with the pool's
// acquisition) is bounded by three lock timeouts plus 5 s whatever the
// caller's deadline: a database that does not answer (a partition, a
// migration's lock on the table) gets the call UNAVAILABLE with the retry
// hint, not a goroutine and a connection held for ever.
//
// The transaction is the server's, not the caller's: the handler runs
// detached from the caller's deadline and cancellation (the interceptor's
// default, server.Idempotency.DetachedMax), and the commit uses a context
// the caller's end does not reach, so a caller that gives up never cancels
// a transaction that is about to commit; its retry replays the outcome.
//
// # Sizing the pool
//
// A joined call holds one pool connection from its claim to its commit;
// duplicates and replays hold one for a lookup's round trip. Give the pool
// MaxConns of twice the joined calls one scope has in flight at once
// (WithJoinedTxLimit's default lets a scope hold half of it), plus what the
// application's own statements need. Measured (bench, "joined mode under
// load"; 16 callers in one scope, a new key per call, 5 ms handlers, 2
// cores kept busy by other jobs, min to max of 3 runs): MaxConns 4,
// pgxpool's default on 2 cores, answered 79 to 89% of the calls and
// refused the rest with RESOURCE_EXHAUSTED after their wait for one of its
// 2 slots (before the wait, 293 of 320 were refused at once); MaxConns 8
// answered 98.5 to 99.6%; 16 and 32 answered every call, 32 at the best
// throughput (133 calls/s at the median, against 108 with 16 and 38 with
// 4). With every key sent by two callers at once, MaxConns 4 answered 98
// to 99.5%: a duplicate holds no slot and no connection.
//
// # What the guarantee rests on, pinned
//
// The claim sets, for its transaction only (SET LOCAL), whatever the
// server, database or role says:
//
//   - synchronous_commit on: a commit is acknowledged only once its WAL is
//     on disk. With it off (a common tuning), a crash of PostgreSQL loses
//     acknowledged commits: a reply sent, its record and writes gone, and
//     the retry runs the call again. The record's statement, right before
//     COMMIT (and a phase's), sets it on again, so that the handler's own
//     SET LOCAL synchronous_commit = off, SET or RESET ALL in the
//     transaction cannot undo it for the commit. The store's own
//     bookkeeping outside the joined transaction (the quota's count, the
//     reaper) keeps it off.
//   - idle_in_transaction_session_timeout ([WithTxIdleTimeout], 1 minute):
//     it ends the session of an owner cut off inside its transaction (a
//     partition, a frozen process), which frees its key; PostgreSQL's
//     default, 0, never does.
//   - client_connection_check_interval ([WithConnCheckInterval], 250 ms):
//     an owner that dies while a statement of its handler runs (a slow
//     query, a lock wait) has its transaction rolled back within about the
//     interval, not when the statement ends.
//   - lock_timeout ([WithLockTimeout], 1 s), for the claim's statement
//     only: it is restored to the session's for the handler, whose own
//     statements wait for locks as they would without the store.
//
// [Migrate] reads the schema's version first, and on a current schema
// takes no lock on the store's tables (the start of a replica in a rolling
// deploy never stalls the claims of the others). Schema names are quoted
// wherever they are used.
//
// # Duplicates and crashes
//
// A duplicate in the same process waits for the first call, as with any
// store. A duplicate in another process learns at its lookup that an owner
// holds the key (its advisory lock) and that the first call is in
// progress, without waiting on the owner's row lock and without holding a
// pool connection: the interceptor polls the lookup, as for a lease held
// elsewhere, until the owner has committed (the duplicate replays its
// outcome) or rolled back (the duplicate owns the key), within the caller's
// deadline; with waiting off it answers ABORTED with a pushback at once. It
// never runs the handler while the first transaction is open. (A duplicate
// with another request learns of the mismatch only once the first commits:
// the row is invisible until then.)
//
// There is no lease to wait out. When the owner's process dies, its
// connection closes and PostgreSQL rolls its transaction back at once (or,
// during a statement, within the connection check's interval): writes,
// claim and lock are gone together, and the next duplicate runs the call.
// An owner that is cut off without closing its connection holds the key
// until its session's idle timeout ends it (WithTxIdleTimeout). Keep that
// timeout above the server's maximum for a detached handler
// (server.Idempotency.DetachedMax, 30 s): the session then ends after the
// handler's context has, so a duplicate elsewhere never runs while the
// first handler may still make a foreign call.
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
// reply, and for PostgreSQL itself killed: a test kills real server
// processes (two replicas serving every key at once) at random points a
// thousand times, restarts PostgreSQL now and then (-m fast and -m
// immediate, with synchronous_commit off), and counts the writes (see
// examples/failuremodes).
//
// # Outbox, Phase, or neither
//
// What joined mode does not cover: effects the handler has anywhere but
// through [Tx] (another database, a file, a foreign API).
//
//   - Neither: the call's effects are writes to this database; joined mode
//     makes them exactly once.
//   - The outbox (package
//     github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/outbox):
//     a request to another service that the reply does not wait for. It is
//     written in the call's transaction, and a relay delivers it after the
//     commit, at least once, with the row's id as its idempotency key: once
//     on a receiver with idempotency. The call holds no connection while
//     the other service answers.
//   - [Phase]: a foreign call whose answer the reply needs. The phase
//     calls out with the key [ForeignKey] gives it, so the foreign API
//     deduplicates it, and commits a recovery point; a retry after a crash
//     resumes after it. The call's transaction, and its connection, wait
//     for the foreign API. A phased call its caller abandoned is finished
//     or failed by a [Completer].
//
// # Phases
//
// [Phase] runs a step of the handler and commits it, with a recovery point
// (the phase's name and the bytes the step returns), before the handler
// goes on, in a new transaction that takes the key's advisory lock again,
// in the same round trip. A retry of the call, after its process died,
// resumes after the last committed phase: [Phase] returns the bytes it
// recorded instead of running the step again. A foreign call made in a
// phase carries [ForeignKey]'s key, derived from the call's key and the
// phase's name, the same on every run of that phase. Between phases the
// row is visible, in progress: a duplicate sees the owner's lock held and
// polls; once the owner has died (its lock released), a retry of the same
// request takes the row over at once and resumes. Each phase costs one
// round trip.

// # Lease mode
//
// [Store] itself is an idempotency.Store (it passes the storetest suite):
// Claim, Complete, Renew and Release are one statement each (one round
// trip), on the same table, under a lease renewed by the interceptor, as
// with Redis, for teams with PostgreSQL and no Redis. Its guarantee is the
// Redis store's: the record commits apart from the handler's writes, so a
// crash between the two runs the call again once the lease has ended. Its
// claim and its record are durable whatever the server's
// synchronous_commit (their statements set it on). A
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
// [Migrate] creates, in one schema ([WithSchema], default public; any
// name, quoted): the table resilience_idempotency (one row per record key:
// the SHA-256 of the scope, method and key as primary key, the scope's
// hash, the method and key for operators, the fingerprint, the owner's
// token and lease, the record, its retention and end, its size, the
// phases, and whether joined mode wrote it and has work in progress), with
// an index on the rows' end (the reaper's) and two per scope partition (its
// ended rows, its completed records by retention);
// resilience_idempotency_quota; resilience_idempotency_version;
// resilience_outbox (package outbox's); and the functions the store calls,
// each transition one statement. Times are the database's clock. [SQL]
// returns the migration for teams that apply their own; [Check] (which
// [Open] runs) reports a schema that is missing or at another version, and
// the command github.com/grpc-resilience/resilience/cmd/pgstore checks
// (check), applies (migrate) or prints (sql) it from a shell.
//
// Migrate takes no lock on a schema at its version (it only reads the
// version), so it may run at every start. Upgrading version 1 (the previous
// release's) adds two columns, with a short ACCESS EXCLUSIVE lock on the
// table; Migrate waits for it at most one second at a time, and tries
// again, so that claims are never held up longer. Version 1's functions
// stay: replicas of the previous release keep running during a rolling
// deploy (one of them restarted after the upgrade refuses to open, as
// Check refuses any other version).
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
// fail with pgx.ErrTxClosed after. It runs one statement at a time, as a
// pgx connection does: a statement sent while another is under way (the
// handler's goroutines at once) fails with [ErrTxBusy] and sends nothing,
// so the handler orders them. A [Completer]
// and its CompleteFunc may run on many replicas at once.
package pgstore
