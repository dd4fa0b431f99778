// Command pgstore checks, creates or prints the PostgreSQL schema of the
// idempotency store of package pgstore
// (github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore).
//
// Usage:
//
//	go run ./cmd/pgstore check   -dsn DSN [-schema NAME]
//	go run ./cmd/pgstore migrate -dsn DSN [-schema NAME]
//	go run ./cmd/pgstore sql     [-schema NAME]
//
// DSN is a libpq connection string or URL (postgres://user@host/db); when
// -dsn is not given, $DATABASE_URL, then the libpq environment (PGHOST,
// PGUSER, ...) as pgx reads it. NAME is the schema that holds the store
// (default public), as pgstore.WithSchema names it.
//
// check reports whether the schema holds the store's tables and functions
// at the version this build needs, as pgstore.Check (and so pgstore.Open)
// decides: "ok" and the rows the table holds, or what is missing and the
// fix, with exit status 1. It only reads. Run it in a deployment's
// readiness step, or by hand after a migration.
//
// migrate applies the migration (pgstore.Migrate: one transaction, an
// advisory lock, idempotent) and then checks. The schema must exist.
//
// sql prints the migration with the schema's name filled in, for teams
// that apply migrations with their own tool.
//
// Exit status: 0 ok; 1 the schema is missing or stale, or the database
// could not be reached or refused; 2 usage error.
package main
