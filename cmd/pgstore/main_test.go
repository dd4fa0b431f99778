package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func runArgs(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestCheckThenMigrate: check fails on an empty schema, naming the missing
// tables and the fix; migrate creates them; check then passes.
func TestCheckThenMigrate(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, pgtest.Pool(t, dsn))
	code, _, stderr := runArgs("check", "-dsn", dsn, "-schema", schema)
	if code != exitFailed || !strings.Contains(stderr, "lacks the tables") || !strings.Contains(stderr, "pgstore migrate") && !strings.Contains(stderr, "pgstore.Migrate") {
		t.Fatalf("check before migrate = %d, %q; want 1 naming the tables and the fix", code, stderr)
	}
	code, stdout, stderr := runArgs("migrate", "-dsn", dsn, "-schema", schema)
	if code != exitOK || !strings.Contains(stdout, "migrated") || !strings.Contains(stdout, "ok: schema") {
		t.Fatalf("migrate = %d, %q, %q; want 0, migrated and ok", code, stdout, stderr)
	}
	code, stdout, _ = runArgs("check", "-dsn", dsn, "-schema", schema)
	if code != exitOK || !strings.Contains(stdout, "0 rows") {
		t.Fatalf("check after migrate = %d, %q; want 0 and ok", code, stdout)
	}
}

func TestUnreachableDatabaseFails(t *testing.T) {
	code, _, stderr := runArgs("check", "-dsn", pgtest.ClosedDSN(t))
	if code != exitFailed || !strings.Contains(stderr, "reachable") {
		t.Fatalf("check of a closed port = %d, %q; want 1 asking whether the database is reachable", code, stderr)
	}
}

func TestUsage(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{nil, exitUsage, "usage:"},
		{[]string{"help"}, exitOK, "usage:"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"check", "-nope"}, exitUsage, "flag provided but not defined"},
		{[]string{"check", "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"sql", "-schema", "billing"}, exitOK, `"billing".resilience_idempotency`},
	}
	for _, tt := range tests {
		code, stdout, stderr := runArgs(tt.args...)
		if code != tt.code || !strings.Contains(stdout+stderr, tt.want) {
			t.Errorf("pgstore %q = %d, %q; want %d and %q", tt.args, code, stdout+stderr, tt.code, tt.want)
		}
	}
}

// TestMigrateAHostileSchemaName: a schema named with a quote and dollar
// signs (which broke the migration when it was spliced in) is migrated and
// checked from the shell, and migrating it again changes nothing.
func TestMigrateAHostileSchemaName(t *testing.T) {
	dsn := pgtest.DSN(t)
	pool := pgtest.Pool(t, dsn)
	const schema = `o'brien $$ "quoted"`
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgtest.Ident(schema)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgtest.Ident(schema)+" CASCADE") })
	for range 2 {
		if code, stdout, stderr := runArgs("migrate", "-dsn", dsn, "-schema", schema); code != exitOK || !strings.Contains(stdout, "ok: schema") {
			t.Fatalf("migrate -schema %q = %d, %q, %q; want 0 and ok", schema, code, stdout, stderr)
		}
	}
	if code, stdout, stderr := runArgs("check", "-dsn", dsn, "-schema", schema); code != exitOK {
		t.Fatalf("check -schema %q = %d, %q, %q; want 0", schema, code, stdout, stderr)
	}
}
