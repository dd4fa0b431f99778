package pgstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SchemaVersion is the version of the schema this package uses, the one
// row of the table resilience_idempotency_version.
const SchemaVersion = 1

//go:embed schema.sql
var schemaSQL string

// ErrNotMigrated is wrapped by the error of [Check] (and so of [Open]) when
// the schema lacks the store's tables or functions, or holds another
// version of them.
var ErrNotMigrated = errors.New("pgstore: the store's tables are not in the database")

// SQL returns the migration that creates the store's tables, indexes and
// functions in schema (DefaultSchema when empty): what [Migrate] runs, for
// a team that applies migrations with its own tool. It is idempotent.
func SQL(schema string) string {
	if schema == "" {
		schema = DefaultSchema
	}
	return strings.ReplaceAll(schemaSQL, "__SCHEMA__", pgx.Identifier{schema}.Sanitize())
}

// Migrate applies [SQL] for schema (DefaultSchema when empty) in one
// transaction, under an advisory lock, so that replicas starting together
// apply it one after the other. The schema must exist. It is idempotent:
// run it at every start, or once from a deployment step.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if pool == nil {
		return errors.New("pgstore: Migrate: pool must not be nil")
	}
	if schema == "" {
		schema = DefaultSchema
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "resilience_idem_migrate "+schema); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, SQL(schema))
		return err
	})
	if err != nil {
		return fmt.Errorf("pgstore: migrating schema %q: %w", schema, err)
	}
	return nil
}

// storeFunctions are the functions of the schema that the store calls.
var storeFunctions = []string{
	"resilience_idem_claim", "resilience_idem_complete", "resilience_idem_release", "resilience_idem_claim_tx",
	"resilience_idem_complete_tx", "resilience_idem_phase", "resilience_idem_relock", "resilience_idem_charge",
	"resilience_idem_reap", "resilience_idem_room",
}

// Check reports whether schema (DefaultSchema when empty) holds the store's
// tables and functions, at SchemaVersion: nil, or an error wrapping
// ErrNotMigrated that names what is missing and how to create it, or the
// error of the query (PostgreSQL unreachable, permission denied). It reads
// the catalog and the version table, and changes nothing.
func Check(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if pool == nil {
		return errors.New("pgstore: Check: pool must not be nil")
	}
	if schema == "" {
		schema = DefaultSchema
	}
	const q = `
SELECT
  (SELECT array_agg(t ORDER BY t) FROM unnest($2::text[]) t
   WHERE to_regclass(quote_ident($1) || '.' || t) IS NULL),
  (SELECT array_agg(f ORDER BY f) FROM unnest($3::text[]) f
   WHERE NOT EXISTS (SELECT FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                     WHERE n.nspname = $1 AND p.proname = f))`
	tables := []string{"resilience_idempotency", "resilience_idempotency_quota", "resilience_idempotency_version"}
	var missingTables, missingFuncs []string
	if err := pool.QueryRow(ctx, q, schema, tables, storeFunctions).Scan(&missingTables, &missingFuncs); err != nil {
		return fmt.Errorf("pgstore: checking schema %q: %w", schema, err)
	}
	fix := fmt.Sprintf("run pgstore.Migrate(ctx, pool, %q) or `go run %s migrate -schema %s`, "+
		"or apply the SQL of `go run %[2]s sql -schema %[3]s` with your migration tool", schema, checkCommand, schema)
	switch {
	case len(missingTables) > 0:
		return fmt.Errorf("%w: schema %q lacks the tables %s; %s", ErrNotMigrated, schema, strings.Join(missingTables, ", "), fix)
	case len(missingFuncs) > 0:
		return fmt.Errorf("%w: schema %q lacks the functions %s; %s", ErrNotMigrated, schema, strings.Join(missingFuncs, ", "), fix)
	}
	var version *int32
	vq := "SELECT max(version) FROM " + pgx.Identifier{schema}.Sanitize() + ".resilience_idempotency_version"
	if err := pool.QueryRow(ctx, vq).Scan(&version); err != nil {
		return fmt.Errorf("pgstore: checking schema %q: %w", schema, err)
	}
	if version == nil || *version != SchemaVersion {
		v := "none"
		if version != nil {
			v = fmt.Sprint(*version)
		}
		return fmt.Errorf("%w: schema %q is at version %s, this package needs %d; %s", ErrNotMigrated, schema, v, SchemaVersion, fix)
	}
	return nil
}

// checkCommand is the command that checks, migrates and prints the schema.
const checkCommand = "github.com/grpc-resilience/resilience/cmd/pgstore"

// statements are the store's SQL, schema-qualified, made once per store.
type statements struct {
	claim, complete, renew, release, reap    string
	lookup, setTimeouts, claimTx, completeTx string
	phase, relock, charge, room, endLease    string
	holdLease                                string
}

// savepoint is the savepoint set right after a joined claim, before the
// handler runs: an outcome that is an error is stored after the handler's
// writes are rolled back to it.
const savepoint = "resilience_idem_handler"

func newStatements(schema string) statements {
	s := pgx.Identifier{schema}.Sanitize() + "."
	return statements{
		claim:    "SELECT state, record, wait_ms FROM " + s + "resilience_idem_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
		complete: "SELECT " + s + "resilience_idem_complete($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
		renew: "UPDATE " + s + "resilience_idempotency SET lease_until = statement_timestamp() + $3 * interval '1 millisecond', " +
			"expires_at = greatest(expires_at, statement_timestamp() + $3 * interval '1 millisecond') " +
			"WHERE id = $1 AND token = $2 AND record IS NULL",
		release: "SELECT " + s + "resilience_idem_release($1, $2)",
		reap:    "SELECT " + s + "resilience_idem_reap($1)",
		lookup: "SELECT fingerprint, record, " +
			s + "resilience_idem_ms(lease_until - statement_timestamp()), lease_until > statement_timestamp(), " +
			"expires_at > statement_timestamp() FROM " + s + "resilience_idempotency WHERE id = $1",
		setTimeouts: "SELECT set_config('lock_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $2, true)",
		claimTx: "SELECT state, record, wait_ms, phases, phase_results FROM " + s +
			"resilience_idem_claim_tx($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
		completeTx: "SELECT " + s + "resilience_idem_complete_tx($1, $2, $3, $4, $5, $6)",
		phase:      "SELECT " + s + "resilience_idem_phase($1, $2, $3, $4, $5, $6)",
		relock:     "SELECT " + s + "resilience_idem_relock($1, $2)",
		charge:     "SELECT " + s + "resilience_idem_charge($1)",
		room:       "SELECT " + s + "resilience_idem_room($1, $2, $3, $4, $5, false)",
		endLease: "UPDATE " + s + "resilience_idempotency SET lease_until = statement_timestamp() " +
			"WHERE id = $1 AND token = $2 AND record IS NULL",
		holdLease: "UPDATE " + s + "resilience_idempotency SET lease_until = statement_timestamp() + $3 * interval '1 millisecond', " +
			"expires_at = greatest(expires_at, statement_timestamp() + $3 * interval '1 millisecond') " +
			"WHERE id = $1 AND token = $2 AND record IS NULL",
	}
}
