package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/internal/proctest"
)

// Bounds of a cluster's start and stop.
const (
	startTimeout = 30 * time.Second // initdb and the first "ready to accept connections"
	stopTimeout  = 10 * time.Second // fast shutdown, before SIGKILL
)

// Server is a PostgreSQL cluster started by [Start] or shared by [DSN].
type Server struct {
	// DSN connects to its database "postgres" as the superuser "postgres",
	// over loopback TCP, without a password.
	DSN string
	// Port is its TCP port on 127.0.0.1.
	Port int

	dir, bin, data string      // the cluster's directory (data/ and the Unix socket), binaries and data directory
	args           []string    // the postgres arguments after the defaults (StartWith)
	cred           *credential // who runs it
	cleaner        func()      // ends the cleaner (startCleaner), once the directory is gone

	mu   sync.Mutex
	cmd  *exec.Cmd       // the postmaster; guarded by mu
	done <-chan struct{} // closed when it has exited and its log is drained; guarded by mu
	once sync.Once
}

// Start starts a cluster of the test's own, stopped (and its directory
// removed) by a cleanup of t. It skips t, or fails it under CI, when the
// PostgreSQL binaries are missing.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t)
}

// StartWith is Start with extra postgres arguments after the test
// defaults, which they override, such as "-c", "synchronous_commit=off".
func StartWith(t testing.TB, args ...string) *Server {
	t.Helper()
	bin := binDir(t)
	s, err := start(bin, args...)
	if err != nil {
		t.Fatalf("pgtest: starting PostgreSQL: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

var shared struct {
	mu  sync.Mutex
	srv *Server
	err error
}

// DSN returns the connection string of a database the test may use:
// $PG_DSN, or the cluster shared by the test binary, started at the first
// call. Tests keep apart by schema ([Schema]). [StopShared] stops the
// shared cluster and removes its directory; without it (a package with no
// TestMain), a process that the cluster's start left watching the test
// binary does both once the binary has exited, however it exits: nothing
// is left behind either way.
func DSN(t testing.TB) string {
	t.Helper()
	if dsn := os.Getenv("PG_DSN"); dsn != "" {
		return dsn
	}
	bin := binDir(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv == nil && shared.err == nil {
		shared.srv, shared.err = start(bin)
	}
	if shared.err != nil {
		t.Fatalf("pgtest: starting the shared PostgreSQL: %v", shared.err)
	}
	return shared.srv.DSN
}

// StopShared stops the cluster DSN started, if any, and removes its
// directory, at once rather than when the test binary exits. Call it from
// TestMain after m.Run, so that a goroutine leak check that follows sees
// none of its connections' goroutines.
func StopShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv != nil {
		shared.srv.Stop()
		shared.srv = nil
	}
}

// Stop stops the cluster by its process id: SIGINT (fast shutdown: open
// transactions are rolled back), SIGKILL if it has not exited within 10 s;
// then it removes the cluster's directory. It is safe to call more than
// once.
func (s *Server) Stop() {
	s.once.Do(func() {
		s.stop(syscall.SIGINT)
		_ = os.RemoveAll(s.dir)
		s.cleaner()
	})
}

// stop stops the postmaster with sig, SIGKILL if it has not exited within
// 10 s, and waits for it.
func (s *Server) stop(sig syscall.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(stopTimeout):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Restart stops the cluster and starts it again on the same port and data:
// with immediate, as `pg_ctl restart -m immediate` (SIGQUIT: no checkpoint,
// what was not written to the WAL on disk is lost, and the start recovers
// from the WAL, as after a crash of the database server); otherwise as `-m
// fast` (SIGINT: open transactions are rolled back, a checkpoint is
// written). Clients' connections break either way.
func (s *Server) Restart(immediate bool) error {
	sig := syscall.SIGINT
	if immediate {
		sig = syscall.SIGQUIT
	}
	s.stop(sig)
	cmd, done, err := launch(s.bin, s.dir, s.data, s.cred, s.Port, s.args)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// binDir returns the directory of initdb and postgres, or skips t (fails it
// under CI).
func binDir(t testing.TB) string {
	t.Helper()
	if dir, ok := findBinDir(); ok {
		return dir
	}
	msg := "pgtest: PostgreSQL's initdb and postgres not found (pg_config --bindir, /usr/lib/postgresql/*/bin, PATH); " +
		"install them (Debian: apt-get install postgresql) or set PG_DSN to a database the tests may use"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func findBinDir() (string, bool) {
	has := func(dir string) bool {
		for _, name := range []string{"initdb", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); has(dir) {
			return dir, true
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// The newest major version first, by number (15 before 9).
	major := func(dir string) int { n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir))); return n }
	sort.SliceStable(dirs, func(i, j int) bool { return major(dirs[i]) > major(dirs[j]) })
	for _, dir := range dirs {
		if has(dir) {
			return dir, true
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if dir := filepath.Dir(p); has(dir) {
			return dir, true
		}
	}
	return "", false
}

// Launch starts a cluster outside a test, for a benchmark command: as
// Start, with extra postgres arguments after the test defaults, which they
// override (such as "-c", "fsync=on" for commits that reach the disk). The
// caller stops it with Stop.
func Launch(args ...string) (*Server, error) {
	bin, ok := findBinDir()
	if !ok {
		return nil, errors.New("pgtest: PostgreSQL's initdb and postgres not found (pg_config --bindir, /usr/lib/postgresql/*/bin, PATH)")
	}
	return start(bin, args...)
}

func start(bin string, args ...string) (*Server, error) {
	cred, err := owner()
	if err != nil {
		return nil, err
	}
	// Not t.TempDir: its parent is private to root, and the cluster's user
	// must reach its directory.
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	cleaner, err := startCleaner(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	fail := func(err error) (*Server, error) {
		_ = os.RemoveAll(dir)
		cleaner()
		return nil, err
	}
	if cred != nil {
		if err := chownTo(dir, cred); err != nil {
			return fail(err)
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
		"--no-sync", "-E", "UTF8", "--locale=C")
	initdb.SysProcAttr = initdbAttr(cred)
	initdb.Dir = dir // the cluster's user may not reach the test's working directory
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %v\n%s", err, out))
	}
	var lastErr error
	for range 3 { // a free port may be taken between choosing and binding
		port, err := proctest.FreePort()
		if err != nil {
			return fail(err)
		}
		cmd, done, err := launch(bin, dir, data, cred, port, args)
		if err == nil {
			return &Server{
				DSN:  fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
				Port: port, dir: dir, bin: bin, data: data, args: args, cred: cred, cleaner: cleaner, cmd: cmd, done: done,
			}, nil
		}
		lastErr = err
	}
	return fail(lastErr)
}

// launch starts the postmaster of data on port and waits until it is
// ready.
func launch(bin, dir, data string, cred *credential, port int, extra []string) (*exec.Cmd, <-chan struct{}, error) {
	cmd := exec.Command(filepath.Join(bin, "postgres"), append([]string{"-D", data, "-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200", "-c", "log_min_messages=warning"}, extra...)...)
	// On Linux, a test binary that dies (a timeout's panic, a kill) takes
	// its cluster with it.
	cmd.SysProcAttr = postmasterAttr(cred)
	cmd.Dir = dir
	out, err := cmd.StderrPipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stdout = io.Discard
	done, err := proctest.Start(cmd, out, "postgres", "ready to accept connections", startTimeout)
	if err != nil {
		return nil, nil, err
	}
	if err := waitWALWriter(port); err != nil {
		_ = cmd.Process.Kill()
		<-done
		return nil, nil, err
	}
	return cmd, done, nil
}

// waitWALWriter waits until the cluster on port lists its WAL writer in
// pg_stat_activity. The postmaster says it is ready to accept connections
// as it starts its background processes, so a session that connects at
// once may not see them yet (1 start in 15 on a busy machine), and tests
// that stop the WAL writer (pgstore's crash tests) look it up at once.
func waitWALWriter(port int) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port))
	if err != nil {
		return fmt.Errorf("pgtest: connecting to the new cluster: %w", err)
	}
	defer func() { _ = c.Close(context.Background()) }()
	for {
		var n int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walwriter'").Scan(&n); err != nil {
			return fmt.Errorf("pgtest: waiting for the new cluster's WAL writer: %w", err)
		}
		if n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: the new cluster listed no WAL writer within %v", startTimeout)
		case <-time.After(5 * time.Millisecond): // polling interval: nothing signals it
		}
	}
}

// Pool returns a pool on dsn, closed when t ends.
func Pool(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return PoolConfig(t, cfg)
}

// PoolConfig returns a pool of cfg, closed when t ends.
func PoolConfig(t testing.TB, cfg *pgxpool.Config) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// Schema creates a schema unique to t and to this run, and drops it, with
// everything in it, when t ends. It returns its name, a valid unquoted
// identifier.
func Schema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatalf("pgtest: CREATE SCHEMA: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+name+" CASCADE"); err != nil && !errors.Is(err, context.Canceled) {
			t.Logf("pgtest: DROP SCHEMA %s: %v", name, err)
		}
	})
	return name
}

// Ident quotes name as an SQL identifier.
func Ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// ClosedDSN returns the connection string of a loopback port nothing
// listens on, for tests of a database outage.
func ClosedDSN(t testing.TB) string {
	t.Helper()
	port, err := proctest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=1", port)
}
