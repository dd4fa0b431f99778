package pgstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SchemaVersion is the version of the schema this package uses, the one
// row of the table resilience_idempotency_version.
const SchemaVersion = 2

//go:embed schema.sql
var schemaSQL string

// ErrNotMigrated is wrapped by the error of [Check] (and so of [Open]) when
// the schema lacks the store's tables or functions, or holds another
// version of them.
var ErrNotMigrated = errors.New("pgstore: the store's tables are not in the database")

// SQL returns the migration that creates the store's tables, indexes and
// functions in schema (DefaultSchema when empty): what [Migrate] runs, for
// a team that applies migrations with its own tool. It is idempotent, and
// on a schema already at this version it takes no lock on the store's
// tables (it replaces the functions' text). Any schema name is quoted, as
// an identifier and as a string literal, wherever the migration uses it.
func SQL(schema string) string {
	if schema == "" {
		schema = DefaultSchema
	}
	ident := pgx.Identifier{schema}.Sanitize()
	literal := quoteLiteral(schema)
	// The functions' bodies are dollar-quoted: with a tag the schema's name
	// cannot end early.
	tag := "$resilience$"
	for i := 0; strings.Contains(ident, tag) || strings.Contains(literal, tag); i++ {
		tag = "$resilience" + strconv.Itoa(i) + "$"
	}
	return strings.NewReplacer("$$", tag, "__SCHEMA_LITERAL__", literal, "__SCHEMA__", ident).Replace(schemaSQL)
}

// quoteLiteral quotes s as an SQL string literal, whatever
// standard_conforming_strings says: an escape string (E'...') with its
// quotes and backslashes doubled. NUL bytes are dropped, as pgx drops them
// from identifiers.
func quoteLiteral(s string) string {
	s = strings.ReplaceAll(s, "\x00", "")
	return "E'" + strings.NewReplacer(`\`, `\\`, "'", "''").Replace(s) + "'"
}

// Migrate brings schema (DefaultSchema when empty) to this package's
// version. It reads the version first ([Check]: catalog reads and one row
// of the version table, no lock on the store's tables, so never a wait
// behind an open joined transaction, nor a claim waiting behind it): a
// schema at this version is left as it is, and Migrate costs two round
// trips. Run it at every start, or once from a deployment step.
//
// Otherwise it applies [SQL] in one transaction, under an advisory lock so
// that replicas starting together apply it one after the other (the second
// finds the schema current and does nothing). A migration that changes the
// tables (from version 1: two columns) takes a short ACCESS EXCLUSIVE lock
// on them, which waits for the joined transactions open at the time, and
// every claim waits behind it; so that this never lasts, it waits at most
// one second for the lock, then gives it up and tries again a little later,
// up to 10 times, and fails with the last error (the schema is then as it
// was). The schema itself must exist.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if pool == nil {
		return errors.New("pgstore: Migrate: pool must not be nil")
	}
	if schema == "" {
		schema = DefaultSchema
	}
	err := Check(ctx, pool, schema)
	if err == nil || !errors.Is(err, ErrNotMigrated) {
		return err
	}
	for attempt := 1; ; attempt++ {
		err = migrateOnce(ctx, pool, schema)
		if err == nil || !isLockTimeout(err) || attempt == migrateAttempts {
			break
		}
		t := time.NewTimer(time.Duration(attempt) * migrateBackoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("pgstore: migrating schema %q: %w", schema, ctx.Err())
		}
	}
	if err != nil {
		return fmt.Errorf("pgstore: migrating schema %q: %w", schema, err)
	}
	return nil
}

// Bounds of a migration's wait for its locks (see Migrate).
const (
	migrateLockTimeout = "1s"
	migrateAttempts    = 10
	migrateBackoff     = 500 * time.Millisecond // times the attempt
)

// migrateOnce applies the migration in one transaction, unless, under the
// advisory lock, the schema turns out current (another replica migrated it).
func migrateOnce(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1)), set_config('lock_timeout', $2, true)",
			"resilience_idem_migrate "+schema, migrateLockTimeout); err != nil {
			return err
		}
		if err := check(ctx, tx, schema); err == nil || !errors.Is(err, ErrNotMigrated) {
			return err
		}
		_, err := tx.Exec(ctx, SQL(schema))
		return err
	})
}

// storeFunctions are the functions of the schema that the store calls.
var storeFunctions = []string{
	"resilience_idem_claim", "resilience_idem_complete", "resilience_idem_release", "resilience_idem_charge",
	"resilience_idem_reap", "resilience_idem_room", "resilience_idem_lock_key", "resilience_idem_lookup", "resilience_idem_pin",
	"resilience_idem_claim_joined", "resilience_idem_owns", "resilience_idem_complete_joined",
	"resilience_idem_phase_joined", "resilience_idem_relock_joined", "resilience_idem_poison",
	"resilience_idem_abandoned",
}

// Check reports whether schema (DefaultSchema when empty) holds the store's
// tables and functions, at SchemaVersion: nil, or an error wrapping
// ErrNotMigrated that names what is missing and how to create it, or the
// error of the query (PostgreSQL unreachable, permission denied). It reads
// the catalog and the version table, and changes nothing; it takes no lock
// that an open transaction of the store's could hold up.
func Check(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if pool == nil {
		return errors.New("pgstore: Check: pool must not be nil")
	}
	if schema == "" {
		schema = DefaultSchema
	}
	return check(ctx, pool, schema)
}

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// check is Check on q: the catalog, then the version.
func check(ctx context.Context, q querier, schema string) error {
	const catalog = `
SELECT
  (SELECT array_agg(t ORDER BY t) FROM unnest($2::text[]) t
   WHERE to_regclass(quote_ident($1) || '.' || t) IS NULL),
  (SELECT array_agg(f ORDER BY f) FROM unnest($3::text[]) f
   WHERE NOT EXISTS (SELECT FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                     WHERE n.nspname = $1 AND p.proname = f))`
	tables := []string{"resilience_idempotency", "resilience_idempotency_quota", "resilience_idempotency_version", "resilience_outbox"}
	var (
		missingTables, missingFuncs []string
		version                     *int32
	)
	err := q.QueryRow(ctx, catalog, schema, tables, storeFunctions).Scan(&missingTables, &missingFuncs)
	if err == nil && !slices.Contains(missingTables, "resilience_idempotency_version") {
		err = q.QueryRow(ctx, "SELECT max(version) FROM "+pgx.Identifier{schema}.Sanitize()+".resilience_idempotency_version").Scan(&version)
	}
	if err != nil {
		return fmt.Errorf("pgstore: checking schema %q: %w", schema, err)
	}
	fix := fmt.Sprintf("run pgstore.Migrate(ctx, pool, %q) or `go run %s migrate -schema %q`, "+
		"or apply the SQL of `go run %[2]s sql -schema %[3]q` with your migration tool", schema, checkCommand, schema)
	switch {
	case version != nil && *version != SchemaVersion:
		return fmt.Errorf("%w: schema %q is at version %d, this package needs %d; %s", ErrNotMigrated, schema, *version, SchemaVersion, fix)
	case len(missingTables) > 0:
		return fmt.Errorf("%w: schema %q lacks the tables %s; %s", ErrNotMigrated, schema, strings.Join(missingTables, ", "), fix)
	case len(missingFuncs) > 0:
		return fmt.Errorf("%w: schema %q lacks the functions %s; %s", ErrNotMigrated, schema, strings.Join(missingFuncs, ", "), fix)
	case version == nil:
		return fmt.Errorf("%w: schema %q has no version; %s", ErrNotMigrated, schema, fix)
	}
	return nil
}

// checkCommand is the command that checks, migrates and prints the schema.
const checkCommand = "github.com/grpc-resilience/resilience/cmd/pgstore"

// statements are the store's SQL, schema-qualified, made once per store.
type statements struct {
	claim, complete, renew, release, reap string
	lookup, begin, claimJoined            string
	completeJoined, phaseJoined, relock   string
	charge, room, poison, abandoned       string
}

// savepoint is the savepoint set right after a joined claim, before the
// handler runs: an outcome that is an error is stored after the handler's
// writes are rolled back to it.
const savepoint = "resilience_idem_handler"

func newStatements(schema string, txOptions pgx.TxOptions) statements {
	s := pgx.Identifier{schema}.Sanitize() + "."
	return statements{
		claim:    "SELECT state, record, wait_ms FROM " + s + "resilience_idem_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
		complete: "SELECT " + s + "resilience_idem_complete($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
		renew: "UPDATE " + s + "resilience_idempotency SET lease_until = statement_timestamp() + $3 * interval '1 millisecond', " +
			"expires_at = greatest(expires_at, statement_timestamp() + $3 * interval '1 millisecond') " +
			"WHERE id = $1 AND token = $2 AND record IS NULL",
		release: "SELECT " + s + "resilience_idem_release($1, $2)",
		reap:    "SELECT " + s + "resilience_idem_reap($1)",
		lookup: "SELECT fingerprint, record, wait_ms, lease_live, row_live, joined, pending, free FROM " + s +
			"resilience_idem_lookup($1, $2)",
		begin: beginSQL(txOptions),
		claimJoined: "SELECT state, record, wait_ms, phases, phase_results, xid FROM " + s +
			"resilience_idem_claim_joined($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
		completeJoined: "SELECT " + s + "resilience_idem_complete_joined($1, $2, $3, $4, $5, $6, $7)",
		phaseJoined:    "SELECT " + s + "resilience_idem_phase_joined($1, $2, $3, $4, $5, $6, $7)",
		relock:         "SELECT " + s + "resilience_idem_relock_joined($1, $2, $3, $4, $5)",
		charge:         "SELECT " + s + "resilience_idem_charge($1)",
		room:           "SELECT " + s + "resilience_idem_room($1, $2, $3, $4, $5, false)",
		poison:         "SELECT " + s + "resilience_idem_poison($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
		abandoned:      "SELECT id, scope_id, part, fingerprint, method, key FROM " + s + "resilience_idem_abandoned($1, $2)",
	}
}

// beginSQL is the BEGIN of a joined transaction with opts (WithTxOptions).
func beginSQL(opts pgx.TxOptions) string {
	sql := "BEGIN"
	if opts.IsoLevel != "" {
		sql += " ISOLATION LEVEL " + string(opts.IsoLevel)
	}
	if opts.AccessMode != "" {
		sql += " " + string(opts.AccessMode)
	}
	if opts.DeferrableMode != "" {
		sql += " " + string(opts.DeferrableMode)
	}
	return sql
}
