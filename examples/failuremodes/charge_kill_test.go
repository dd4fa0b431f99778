package failuremodes_test

// The kill harness of issue 23: a real server process (chargeserver)
// serving a "charge" that writes a business row to PostgreSQL, driven by
// keyed clients that retry every key until it is answered, SIGKILLed over
// and over, at random moments and at chosen points (after the business
// write, between the COMMIT and the reply, after each phase), and started
// again each time on the same address. Then the rows are counted: a key
// with two charge rows ran twice.
//
// Joined mode (pgstore.Store.Joined; the row in the record's transaction)
// and joined mode in phases must show no double execution at all; the
// Redis store, the row committed by the handler's own transaction, must
// show doubles when a kill lands after the business commit: the same
// harness, side by side.
//
// CI runs a short version; the full run is
//
//	go test ./examples/failuremodes -run TestChargeKillHarness -timeout 2h -v -args -charge-kills=1000

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

var (
	chargeKills = flag.Int("charge-kills", 12, "TestChargeKillHarness: SIGKILLs per store (the issue's full run: 1000)")
	chargeSeed  = flag.Uint64("charge-seed", 0, "TestChargeKillHarness: seed of the kill plan (0: from the clock, logged)")
)

// chargeLease is the interceptor's lease in the harness: a Redis owner
// killed after the business commit holds its key this long, and a dead
// owner in phases blocks a resume this long.
const chargeLease = 300 * time.Millisecond

// chargeWorkers are the concurrent keyed callers.
const chargeWorkers = 12

func TestChargeKillHarness(t *testing.T) {
	if testing.Short() {
		t.Skip("process test: not in -short")
	}
	bin := buildProgram(t, "github.com/grpc-resilience/resilience/examples/failuremodes/chargeserver")
	dsn := pgtest.DSN(t)
	seed := *chargeSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("kill plan seed %d (-charge-seed), %d kills per store (-charge-kills)", seed, *chargeKills)
	var reports []string
	for _, store := range []string{"joined", "phases", "redis"} {
		t.Run(store, func(t *testing.T) {
			h := newChargeHarness(t, bin, dsn, store, seed)
			r := h.run(t, *chargeKills)
			reports = append(reports, r.String())
			r.check(t)
		})
	}
	t.Logf("side by side:\n%s", strings.Join(reports, "\n"))
}

// chargeHarness is one store's run: its schema, its child's arguments and
// what its clients got.
type chargeHarness struct {
	store  string
	bin    string
	args   []string // the child's, but -die-at
	admin  *pgxpool.Pool
	q      string // the schema, quoted
	rng    *rand.Rand
	points []string // the kill points of the store
	n      int      // incarnations started: the first kill at each point in turn, then the plan's draws

	mu      sync.Mutex
	answers map[string]int64 // key → the charge id the client was answered
	errs    map[codes.Code]int
}

func newChargeHarness(t *testing.T, bin, dsn, store string, seed uint64) *chargeHarness {
	t.Helper()
	admin := pgtest.Pool(t, dsn)
	schema := pgtest.Schema(t, admin)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, admin, schema); err != nil {
		t.Fatal(err)
	}
	q := pgtest.Ident(schema)
	for _, ddl := range []string{
		"CREATE TABLE " + q + ".charges (id bigserial PRIMARY KEY, key text NOT NULL)", // no UNIQUE: the database does not deduplicate
		"CREATE TABLE " + q + ".orders (key text NOT NULL)",
		"CREATE TABLE " + q + ".payments (key text NOT NULL, fkey text NOT NULL)",
		"CREATE TABLE " + q + ".foreign_calls (key text NOT NULL, fkey text NOT NULL)",
		"CREATE TABLE " + q + ".foreign_payments (fkey text PRIMARY KEY, key text NOT NULL)",
	} {
		if _, err := admin.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	h := &chargeHarness{
		store: store, bin: bin, admin: admin, q: q,
		args: []string{"-addr", "127.0.0.1:" + strconv.Itoa(port), "-dsn", dsn, "-schema", schema, "-store", store,
			"-lease", chargeLease.String()},
		rng:     rand.New(rand.NewPCG(seed, uint64(len(store)))),
		points:  []string{"write", "commit"},
		answers: make(map[string]int64),
		errs:    make(map[codes.Code]int),
	}
	switch store {
	case "phases":
		h.points = append(h.points, "order", "pay")
	case "redis":
		h.args = append(h.args, "-redis-addr", redistest.Addr(t))
	}
	return h
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// chargeReport is what one store's run did and found.
type chargeReport struct {
	store                      string
	kills                      int
	killsAt                    map[string]int // by point; "random" for the harness's own
	keys, answered, unanswered int
	rows, doubles, lost        int
	idMismatch                 int
	phaseDoubles               int // orders, payments or foreign payments more than once per key
	foreignCalls               int // calls to the foreign API (retries included)
	elapsed                    time.Duration
}

func (r *chargeReport) String() string {
	return fmt.Sprintf("%-7s %5d kills (%s) in %v: %d keys, %d answered, %d unanswered; %d charge rows, "+
		"%d double executions, %d answered without a row, %d answers naming another row; phases: %d doubles, %d foreign calls",
		r.store, r.kills, r.killsText(), r.elapsed.Round(time.Second), r.keys, r.answered, r.unanswered, r.rows,
		r.doubles, r.lost, r.idMismatch, r.phaseDoubles, r.foreignCalls)
}

func (r *chargeReport) killsText() string {
	var parts []string
	for _, p := range []string{"random", "write", "commit", "order", "pay"} {
		if n := r.killsAt[p]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", p, n))
		}
	}
	return strings.Join(parts, ", ")
}

// check holds the run to the issue: every key answered; in joined mode and
// phases no double execution, no answer without its row; with Redis,
// doubles once kills landed after the business commit.
func (r *chargeReport) check(t *testing.T) {
	t.Helper()
	t.Log(r)
	if r.unanswered > 0 {
		t.Errorf("%d keys never answered", r.unanswered)
	}
	if r.store == "redis" {
		if r.killsAt["write"] > 0 && r.doubles == 0 {
			t.Errorf("Redis store: %d kills after the business commit and no double execution: the harness does not reach the window", r.killsAt["write"])
		}
		return
	}
	if r.doubles > 0 || r.phaseDoubles > 0 {
		t.Errorf("%s: %d double executions (%d in phases), want 0", r.store, r.doubles, r.phaseDoubles)
	}
	if r.lost > 0 || r.idMismatch > 0 {
		t.Errorf("%s: %d keys answered without their row, %d answers naming another row, want 0", r.store, r.lost, r.idMismatch)
	}
}

// run kills the store's server kills times, with the clients calling all
// along, then lets the last server answer what is left.
func (h *chargeHarness) run(t *testing.T, kills int) *chargeReport {
	t.Helper()
	start := time.Now()
	r := &chargeReport{store: h.store, kills: kills, killsAt: make(map[string]int)}
	cc, err := grpc.NewClient("passthrough:///"+h.args[1],
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.5, MaxDelay: 50 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	echo := echov1.NewEchoServiceClient(cc)
	stop := make(chan struct{})
	var keys atomic.Int64
	var wg sync.WaitGroup
	for w := range chargeWorkers {
		wg.Go(func() { h.worker(t, echo, w, stop, &keys) })
	}
	for range kills {
		r.killsAt[h.incarnation(t)]++
	}
	last, err := startProcess(t, h.bin, h.args...)
	if err != nil {
		t.Fatal(err)
	}
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Errorf("keys still unanswered 2 minutes after the last kill")
		last.kill()
		<-done
	}
	last.kill()
	r.elapsed = time.Since(start)
	r.keys = int(keys.Load())
	h.count(t, r)
	return r
}

// incarnation starts the server, lets the load run, and kills it: at a
// random moment, or at a chosen point the server reaches (it kills itself).
// It returns where it died. The first incarnations die at each chosen
// point in turn.
func (h *chargeHarness) incarnation(t *testing.T) string {
	t.Helper()
	args := h.args
	point := "random"
	switch {
	case h.n < len(h.points): // every point once first, so that a short run (CI's) reaches each
		point = h.points[h.n]
	case h.rng.IntN(10) < 6:
		point = h.points[h.rng.IntN(len(h.points))]
	}
	h.n++
	if point != "random" {
		args = append(args[:len(args):len(args)], "-die-at", point+":"+strconv.Itoa(1+h.rng.IntN(4)))
	}
	child, err := startProcess(t, h.bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	if point == "random" {
		time.Sleep(time.Duration(h.rng.Int64N(int64(150 * time.Millisecond)))) // a random moment of the load
		child.kill()
		return point
	}
	select {
	case <-child.exited:
	case <-time.After(5 * time.Second): // the point was not reached: kill it here
		child.kill()
		return "random"
	}
	if ws, ok := child.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("server died of %v, not its own SIGKILL\nstderr:\n%s", child.cmd.ProcessState, child.stderrText())
	}
	return point
}

// worker calls key after key, each until it is answered, until stop is
// closed; then it finishes its key.
func (h *chargeHarness) worker(t *testing.T, echo echov1.EchoServiceClient, w int, stop <-chan struct{}, keys *atomic.Int64) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		key := h.store + "-" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
		keys.Add(1)
		for deadline := time.Now().Add(3 * time.Minute); ; {
			ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", key), 2*time.Second)
			resp, err := echo.Echo(ctx, &echov1.EchoRequest{Message: "10 EUR"})
			cancel()
			if err == nil {
				id, perr := strconv.ParseInt(strings.TrimPrefix(resp.GetMessage(), "charge "), 10, 64)
				if perr != nil {
					t.Errorf("Echo(%s) = %q, want \"charge <id>\"", key, resp.GetMessage())
				}
				h.mu.Lock()
				h.answers[key] = id
				h.mu.Unlock()
				break
			}
			h.mu.Lock()
			h.errs[status.Code(err)]++
			h.mu.Unlock()
			if c := status.Code(err); c == codes.FailedPrecondition || c == codes.InvalidArgument {
				t.Errorf("Echo(%s) = %v: the same request with its own key", key, err)
				break
			}
			if time.Now().After(deadline) {
				break // counted as unanswered
			}
			time.Sleep(10 * time.Millisecond) // the server is down or the key busy: try again
		}
	}
}

// count reads the rows and compares them with the answers.
func (h *chargeHarness) count(t *testing.T, r *chargeReport) {
	t.Helper()
	ctx := context.Background()
	rows := map[string][]int64{}
	res, err := h.admin.Query(ctx, "SELECT key, id FROM "+h.q+".charges")
	if err != nil {
		t.Fatal(err)
	}
	for res.Next() {
		var key string
		var id int64
		if err := res.Scan(&key, &id); err != nil {
			t.Fatal(err)
		}
		rows[key] = append(rows[key], id)
		r.rows++
	}
	res.Close()
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	for _, ids := range rows {
		r.doubles += len(ids) - 1
	}
	h.mu.Lock()
	r.answered = len(h.answers)
	for key, id := range h.answers {
		ids := rows[key]
		switch {
		case len(ids) == 0:
			r.lost++
		case len(ids) == 1 && ids[0] != id:
			r.idMismatch++
		}
	}
	t.Logf("errors the clients retried, by code: %v", h.errs)
	h.mu.Unlock()
	r.unanswered = r.keys - r.answered
	if h.store == "phases" {
		for _, table := range []string{"orders", "payments", "foreign_payments"} {
			var n int
			q := "SELECT coalesce(sum(c - 1), 0) FROM (SELECT count(*) AS c FROM " + h.q + "." + table + " GROUP BY key) s"
			if err := h.admin.QueryRow(ctx, q).Scan(&n); err != nil {
				t.Fatal(err)
			}
			r.phaseDoubles += n
		}
		if err := h.admin.QueryRow(ctx, "SELECT count(*) FROM "+h.q+".foreign_calls").Scan(&r.foreignCalls); err != nil {
			t.Fatal(err)
		}
	}
}
