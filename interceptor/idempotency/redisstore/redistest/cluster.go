package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/internal/proctest"
)

// clusterTimeout bounds how long a cluster may take to agree that it is
// whole (cluster_state:ok on every node).
const clusterTimeout = 20 * time.Second

// Cluster is a Redis Cluster of primaries without replicas, started by
// [StartCluster] on loopback ports.
type Cluster struct {
	// Nodes are the primaries, in the order of their slot ranges: Nodes[0]
	// serves the first third of the slots, and so on.
	Nodes []*Server
	admin []*redis.Client // one per node; closed when the test ends
}

// StartCluster starts n primaries (n >= 3: Redis Cluster's minimum) with
// cluster-enabled yes, each with its cluster-config-file and data in a
// directory of t.TempDir(), joins them with redis-cli --cluster create,
// and waits, by polling CLUSTER INFO, until every node reports
// cluster_state:ok. args are extra redis-server arguments of every node,
// such as "--appendonly", "yes" (a node's Restart then keeps its data). It
// skips or fails as [StartWith] does when redis-server or redis-cli is not
// on PATH. The nodes are stopped when the test ends.
func StartCluster(t testing.TB, n int, args ...string) *Cluster {
	t.Helper()
	if n < 3 {
		t.Fatalf("StartCluster(%d): a Redis Cluster needs at least 3 primaries", n)
	}
	cli := lookPath(t, "redis-cli")
	c := &Cluster{}
	addrs := make([]string, n)
	for i := range n {
		dir := t.TempDir()
		bus, err := proctest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		nodeArgs := append([]string{
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-port", strconv.Itoa(bus), "--cluster-node-timeout", "5000", "--dir", dir,
		}, args...)
		s := StartWith(t, nodeArgs...)
		c.Nodes = append(c.Nodes, s)
		addrs[i] = s.Addr
		c.admin = append(c.admin, Client(t, s.Addr))
	}
	// Bounded, so that a redis-cli that hangs (waiting on a node) fails the
	// test rather than the whole run's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, cli, append(append([]string{"--cluster", "create"}, addrs...), "--cluster-yes")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitOK(t)
	return c
}

// lookPath returns the path of the named program, or skips or fails t as
// StartWith does when it is not on PATH.
func lookPath(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		msg := name + " not found on PATH: install it (apt-get install redis-server, which brings redis-cli), " +
			"or set REDIS_ADDR=host:port for the tests that can use a running server"
		if os.Getenv("CI") != "" {
			t.Fatal(msg + " (CI is set, so Redis tests must not be skipped)")
		}
		t.Skip(msg)
	}
	return path
}

// Addrs returns the addresses of the nodes.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr
	}
	return addrs
}

// Client returns a cluster client of c, closed when t ends. opts may be
// nil; its Addrs are set to c's.
func (c *Cluster) Client(t testing.TB, opts *redis.ClusterOptions) *redis.ClusterClient {
	t.Helper()
	o := redis.ClusterOptions{}
	if opts != nil {
		o = *opts
	}
	o.Addrs = c.Addrs()
	cc := redis.NewClusterClient(&o)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Admin returns a plain client of node i, for commands to that node alone
// (CONFIG SET, CLUSTER ...). It is closed when the test ends.
func (c *Cluster) Admin(i int) *redis.Client { return c.admin[i] }

// WaitOK polls every node's CLUSTER INFO until each reports
// cluster_state:ok with all 16384 slots assigned, and fails t after 20 s.
func (c *Cluster) WaitOK(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(clusterTimeout)
	var last string
	for {
		ok := true
		for i, a := range c.admin {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			info, err := a.ClusterInfo(ctx).Result()
			cancel()
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_assigned:16384") {
				ok, last = false, fmt.Sprintf("node %d (%s): %v %q", i, c.Nodes[i].Addr, err, firstLine(info))
				break
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not ok after %v: %s", clusterTimeout, last)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(line)
}

// Owner returns the index of the node that serves slot, as node 0 sees it.
func (c *Cluster) Owner(ctx context.Context, slot int) (int, error) {
	slots, err := c.admin[0].ClusterSlots(ctx).Result()
	if err != nil {
		return 0, err
	}
	for _, r := range slots {
		if slot < r.Start || slot > r.End || len(r.Nodes) == 0 {
			continue
		}
		for i, s := range c.Nodes {
			if s.Addr == r.Nodes[0].Addr {
				return i, nil
			}
		}
		return 0, fmt.Errorf("redistest: slot %d is served by %s, not a node of the cluster", slot, r.Nodes[0].Addr)
	}
	return 0, fmt.Errorf("redistest: slot %d is not served", slot)
}

// MoveSlot migrates slot, with its keys, to node to, as redis-cli --cluster
// reshard does: CLUSTER SETSLOT IMPORTING on the target and MIGRATING on
// the source, MIGRATE of the slot's keys in batches, then CLUSTER SETSLOT
// NODE on every node. While it runs, the source answers for the keys it
// still holds and sends the others, and new keys, to the target with ASK.
// It does nothing when to already serves slot.
func (c *Cluster) MoveSlot(ctx context.Context, slot, to int) error {
	from, err := c.Owner(ctx, slot)
	if err != nil || from == to {
		return err
	}
	src, dst := c.admin[from], c.admin[to]
	srcID, err := src.ClusterMyID(ctx).Result()
	if err != nil {
		return err
	}
	dstID, err := dst.ClusterMyID(ctx).Result()
	if err != nil {
		return err
	}
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		return fmt.Errorf("redistest: SETSLOT %d IMPORTING on node %d: %w", slot, to, err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		return fmt.Errorf("redistest: SETSLOT %d MIGRATING on node %d: %w", slot, from, err)
	}
	host, port, _ := net.SplitHostPort(c.Nodes[to].Addr)
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("redistest: MIGRATE of slot %d: %w", slot, err)
		}
	}
	// The target first, so that it serves the slot before the source
	// redirects to it for good.
	order := append([]int{to, from}, others(len(c.Nodes), to, from)...)
	for _, i := range order {
		if err := c.admin[i].Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err(); err != nil {
			return fmt.Errorf("redistest: SETSLOT %d NODE on node %d: %w", slot, i, err)
		}
	}
	return nil
}

func others(n, a, b int) []int {
	var r []int
	for i := range n {
		if i != a && i != b {
			r = append(r, i)
		}
	}
	return r
}
