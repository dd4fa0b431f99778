package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/internal/proctest"
)

// startTimeout bounds how long a redis-server may take to become ready.
const startTimeout = 10 * time.Second

// Addr returns the address of a Redis server the test may use: $REDIS_ADDR,
// or a redis-server started for t and stopped at its cleanup.
func Addr(t testing.TB) string {
	t.Helper()
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		return addr
	}
	return Start(t).Addr
}

// Server is a redis-server started by Start.
type Server struct {
	// Addr is the server's loopback address.
	Addr string
	stop func()
	once sync.Once
	path string   // of redis-server
	port int      // of Addr
	args []string // the extra arguments of StartWith
}

// Stop kills the server and waits for it to exit. It is safe to call more
// than once; Start also registers it as a cleanup of the test.
func (s *Server) Stop() { s.once.Do(s.stop) }

// Restart kills the server (SIGKILL: no shutdown save) and starts it again
// on the same address with the same arguments, as a crashed and restarted
// Redis. What the new process holds is what its persistence kept.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	s.StartAgain(t)
}

// StartAgain starts a server that [Server.Stop] stopped again, on the same
// address with the same arguments. Between Stop and StartAgain the address
// refuses connections, as a Redis that crashed and is being restarted.
func (s *Server) StartAgain(t testing.TB) {
	t.Helper()
	var err error
	for range 50 { // the port may take a moment to be free again
		var n *Server
		if n, err = startOn(s.path, s.port, s.args...); err == nil {
			s.stop, s.once = n.stop, sync.Once{}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("restarting redis-server: %v", err)
}

// Start starts a redis-server for t, whatever REDIS_ADDR says, for tests that
// must stop their server. It skips or fails as Addr does when redis-server is
// not on PATH.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t)
}

// StartWith is Start with extra redis-server arguments, such as
// "--maxmemory", "8mb", "--maxmemory-policy", "volatile-ttl". The server's
// working directory (--dir) is a t.TempDir() unless args set one.
func StartWith(t testing.TB, args ...string) *Server {
	t.Helper()
	path := lookPath(t, "redis-server")
	// Whatever the server writes (an RDB a replica receives, AOF files)
	// goes to a directory of the test, not to the package's; a --dir in
	// args comes later and wins.
	args = append([]string{"--dir", t.TempDir()}, args...)
	var lastErr error
	for range 3 { // a free port may be taken between choosing and binding
		s, err := start(path, args...)
		if err == nil {
			t.Cleanup(s.Stop)
			return s
		}
		lastErr = err
	}
	t.Fatalf("starting redis-server: %v", lastErr)
	return nil
}

// Launch starts a redis-server outside a test, for a benchmark command,
// with extra redis-server arguments; the caller stops it with Stop. It
// returns an error when redis-server is not on PATH.
func Launch(args ...string) (*Server, error) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w (install redis-server, or set REDIS_ADDR)", err)
	}
	args = append([]string{"--dir", os.TempDir()}, args...)
	var lastErr error
	for range 3 { // a free port may be taken between choosing and binding
		s, err := start(path, args...)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, fmt.Errorf("redistest: starting redis-server: %w", lastErr)
}

func start(path string, args ...string) (*Server, error) {
	port, err := proctest.FreePort()
	if err != nil {
		return nil, err
	}
	return startOn(path, port, args...)
}

func startOn(path string, port int, args ...string) (*Server, error) {
	cmd := exec.Command(path, append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "notice"}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	proctest.DieWithParent(cmd) // no server outlives a test binary killed from outside
	done, err := proctest.Start(cmd, out, "redis-server", "Ready to accept connections", startTimeout)
	if err != nil {
		return nil, err
	}
	stop := func() {
		_ = cmd.Process.Kill()
		<-done
	}
	return &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), stop: stop, path: path, port: port, args: args}, nil
}

// StartReplica starts a redis-server (with args) that replicates primary
// (REPLICAOF), and waits, polling INFO replication, until its link to the
// primary is up and the initial copy is done. It sets the primary's
// repl-diskless-sync-delay to 0 first, so the copy starts at once.
func StartReplica(t testing.TB, primary *Server, args ...string) *Server {
	t.Helper()
	ctx := context.Background()
	if err := Client(t, primary.Addr).ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err(); err != nil {
		t.Fatalf("CONFIG SET repl-diskless-sync-delay on the primary: %v", err)
	}
	replica := StartWith(t, args...)
	host, port, _ := net.SplitHostPort(primary.Addr)
	if err := Client(t, replica.Addr).ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatalf("REPLICAOF: %v", err)
	}
	WaitInfo(t, replica.Addr, "replication", "master_link_status:up")
	return replica
}

// WaitInfo polls the INFO section of the server at addr until it contains
// want, such as "role:master", and fails t after 10 s.
func WaitInfo(t testing.TB, addr, section, want string) {
	t.Helper()
	c := Client(t, addr)
	deadline := time.Now().Add(startTimeout)
	for {
		info, err := c.Info(context.Background(), section).Result()
		if err == nil && strings.Contains(info, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("INFO %s of %s: %v %q, want %q", section, addr, err, info, want)
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
}

// Client returns a client of addr, closed when t ends.
func Client(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ClosedAddr returns a loopback address nothing listens on, for tests of a
// store outage.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	port, err := proctest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// Prefix returns a key prefix unique to t and to this run.
func Prefix(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "test:" + t.Name() + ":" + hex.EncodeToString(b[:]) + ":"
}

// Advance makes Redis behave as if d had passed for the keys under prefix:
// keys whose time to live is at most d are deleted, the others have it
// shortened by d. Redis cannot run on fake time; this moves the keys instead.
// On a *redis.ClusterClient it scans every primary.
func Advance(ctx context.Context, c redis.UniversalClient, prefix string, d time.Duration) error {
	if cc, ok := c.(*redis.ClusterClient); ok { // SCAN sees one node: scan every primary
		return cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			return advance(ctx, n, prefix, d)
		})
	}
	return advance(ctx, c, prefix, d)
}

func advance(ctx context.Context, c redis.UniversalClient, prefix string, d time.Duration) error {
	iter := c.Scan(ctx, 0, escapeGlob(prefix)+"*", 100).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil {
			return err
		}
		switch {
		case ttl < 0: // no expiry (-1) or gone (-2)
		case ttl <= d:
			err = c.Del(ctx, k).Err()
		default:
			err = c.PExpire(ctx, k, ttl-d).Err()
		}
		if err != nil {
			return err
		}
	}
	if err := iter.Err(); err != nil {
		return errors.Join(errors.New("redistest: scanning keys"), err)
	}
	return nil
}

func escapeGlob(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
	return r.Replace(s)
}

// RoundTrips counts the round trips a client makes to Redis: each command,
// and each pipeline as one.
type RoundTrips struct{ n atomic.Int64 }

// CountRoundTrips installs a RoundTrips counter on c.
func CountRoundTrips(c *redis.Client) *RoundTrips {
	rt := &RoundTrips{}
	c.AddHook(rt)
	return rt
}

// N returns the round trips counted so far.
func (rt *RoundTrips) N() int64 { return rt.n.Load() }

// DialHook implements redis.Hook.
func (rt *RoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook: one command is one round trip.
func (rt *RoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		rt.n.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook: one pipeline is one round trip.
func (rt *RoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		rt.n.Add(1)
		return next(ctx, cmds)
	}
}

// Fault is what [Faults] does to one command.
type Fault uint8

const (
	// LoseReply lets the command run on Redis and loses its reply, as a
	// reply delayed past the caller's deadline is lost: the command takes
	// effect, and the caller sees only its context's error.
	LoseReply Fault = iota + 1
	// Drop never sends the command, as a broken connection does: it has no
	// effect, and the caller sees only its context's error.
	Drop
)

// Faults is a hook that disturbs the next commands of a client, one [Fault]
// each, in the order given to [Faults.Next]; the other commands pass through.
// A disturbed command returns when its context ends, with the context's
// error: a command whose context never ends blocks forever.
type Faults struct {
	mu       sync.Mutex
	next     []Fault // guarded by mu
	injected atomic.Int64
}

// InjectFaults installs a Faults hook on c.
func InjectFaults(c *redis.Client) *Faults {
	f := &Faults{}
	c.AddHook(f)
	return f
}

// Next queues faults for the next commands, one each. A LoseReply is kept
// for the next command when Redis answers the current one with an error
// (NOSCRIPT, for one, so that go-redis's EVAL fallback is the command whose
// reply is lost).
func (f *Faults) Next(faults ...Fault) {
	f.mu.Lock()
	f.next = append(f.next, faults...)
	f.mu.Unlock()
}

// Injected returns the number of faults injected so far.
func (f *Faults) Injected() int64 { return f.injected.Load() }

// DialHook implements redis.Hook.
func (f *Faults) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook: it applies the next fault, if any.
func (f *Faults) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch f.pop() {
		case Drop:
		case LoseReply:
			if err := next(ctx, cmd); err != nil {
				f.push(LoseReply)
				return err
			}
		default:
			return next(ctx, cmd)
		}
		f.injected.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}
}

// ProcessPipelineHook implements redis.Hook: pipelines pass through.
func (f *Faults) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// pop removes and returns the next fault; 0 when none is queued.
func (f *Faults) pop() Fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.next) == 0 {
		return 0
	}
	x := f.next[0]
	f.next = f.next[1:]
	return x
}

// push puts x back in front of the queue.
func (f *Faults) push(x Fault) {
	f.mu.Lock()
	f.next = append([]Fault{x}, f.next...)
	f.mu.Unlock()
}

// FillPastMaxmemory puts the Redis server of c past its maxmemory by a
// margin no buffer can undo, so that on a noeviction server every later
// write is refused for memory (OOM) until the test ends: it lifts the
// limit, writes about a megabyte, and sets maxmemory half a megabyte below
// the memory then in use; it fails t unless a write is then refused.
//
// Filling up to the limit is not enough: Redis counts its clients' query
// buffers against maxmemory and shrinks an idle one only in its periodic
// cron, so a used memory past the limit only by a pipeline's buffer falls
// back below it a moment later, and a write the test expects refused is
// stored (1 run in 4 with another package's tests beside).
func FillPastMaxmemory(t testing.TB, c *redis.Client) {
	t.Helper()
	ctx := context.Background()
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	value := make([]byte, 256)
	for batch := range 16 {
		if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range 256 {
				p.Set(ctx, "filler:"+strconv.Itoa(batch)+":"+strconv.Itoa(i), value, 0)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	info, err := c.InfoMap(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	used, err := strconv.ParseInt(info["Memory"]["used_memory"], 10, 64)
	if err != nil {
		t.Fatalf("INFO memory's used_memory: %v", err)
	}
	const margin = 512 << 10
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used-margin, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "filler:probe", value, 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("a write %d bytes past maxmemory = %v, want OOM", margin, err)
	}
}
