package pgtest_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

func TestSharedClusterAnswersAndSchemasKeepApart(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.DSN(t))
	a, b := pgtest.Schema(t, pool), pgtest.Schema(t, pool)
	if a == b {
		t.Fatalf("Schema() twice = %q, want two schemas", a)
	}
	ctx := context.Background()
	for _, s := range []string{a, b} {
		if _, err := pool.Exec(ctx, "CREATE TABLE "+s+".x (v int)"); err != nil {
			t.Fatalf("CREATE TABLE in %s: %v", s, err)
		}
	}
	var who string
	if err := pool.QueryRow(ctx, "SELECT current_user").Scan(&who); err != nil || who != "postgres" {
		t.Fatalf("current_user = %q, %v, want postgres", who, err)
	}
}

func TestStartStopsItsOwnCluster(t *testing.T) {
	s := pgtest.Start(t)
	pool := pgtest.Pool(t, s.DSN)
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatalf("Ping() = %v", err)
	}
	pool.Close()
	s.Stop()
	cfg, _ := pgxpool.ParseConfig(s.DSN)
	p2, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	if err := p2.Ping(context.Background()); err == nil {
		t.Fatal("Ping() after Stop = nil, want an error: the cluster must be gone")
	}
}

func TestCountRoundTripsCountsABatchAsOne(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	rt := pgtest.CountRoundTrips(cfg)
	pool := pgtest.PoolConfig(t, cfg)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil { // connect, and prepare nothing later
		t.Fatal(err)
	}
	before := rt.N()
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if got := rt.N() - before; got != 1 {
		t.Errorf("one Exec = %d round trips, want 1", got)
	}
}

// TestDSNLeavesNothingWithoutStopShared: a test binary that uses DSN and
// never calls StopShared (no TestMain), or that is killed, leaves no
// cluster running and no directory behind (a 39 MB one per run, before).
// The test runs itself as the child binary (TestHelperDSNChild).
func TestDSNLeavesNothingWithoutStopShared(t *testing.T) {
	if os.Getenv("PG_DSN") != "" {
		t.Skip("PG_DSN is set: DSN starts no cluster")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, how := range []string{"exit", "SIGKILL", "SIGKILL with a stopped WAL writer"} {
		t.Run(how, func(t *testing.T) {
			if how == "SIGKILL with a stopped WAL writer" && runtime.GOOS != "linux" {
				t.Skip("the cleaner finds a cluster's orphans by their working directory in /proc: Linux only")
			}
			cmd := exec.Command(exe, "-test.run=^TestHelperDSNChild$", "-test.v")
			cmd.Env = append(os.Environ(), "PGTEST_CHILD="+how)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var dir, dsn string
			var printed []string // the child's output before its data directory
			stopped := 0         // the WAL writer's PID, when the child stopped it
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if d, ok := strings.CutPrefix(sc.Text(), "data_directory="); ok {
					dir, dsn, _ = strings.Cut(d, " dsn=")
					d, pid, _ := strings.Cut(dsn, " walwriter=")
					dsn, stopped = d, atoi(pid)
					break
				}
				printed = append(printed, sc.Text())
			}
			if dir == "" {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("the child printed no data directory; it printed:\n%s", strings.Join(printed, "\n"))
			}
			if how != "exit" {
				_ = cmd.Process.Kill()
			}
			go func() { _, _ = io.Copy(io.Discard, out) }()
			_ = cmd.Wait()
			clusterDir := filepath.Dir(dir)
			for deadline := time.Now().Add(20 * time.Second); ; {
				_, err := os.Stat(clusterDir)
				if os.IsNotExist(err) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s still exists 20s after the test binary ended (%s)", clusterDir, how)
				}
				time.Sleep(20 * time.Millisecond) // the cleaner stops the cluster, then removes it
			}
			pool := pgtest.Pool(t, dsn+"&connect_timeout=1")
			if err := pool.Ping(context.Background()); err == nil {
				t.Errorf("the child's cluster still answers after its directory was removed")
			}
			// A stopped child of the postmaster cannot see it go: the
			// cleaner must resume it, or it stays stopped for ever.
			if stopped != 0 {
				for deadline := time.Now().Add(20 * time.Second); alive(stopped); {
					if time.Now().After(deadline) {
						t.Fatalf("the stopped WAL writer (PID %d) still runs 20s after its cluster was removed", stopped)
					}
					time.Sleep(20 * time.Millisecond) // it exits once resumed
				}
			}
		})
	}
}

// TestHelperDSNChild is the child of TestDSNLeavesNothingWithoutStopShared:
// it starts the shared cluster, prints where it lives, and exits without
// StopShared (PGTEST_CHILD=exit), or waits to be killed (SIGKILL).
func TestHelperDSNChild(t *testing.T) {
	how := os.Getenv("PGTEST_CHILD")
	if how == "" {
		t.Skip("the child process of TestDSNLeavesNothingWithoutStopShared")
	}
	dsn := pgtest.DSN(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	var dir string
	if err := pool.QueryRow(context.Background(), "SHOW data_directory").Scan(&dir); err != nil {
		t.Fatal(err)
	}
	walWriter := 0
	if how == "SIGKILL with a stopped WAL writer" {
		// As the crash tests of pgstore do (stopWALWriter), when the
		// test binary is killed before it resumes or kills it.
		if err := pool.QueryRow(context.Background(), "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'").Scan(&walWriter); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(walWriter, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	pool.Close()
	fmt.Printf("data_directory=%s dsn=%s walwriter=%d\n", dir, dsn, walWriter)
	if how != "exit" {
		select {} // until killed
	}
	os.Exit(0) // past TestMain's StopShared, as a package without a TestMain
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return syscall.Kill(pid, 0) == nil // no /proc: a zombie counts as alive
	}
	// The state follows the command's closing parenthesis.
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
