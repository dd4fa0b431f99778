package failuremodes_test

// The kill harness of issues 23 and 31: real server processes
// (chargeserver) serving a "charge" that writes a business row to
// PostgreSQL, driven by keyed clients that retry every key until it is
// answered, SIGKILLed over and over, at random moments and at chosen points
// (after the business write, between the COMMIT and the reply, after each
// phase), and started again each time on the same address. Then the rows
// are counted: a key with two charge rows ran twice; an answered key
// without its row lost an acknowledged effect.
//
// In joined mode (pgstore.Store.Joined; the row in the record's
// transaction) and joined mode in phases, the harness goes further (issue
// 31): two replicas serve every key, each key sent to both at once; the
// PostgreSQL server itself is restarted now and then (-m fast and -m
// immediate); its settings may be the dangerous ones
// (synchronous_commit=off, idle_in_transaction_session_timeout=0); and each
// charge writes an outbox message, which the replicas' relays deliver to a
// third process, a receiver with joined mode, killed too. There must be no
// double execution, no acknowledged effect lost, no message lost, none
// delivered twice to the receiver's table. The Redis store, the row
// committed by the handler's own transaction, must show doubles when a kill
// lands after the business commit: the same harness, side by side, one
// replica, no restarts.
//
// CI runs a short version; the full run is
//
//	go test ./examples/failuremodes -run TestChargeKillHarness -timeout 6h -v -args -charge-kills=1000 -charge-all
//
// (-charge-restart-every sets how many kills fall between two restarts of
// PostgreSQL, 25 by default; -charge-seed replays a plan.)

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
	chargeKills        = flag.Int("charge-kills", 12, "TestChargeKillHarness: SIGKILLs per scenario (the issue's full run: 1000)")
	chargeSeed         = flag.Uint64("charge-seed", 0, "TestChargeKillHarness: seed of the kill plan (0: from the clock, logged)")
	chargeRestartEvery = flag.Int("charge-restart-every", 25, "TestChargeKillHarness: kills between two restarts of PostgreSQL "+
		"(at most a third of the kills, so that a short run restarts it twice)")
	chargeAll = flag.Bool("charge-all", false, "TestChargeKillHarness: every scenario (CI's short run: the hostile settings only, "+
		"which hold the default ones' dangers and more)")
)

// chargeLease is the interceptor's lease in the harness: a Redis owner
// killed after the business commit holds its key this long.
const chargeLease = 300 * time.Millisecond

// chargeWorkers are the concurrent keyed callers.
const chargeWorkers = 12

// chargeScenario is one run of the harness.
type chargeScenario struct {
	name     string
	store    string // joined, phases or redis
	replicas int
	restarts bool     // restart PostgreSQL now and then (a cluster of the run's own)
	pgArgs   []string // that cluster's settings
	outbox   bool     // each charge writes an outbox message for the receiver, which is killed too
}

// hostileSettings are the server settings at their dangerous values for
// the guarantee: acknowledged commits lost in a crash, a cut-off owner's
// session never ended.
var hostileSettings = []string{"-c", "synchronous_commit=off", "-c", "idle_in_transaction_session_timeout=0"}

var chargeScenarios = []chargeScenario{
	{name: "joined", store: "joined", replicas: 2, restarts: true, outbox: true},
	{name: "joined-hostile", store: "joined", replicas: 2, restarts: true, pgArgs: hostileSettings, outbox: true},
	{name: "phases-hostile", store: "phases", replicas: 2, restarts: true, pgArgs: hostileSettings},
	{name: "redis", store: "redis", replicas: 1},
}

// chargeShortRun are the scenarios of a run without -charge-all.
var chargeShortRun = map[string]bool{"joined-hostile": true, "phases-hostile": true, "redis": true}

func TestChargeKillHarness(t *testing.T) {
	if testing.Short() {
		t.Skip("process test: not in -short")
	}
	bin := buildProgram(t, "github.com/grpc-resilience/resilience/examples/failuremodes/chargeserver")
	seed := *chargeSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("kill plan seed %d (-charge-seed), %d kills per scenario (-charge-kills), PostgreSQL restarted every %d kills",
		seed, *chargeKills, *chargeRestartEvery)
	var reports []string
	clusters := map[string]*pgtest.Server{} // by settings: the scenarios that restart PostgreSQL share one, in turn
	for _, sc := range chargeScenarios {
		if !*chargeAll && !chargeShortRun[sc.name] {
			continue
		}
		var pg *pgtest.Server
		if sc.restarts {
			settings := strings.Join(sc.pgArgs, " ")
			if pg = clusters[settings]; pg == nil {
				pg = pgtest.StartWith(t, sc.pgArgs...)
				clusters[settings] = pg
			}
		}
		t.Run(sc.name, func(t *testing.T) {
			h := newChargeHarness(t, bin, sc, pg, seed)
			r := h.run(t, *chargeKills)
			reports = append(reports, r.String())
			r.check(t)
		})
	}
	t.Logf("side by side:\n%s", strings.Join(reports, "\n"))
}

// chargeProc is a process of the harness: its arguments and, while it
// runs, the process.
type chargeProc struct {
	name string
	args []string
	addr string
	cur  *childServer
}

// chargeHarness is one scenario's run: its schemas, its processes' and
// what its clients got.
type chargeHarness struct {
	sc       chargeScenario
	bin      string
	pg       *pgtest.Server // the scenario's own cluster, when it restarts it
	admin    *pgxpool.Pool
	q, recvQ string // the schemas, quoted: the charges', the receiver's
	replicas []*chargeProc
	receiver *chargeProc // with sc.outbox
	rng      *rand.Rand
	points   []string // the kill points of the store
	n        int      // kills so far: the first at each point in turn, then the plan's draws

	mu        sync.Mutex
	answers   map[string]int64 // key → the charge id the client was answered
	disagreed int              // keys whose two replicas answered different ids
	errs      map[codes.Code]int
}

// newChargeHarness prepares scenario sc, on pg when it restarts
// PostgreSQL (else on the shared cluster).
func newChargeHarness(t *testing.T, bin string, sc chargeScenario, pg *pgtest.Server, seed uint64) *chargeHarness {
	t.Helper()
	h := &chargeHarness{sc: sc, bin: bin, pg: pg, rng: rand.New(rand.NewPCG(seed, uint64(len(sc.name)))), points: []string{"write", "commit"},
		answers: make(map[string]int64), errs: make(map[codes.Code]int)}
	dsn := pgtest.DSN(t)
	if pg != nil {
		dsn = pg.DSN
	}
	// The harness's own connections live through the restarts: each use
	// checks its connection first.
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
	h.admin = pgtest.PoolConfig(t, cfg)
	schema := pgtest.Schema(t, h.admin)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, h.admin, schema); err != nil {
		t.Fatal(err)
	}
	h.q = pgtest.Ident(schema)
	for _, ddl := range []string{
		"CREATE TABLE " + h.q + ".charges (id bigserial PRIMARY KEY, key text NOT NULL)", // no UNIQUE: the database does not deduplicate
		"CREATE TABLE " + h.q + ".orders (key text NOT NULL)",
		"CREATE TABLE " + h.q + ".payments (key text NOT NULL, fkey text NOT NULL)",
		"CREATE TABLE " + h.q + ".foreign_calls (key text NOT NULL, fkey text NOT NULL)",
		"CREATE TABLE " + h.q + ".foreign_payments (fkey text PRIMARY KEY, key text NOT NULL)",
	} {
		if _, err := h.admin.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	base := []string{"-dsn", dsn, "-store", sc.store, "-lease", chargeLease.String()}
	switch sc.store {
	case "phases":
		h.points = append(h.points, "order", "pay")
	case "redis":
		base = append(base, "-redis-addr", redistest.Addr(t))
	}
	if sc.outbox {
		recvSchema := pgtest.Schema(t, h.admin)
		if err := pgstore.Migrate(ctx, h.admin, recvSchema); err != nil {
			t.Fatal(err)
		}
		h.recvQ = pgtest.Ident(recvSchema)
		if _, err := h.admin.Exec(ctx, "CREATE TABLE "+h.recvQ+".deliveries (id bigserial PRIMARY KEY, key text NOT NULL, charge text NOT NULL)"); err != nil {
			t.Fatal(err)
		}
		h.receiver = &chargeProc{name: "receiver", addr: freeAddr(t)}
		h.receiver.args = []string{"-addr", h.receiver.addr, "-dsn", dsn, "-schema", recvSchema, "-store", "receiver"}
		base = append(base, "-outbox-to", h.receiver.addr)
	}
	for i := range sc.replicas {
		p := &chargeProc{name: "replica-" + strconv.Itoa(i), addr: freeAddr(t)}
		p.args = append([]string{"-addr", p.addr, "-schema", schema}, base...)
		h.replicas = append(h.replicas, p)
	}
	return h
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// chargeReport is what one scenario's run did and found.
type chargeReport struct {
	name                       string
	kills                      int
	killsAt                    map[string]int // by point; "random" for the harness's own
	receiverKills, pgRestarts  int
	keys, answered, unanswered int
	rows, doubles, lost        int
	idMismatch, disagreed      int
	phaseDoubles               int // orders, payments or foreign payments more than once per key
	foreignCalls               int // calls to the foreign API (retries included)
	outbox                     bool
	deliveries                 int // the receiver's rows
	deliveredTwice             int // charges with more than one delivery row
	undelivered                int // committed charges without a delivery row
	strayDeliveries            int // deliveries of no committed charge
	outboxLeft                 int // messages left in the outbox (dead or not)
	elapsed                    time.Duration
}

func (r *chargeReport) String() string {
	s := fmt.Sprintf("%-15s %5d kills (%s; %d PostgreSQL restarts) in %v: %d keys, %d answered, %d unanswered; %d charge rows, "+
		"%d double executions, %d answered without a row, %d answers naming another row, %d keys whose replicas disagreed",
		r.name, r.kills, r.killsText(), r.pgRestarts, r.elapsed.Round(time.Second), r.keys, r.answered, r.unanswered, r.rows,
		r.doubles, r.lost, r.idMismatch, r.disagreed)
	if r.phaseDoubles > 0 || r.foreignCalls > 0 {
		s += fmt.Sprintf("; phases: %d doubles, %d foreign calls", r.phaseDoubles, r.foreignCalls)
	}
	if r.outbox {
		s += fmt.Sprintf("; outbox, receiver killed %d times: %d deliveries, %d delivered twice, %d not delivered, %d stray, %d left",
			r.receiverKills, r.deliveries, r.deliveredTwice, r.undelivered, r.strayDeliveries, r.outboxLeft)
	}
	return s
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

// check holds the run to the issues: every key answered; in joined mode and
// phases no double execution, no answer without its row, replicas that
// agree, every outbox message delivered once; with Redis, doubles once kills
// landed after the business commit.
func (r *chargeReport) check(t *testing.T) {
	t.Helper()
	t.Log(r)
	if r.unanswered > 0 {
		t.Errorf("%d keys never answered", r.unanswered)
	}
	if strings.HasPrefix(r.name, "redis") {
		if r.killsAt["write"] > 0 && r.doubles == 0 {
			t.Errorf("Redis store: %d kills after the business commit and no double execution: the harness does not reach the window", r.killsAt["write"])
		}
		return
	}
	if r.doubles > 0 || r.phaseDoubles > 0 {
		t.Errorf("%s: %d double executions (%d in phases), want 0", r.name, r.doubles, r.phaseDoubles)
	}
	if r.lost > 0 || r.idMismatch > 0 || r.disagreed > 0 {
		t.Errorf("%s: %d keys answered without their row, %d answers naming another row, %d keys answered two ways, want 0",
			r.name, r.lost, r.idMismatch, r.disagreed)
	}
	if r.outbox && (r.deliveredTwice > 0 || r.undelivered > 0 || r.strayDeliveries > 0 || r.outboxLeft > 0) {
		t.Errorf("%s: outbox: %d charges delivered twice, %d not delivered, %d stray deliveries, %d messages left; want 0",
			r.name, r.deliveredTwice, r.undelivered, r.strayDeliveries, r.outboxLeft)
	}
}

// run kills the scenario's processes kills times, and restarts PostgreSQL
// now and then, with the clients calling all along; then it lets the last
// processes answer what is left (and deliver the outbox), and counts.
func (h *chargeHarness) run(t *testing.T, kills int) *chargeReport {
	t.Helper()
	start := time.Now()
	r := &chargeReport{name: h.sc.name, kills: kills, killsAt: make(map[string]int), outbox: h.sc.outbox}
	var clients []echov1.EchoServiceClient
	for _, p := range h.replicas {
		cc, err := grpc.NewClient("passthrough:///"+p.addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.5, MaxDelay: 50 * time.Millisecond},
				MinConnectTimeout: time.Second,
			}))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		clients = append(clients, echov1.NewEchoServiceClient(cc))
	}
	if h.receiver != nil {
		h.start(t, h.receiver, "")
	}
	for _, p := range h.replicas {
		h.start(t, p, "")
	}
	stop := make(chan struct{})
	var keys atomic.Int64
	var wg sync.WaitGroup
	for w := range chargeWorkers {
		wg.Go(func() { h.worker(t, clients, w, stop, &keys) })
	}
	every := min(*chargeRestartEvery, max(kills/3, 1))
	for i := range kills {
		if h.pg != nil && *chargeRestartEvery > 0 && i > 0 && i%every == 0 {
			immediate := r.pgRestarts%2 == 1 // -m fast, then -m immediate, in turn
			if err := h.pg.Restart(immediate); err != nil {
				t.Fatalf("restarting PostgreSQL: %v", err)
			}
			r.pgRestarts++
		}
		if h.receiver != nil && h.rng.IntN(5) == 0 {
			h.receiver.cur.kill()
			h.start(t, h.receiver, "")
			r.receiverKills++
		}
		r.killsAt[h.incarnation(t)]++
	}
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Errorf("keys still unanswered 2 minutes after the last kill")
		for _, p := range h.replicas {
			p.cur.kill()
		}
		<-done
	}
	if h.sc.outbox {
		h.waitDelivered(t)
	}
	for _, p := range h.replicas {
		p.cur.kill()
	}
	if h.receiver != nil {
		h.receiver.cur.kill()
	}
	r.elapsed = time.Since(start)
	r.keys = int(keys.Load())
	h.count(t, r)
	return r
}

// start starts p, with -die-at point when it is not empty.
func (h *chargeHarness) start(t *testing.T, p *chargeProc, point string) {
	t.Helper()
	args := p.args
	if point != "" {
		args = append(args[:len(args):len(args)], "-die-at", point+":"+strconv.Itoa(1+h.rng.IntN(4)))
	}
	var err error
	for attempt := 0; attempt < 3; attempt++ { // a start during a restart of PostgreSQL fails its Open
		if p.cur, err = startProcess(t, h.bin, args...); err == nil {
			return
		}
		time.Sleep(500 * time.Millisecond) // PostgreSQL coming back
	}
	t.Fatal(err)
}

// incarnation kills one replica (the plan's choice): at a random moment,
// or at a chosen point it reaches (it kills itself), then starts it again.
// It returns where it died. The first kills are at each chosen point in
// turn.
func (h *chargeHarness) incarnation(t *testing.T) string {
	t.Helper()
	victim := h.replicas[h.rng.IntN(len(h.replicas))]
	point := "random"
	switch {
	case h.n < len(h.points): // every point once first, so that a short run (CI's) reaches each
		point = h.points[h.n]
	case h.rng.IntN(10) < 6:
		point = h.points[h.rng.IntN(len(h.points))]
	}
	h.n++
	victim.cur.kill()
	if point == "random" {
		h.start(t, victim, "")
		time.Sleep(time.Duration(h.rng.Int64N(int64(150 * time.Millisecond)))) // a random moment of the load
		victim.cur.kill()
		h.start(t, victim, "")
		return point
	}
	h.start(t, victim, point)
	select {
	case <-victim.cur.exited:
	case <-time.After(5 * time.Second): // the point was not reached: kill it here
		victim.cur.kill()
		h.start(t, victim, "")
		return "random"
	}
	if ws, ok := victim.cur.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("server died of %v, not its own SIGKILL\nstderr:\n%s", victim.cur.cmd.ProcessState, victim.cur.stderrText())
	}
	h.start(t, victim, "")
	return point
}

// worker calls key after key, each sent to every replica at once and
// retried on each until that replica answers, until stop is closed; then it
// finishes its key.
func (h *chargeHarness) worker(t *testing.T, clients []echov1.EchoServiceClient, w int, stop <-chan struct{}, keys *atomic.Int64) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		key := h.sc.name + "-" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
		keys.Add(1)
		var wg sync.WaitGroup
		ids := make([]int64, len(clients))
		for c, echo := range clients {
			wg.Go(func() { ids[c] = h.callUntilAnswered(t, echo, key) })
		}
		wg.Wait()
		h.mu.Lock()
		for _, id := range ids {
			if id == 0 {
				continue
			}
			if prev, ok := h.answers[key]; ok && prev != id {
				h.disagreed++
			}
			h.answers[key] = id
		}
		h.mu.Unlock()
	}
}

// callUntilAnswered calls key on echo until it is answered, and returns the
// charge id of the answer (0: never answered, in 3 minutes).
func (h *chargeHarness) callUntilAnswered(t *testing.T, echo echov1.EchoServiceClient, key string) int64 {
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); {
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", key), 2*time.Second)
		resp, err := echo.Echo(ctx, &echov1.EchoRequest{Message: "10 EUR"})
		cancel()
		if err == nil {
			id, perr := strconv.ParseInt(strings.TrimPrefix(resp.GetMessage(), "charge "), 10, 64)
			if perr != nil {
				t.Errorf("Echo(%s) = %q, want \"charge <id>\"", key, resp.GetMessage())
			}
			return id
		}
		h.mu.Lock()
		h.errs[status.Code(err)]++
		h.mu.Unlock()
		if c := status.Code(err); c == codes.FailedPrecondition || c == codes.InvalidArgument || c == codes.Internal {
			t.Errorf("Echo(%s) = %v: the same request with its own key", key, err)
			return 0
		}
		time.Sleep(10 * time.Millisecond) // the server is down or the key busy: try again
	}
	return 0
}

// waitDelivered waits until the outbox is empty, the replicas' relays
// delivering to the receiver, for up to 2 minutes.
func (h *chargeHarness) waitDelivered(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var left int
		err := h.admin.QueryRow(ctx, "SELECT count(*) FROM "+h.q+".resilience_outbox").Scan(&left)
		if err == nil && left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("the outbox still holds %d messages (%v) 2 minutes after the last kill", left, err)
			return
		}
		time.Sleep(50 * time.Millisecond) // the relays' passes
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
	r.disagreed = h.disagreed
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
	if h.sc.store == "phases" {
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
	if h.sc.outbox {
		q := "SELECT (SELECT count(*) FROM " + h.recvQ + ".deliveries), " +
			"(SELECT count(*) FROM (SELECT charge FROM " + h.recvQ + ".deliveries GROUP BY charge HAVING count(*) > 1) s), " +
			"(SELECT count(*) FROM (SELECT DISTINCT key FROM " + h.q + ".charges) c WHERE NOT EXISTS " +
			"(SELECT FROM " + h.recvQ + ".deliveries d WHERE d.charge = c.key)), " +
			"(SELECT count(*) FROM " + h.recvQ + ".deliveries d WHERE NOT EXISTS (SELECT FROM " + h.q + ".charges c WHERE c.key = d.charge)), " +
			"(SELECT count(*) FROM " + h.q + ".resilience_outbox)"
		if err := h.admin.QueryRow(ctx, q).Scan(&r.deliveries, &r.deliveredTwice, &r.undelivered, &r.strayDeliveries, &r.outboxLeft); err != nil {
			t.Fatal(err)
		}
	}
}
