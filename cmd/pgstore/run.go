package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
)

// The exit statuses.
const (
	exitOK      = 0
	exitFailed  = 1 // schema missing or stale, database unreachable or refusing
	exitUsage   = 2
	dialTimeout = 10 * time.Second
)

const usage = `usage: pgstore check   [-dsn DSN] [-schema NAME]
       pgstore migrate [-dsn DSN] [-schema NAME]
       pgstore sql     [-schema NAME]

Checks, creates or prints the PostgreSQL schema of the grpc-resilience
idempotency store (package pgstore).

commands:
  check    report whether the schema holds the store's tables and functions
           at this build's version (pgstore.Check); reads only
  migrate  apply the migration (pgstore.Migrate: it reads the version first,
           and changes nothing on a current schema), then check
  sql      print the migration, for your own migration tool

flags:
  -dsn DSN      connection string or URL (default $DATABASE_URL, then the
                libpq environment: PGHOST, PGUSER, ...)
  -schema NAME  the store's schema (default public)

exit status: 0 ok; 1 schema missing or stale, or database unreachable;
2 usage error.
`

// run is the command: it parses args (without the program name), runs the
// command and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	cmd := args[0]
	fs := flag.NewFlagSet("pgstore "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dsn := fs.String("dsn", os.Getenv("DATABASE_URL"), "")
	schema := fs.String("schema", pgstore.DefaultSchema, "")
	if err := fs.Parse(args[1:]); err != nil {
		fmt.Fprintf(stderr, "pgstore %s: %v\n%s", cmd, err, usage)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pgstore %s: unexpected argument %q\n%s", cmd, fs.Arg(0), usage)
		return exitUsage
	}
	switch cmd {
	case "sql":
		fmt.Fprint(stdout, pgstore.SQL(*schema))
		return exitOK
	case "check", "migrate":
	default:
		fmt.Fprintf(stderr, "pgstore: unknown command %q\n%s", cmd, usage)
		return exitUsage
	}
	if err := connectAndRun(ctx, cmd, *dsn, *schema, stdout); err != nil {
		fmt.Fprintf(stderr, "pgstore %s: %v\n", cmd, err)
		return exitFailed
	}
	return exitOK
}

// connectAndRun runs check or migrate on the database of dsn.
func connectAndRun(ctx context.Context, cmd, dsn, schema string, stdout io.Writer) error {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("-dsn: %w", err)
	}
	cfg.MaxConns = 1
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = dialTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if cmd == "migrate" {
		if err := pgstore.Migrate(ctx, pool, schema); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "migrated schema %q to version %d\n", schema, pgstore.SchemaVersion)
	}
	if err := pgstore.Check(ctx, pool, schema); err != nil {
		if errors.Is(err, pgstore.ErrNotMigrated) {
			return err
		}
		return fmt.Errorf("%w (is the database at %s:%d reachable?)", err, cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	}
	var rows, completed int64
	q := "SELECT count(*), count(record) FROM " + pgx.Identifier{schema}.Sanitize() + ".resilience_idempotency"
	if err := pool.QueryRow(ctx, q).Scan(&rows, &completed); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "ok: schema %q holds the idempotency store, version %d: %d rows (%d completed, %d in progress)\n",
		schema, pgstore.SchemaVersion, rows, completed, rows-completed)
	return nil
}
