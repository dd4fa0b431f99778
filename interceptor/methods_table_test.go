package interceptor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/internal/breaker"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// anyMethodServer answers every method with an EchoResponse, or with
// UNAVAILABLE when the request's message is "fail".
func anyMethodServer(t *testing.T, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	handler := func(_ any, stream grpc.ServerStream) error {
		var req echov1.EchoRequest
		if err := stream.RecvMsg(&req); err != nil {
			return err
		}
		if req.GetMessage() == "fail" {
			return status.Error(codes.Unavailable, "scripted failure")
		}
		return stream.SendMsg(&echov1.EchoResponse{Message: req.GetMessage()})
	}
	return testserver.ServeWith(t, []grpc.ServerOption{grpc.UnknownServiceHandler(handler)}, func(*grpc.Server) {}, opts...)
}

// Finding 3 of issue 32: method names that no config entry applies to held
// no state yet counted toward the bound of 1,024 kept methods; once it was
// full, a configured service's methods called without grpc.StaticMethod
// shared one breaker: after 1,100 calls to unknown names, 3 failures of one
// method made another, which never failed, fail circuit-open for 60 s. Now
// unknown names hold nothing and count nothing (no row), and each method of
// the service has a breaker of its own.
func TestUnknownNamesHoldNothingAndConfiguredMethodsNeverShareABreaker(t *testing.T) {
	c := newTestClient(t, WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: "shop.Orders"}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 3, OpenDuration: time.Minute},
	}))
	cc := anyMethodServer(t, c.DialOptions()...)
	call := func(m, msg string) error {
		return cc.Invoke(t.Context(), m, &echov1.EchoRequest{Message: msg}, &echov1.EchoResponse{})
	}
	for i := range 1100 {
		if err := call(callerNamed(i), ""); err != nil {
			t.Fatalf("call %d of an unknown name = %v", i, err)
		}
	}
	if n := keptMethods(c); n != 0 {
		t.Errorf("after 1,100 calls to unknown names, %d rows kept, want 0", n)
	}
	for range 3 {
		if err := call("/shop.Orders/Create", "fail"); status.Code(err) != codes.Unavailable {
			t.Fatalf("Create = %v, want the server's UNAVAILABLE", err)
		}
	}
	if err := call("/shop.Orders/Create", ""); !errors.Is(err, ErrCircuitOpen) {
		t.Errorf("Create after 3 failures = %v, want ErrCircuitOpen", err)
	}
	if err := call("/shop.Orders/Get", ""); err != nil {
		t.Errorf("Get, which never failed, after Create's 3 failures = %v, want success", err)
	}
	if n := keptMethods(c); n != 2 {
		t.Errorf("%d rows kept, want 2 (Create and Get)", n)
	}
}

// The model of TestMethodTableModel.

// modelCfgs are the configs the model's updates choose among. Every
// breaker opens for an hour, so that an open breaker stays open in the
// test; the methods are those of modelMethods.
var modelCfgs = []string{
	// 0: a service with a breaker and a bulkhead, one of its methods named
	// with a breaker of its own, and a default entry with a breaker.
	`{"methodConfig": [
		{"name": [{"service": "m.S1"}], "circuitBreaker": {"consecutiveFailures": 3, "openDuration": "3600s"}, "bulkhead": {"maxConcurrent": 100}},
		{"name": [{"service": "m.S1", "method": "M0"}], "circuitBreaker": {"consecutiveFailures": 2, "openDuration": "3600s"}},
		{"name": [{}], "circuitBreaker": {"consecutiveFailures": 3, "openDuration": "3600s"}}]}`,
	// 1: S1's block changed, S2 with a breaker, no default entry.
	`{"methodConfig": [
		{"name": [{"service": "m.S1"}], "circuitBreaker": {"consecutiveFailures": 4, "openDuration": "3600s"}},
		{"name": [{"service": "m.S2"}], "circuitBreaker": {"consecutiveFailures": 3, "openDuration": "3600s"}}]}`,
	// 2: S1 with no state (a timeout), a default entry with state but no
	// guard (a retry policy), S2 named method by method.
	`{"methodConfig": [
		{"name": [{"service": "m.S1"}], "timeout": "10s"},
		{"name": [{"service": "m.S2", "method": "M0"}, {"service": "m.S2", "method": "M1"}], "circuitBreaker": {"consecutiveFailures": 3, "openDuration": "3600s"}},
		{"name": [{}], "retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.001s", "maxBackoff": "0.001s", "backoffMultiplier": 1, "retryableStatusCodes": ["INTERNAL"]}}]}`,
	// 3: nothing.
	`{}`,
	// 4: a default entry alone, with a breaker: every method's row counts
	// under one key, which overflows when the rows of S1 and S2 move to it.
	`{"methodConfig": [{"name": [{}], "circuitBreaker": {"consecutiveFailures": 3, "openDuration": "3600s"}}]}`,
}

// modelMethods are the methods the model calls: six of S1, four of S2 and
// four that only a default entry applies to.
var modelMethods = func() []string {
	var ms []string
	for i := range 6 {
		ms = append(ms, fmt.Sprintf("/m.S1/M%d", i))
	}
	for i := range 4 {
		ms = append(ms, fmt.Sprintf("/m.S2/M%d", i))
	}
	for i := range 4 {
		ms = append(ms, fmt.Sprintf("/m.G%d/M", i))
	}
	return ms
}()

// modelMethod is what the reference model knows of one method's breaker.
type modelMethod struct {
	forced   BreakerState // BreakerClosed: not forced
	open     bool
	failures int // in a row, since the breaker was made, reset or changed
}

// live reports whether the model's method has a state a row keeps: the
// table lets go no live row for room while an idle one is there.
func (m modelMethod) live() bool { return m.forced != BreakerClosed || m.open || m.failures > 0 }

// tableModel is the reference: what the configs say of each method, and
// each method's breaker.
type tableModel struct {
	cfg     *serviceconfig.Config
	static  map[string]bool
	methods map[string]modelMethod
	bound   int
}

// threshold returns the consecutive failures that open m's breaker under
// the config, 0 when m has no breaker.
func (md *tableModel) threshold(m string) int {
	mc, ok := md.cfg.Lookup(m)
	if !ok || mc.CircuitBreaker == nil {
		return 0
	}
	return mc.CircuitBreaker.ConsecutiveFailures
}

// hasState reports whether m has state under the config: a breaker, a
// bulkhead or a retry policy.
func (md *tableModel) hasState(m string) bool {
	mc, ok := md.cfg.Lookup(m)
	return ok && (mc.CircuitBreaker != nil || mc.Bulkhead != nil || mc.RetryPolicy != nil)
}

// pinned reports whether m's entry names it exactly or a stub called it.
func (md *tableModel) pinned(m string) bool {
	mc, ok := md.cfg.Lookup(m)
	return md.static[m] || ok && entryKey(mc, m) == m
}

// key returns m's key under the config.
func (md *tableModel) key(m string) string {
	mc, _ := md.cfg.Lookup(m)
	return entryKey(mc, m)
}

// TestMethodTableModel checks the invariants of methods.go, T1 to T6,
// after every step of 12,000 random steps over real gRPC (calls that
// succeed or fail, through a generated stub's option or not, ForceOpen,
// ForceClosed, ResetBreaker, and updates among five configs), with a bound
// of 3 rows per key, against a reference model of each method's breaker:
// every call's outcome and every control's error are predicted by the
// model, Statuses lists exactly the rows with a guard in the model's
// states, no two rows share a guard, no key counts more than the bound,
// pinned methods always have a row, methods without state never do, and a
// row goes only as T6 allows.
func TestMethodTableModel(t *testing.T) {
	const seeds, steps = 4, 3000
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { runTableModel(t, seed, steps) })
	}
}

func runTableModel(t *testing.T, seed uint64, steps int) {
	r := rand.New(rand.NewPCG(seed, 32))
	cfg := mustParse(t, modelCfgs[0])
	c := newTestClient(t, WithServiceConfig(cfg), WithRetryBudget(nil))
	c.table.bound = 3
	cc := anyMethodServer(t, c.DialOptions()...)
	md := &tableModel{cfg: cfg, static: map[string]bool{}, methods: map[string]modelMethod{}, bound: c.table.bound}
	var log []string
	fail := func(format string, args ...any) {
		t.Helper()
		tail := log[max(0, len(log)-12):]
		t.Fatalf("seed %d, step %d (%s): %s\nlast steps: %s", seed, len(log), log[len(log)-1], fmt.Sprintf(format, args...), strings.Join(tail, "; "))
	}
	rows := func() map[string]bool {
		c.table.mu.Lock()
		defer c.table.mu.Unlock()
		out := map[string]bool{}
		for m := range c.table.rows {
			out[m] = true
		}
		return out
	}
	for range steps {
		m := modelMethods[r.IntN(len(modelMethods))]
		before := rows()
		beforeModel := maps(md.methods)
		switch op := r.IntN(10); {
		case op < 6: // a call
			failing, static := r.IntN(3) == 0, r.IntN(4) == 0
			log = append(log, fmt.Sprintf("call %s fail=%v static=%v", m, failing, static))
			var opts []grpc.CallOption
			if static {
				opts = append(opts, grpc.StaticMethod())
				md.static[m] = true
			}
			msg := map[bool]string{true: "fail"}[failing]
			err := cc.Invoke(t.Context(), m, &echov1.EchoRequest{Message: msg}, &echov1.EchoResponse{}, opts...)
			st := md.methods[m]
			th := md.threshold(m)
			_, hadRow := before[m]
			tracked := rows()[m]
			switch {
			case th > 0 && tracked && hadRow && (st.forced == BreakerForcedOpen || st.open):
				if !errors.Is(err, ErrCircuitOpen) {
					fail("= %v, want ErrCircuitOpen (model %+v)", err, st)
				}
			case failing:
				if status.Code(err) != codes.Unavailable {
					fail("= %v, want the server's UNAVAILABLE (model %+v)", err, st)
				}
				if th > 0 && tracked {
					st.failures++
					if st.forced == BreakerClosed && st.failures >= th {
						st.open, st.failures = true, 0
					}
				}
			default:
				if err != nil {
					fail("= %v, want success (model %+v)", err, st)
				}
				if th > 0 && tracked {
					st.failures = 0
				}
			}
			if th > 0 && tracked {
				md.methods[m] = st
			}
		case op < 8: // a breaker control
			ctl := r.IntN(3)
			name := []string{"ForceOpen", "ForceClosed", "ResetBreaker"}[ctl]
			log = append(log, name+" "+m)
			err := []func(string) error{c.ForceOpen, c.ForceClosed, c.ResetBreaker}[ctl](m)
			wantErr := ""
			switch {
			case md.threshold(m) == 0:
				wantErr = "circuit"
			case !before[m] && !md.pinned(m) && md.keyFull(before, m) && !md.idleIn(before, m):
				wantErr = "none is idle"
			}
			if wantErr == "" && err != nil || wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)) {
				fail("= %v, want error %q", err, wantErr)
			}
			if err == nil {
				md.methods[m] = modelMethod{forced: []BreakerState{BreakerForcedOpen, BreakerForcedClosed, BreakerClosed}[ctl]}
			}
		case op < 9: // an update
			i := r.IntN(len(modelCfgs))
			log = append(log, fmt.Sprint("update to config ", i))
			next := mustParse(t, modelCfgs[i])
			prev := md.cfg
			if err := c.UpdateServiceConfig(next); err != nil {
				t.Fatal(err)
			}
			md.cfg = next
			for mm, st := range md.methods {
				switch {
				case md.threshold(mm) == 0:
					delete(md.methods, mm) // the block dropped drops the breaker
				case !sameBreakerBlock(prev, next, mm):
					st.failures = 0 // counts afresh under the new block; forced and open stay
					md.methods[mm] = st
				}
			}
		default: // a read
			log = append(log, "Status "+m)
			s := c.Status(m)
			if (s.Breaker != nil) != (md.threshold(m) > 0) {
				fail("Status = %+v, want a breaker %v", s, md.threshold(m) > 0)
			}
		}
		after := rows()
		// A row that went: T6. Its model state goes with it.
		for mm := range before {
			if after[mm] {
				continue
			}
			update := strings.HasPrefix(log[len(log)-1], "update")
			switch {
			case update && !md.hasState(mm):
			case update && !md.pinned(mm) && md.countIn(after, md.key(mm)) == md.bound &&
				(!beforeModel[mm].live() || !md.idleKept(after, md.key(mm), beforeModel)):
			case !update && !md.pinned(mm) && !beforeModel[mm].live():
			default:
				fail("%s's row went (model %+v, pinned %v, state %v)", mm, beforeModel[mm], md.pinned(mm), md.hasState(mm))
			}
			delete(md.methods, mm)
		}
		checkTable(t, c, md, after, fail)
	}
}

// maps returns a copy of m.
func maps(m map[string]modelMethod) map[string]modelMethod {
	out := make(map[string]modelMethod, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// sameBreakerBlock reports whether m's breaker block is the same under a
// and b.
func sameBreakerBlock(a, b *serviceconfig.Config, m string) bool {
	ma, _ := a.Lookup(m)
	mb, _ := b.Lookup(m)
	return ma.CircuitBreaker != nil && mb.CircuitBreaker != nil && sameBreaker(*ma.CircuitBreaker, *mb.CircuitBreaker)
}

// keyFull reports whether m's key counts bound rows among rows.
func (md *tableModel) keyFull(rows map[string]bool, m string) bool {
	return md.countIn(rows, md.key(m)) >= md.bound
}

// countIn counts the rows of methods counted under key.
func (md *tableModel) countIn(rows map[string]bool, key string) int {
	n := 0
	for m := range rows {
		if md.hasState(m) && !md.pinned(m) && md.key(m) == key {
			n++
		}
	}
	return n
}

// idleIn reports whether m's key has a counted row that is idle in the
// model: one the table may let go to make room.
func (md *tableModel) idleIn(rows map[string]bool, m string) bool {
	key := md.key(m)
	for mm := range rows {
		if md.hasState(mm) && !md.pinned(mm) && md.key(mm) == key && !md.methods[mm].live() {
			return true
		}
	}
	return false
}

// idleKept reports whether an update kept, counted under key, a row that
// was idle before it: then no live row of the key may have gone.
func (md *tableModel) idleKept(rows map[string]bool, key string, before map[string]modelMethod) bool {
	for mm := range rows {
		if md.hasState(mm) && !md.pinned(mm) && md.key(mm) == key && !before[mm].live() {
			return true
		}
	}
	return false
}

// checkTable checks T1 to T5 on c's table, and Statuses against the model.
func checkTable(t *testing.T, c *Client, md *tableModel, rows map[string]bool, fail func(string, ...any)) {
	t.Helper()
	st := c.state.Load()
	c.table.mu.Lock()
	breakers := map[*breaker.Breaker]string{}
	counted := map[string]int{}
	for m, r := range c.table.rows {
		if !md.hasState(m) {
			c.table.mu.Unlock()
			fail("T1: %s has a row and no state", m)
		}
		if b := r.g.breaker; b != nil {
			if other, ok := breakers[b]; ok {
				c.table.mu.Unlock()
				fail("T4: %s and %s share a breaker", m, other)
			}
			breakers[b] = m
		}
		if md.pinned(m) != (r.key == "") {
			c.table.mu.Unlock()
			fail("T3: %s pinned %v, counted under %q", m, md.pinned(m), r.key)
		}
		if r.key != "" {
			counted[r.key]++
		}
		v, ok := st.methods.Load(m)
		if !ok || v.(*methodPolicy).g.breaker != r.g.breaker || v.(*methodPolicy).g.bulkhead != r.g.bulkhead {
			c.table.mu.Unlock()
			fail("T4: the policy of %s does not hold its row's guards", m)
		}
	}
	c.table.mu.Unlock()
	for key, n := range counted {
		if n > md.bound {
			fail("T3: %d rows counted under %s, bound %d", n, key, md.bound)
		}
	}
	for _, m := range modelMethods {
		if md.hasState(m) && md.pinned(m) && !rows[m] {
			fail("T2: %s, pinned, has no row", m)
		}
	}
	want := map[string]BreakerState{}
	for m := range rows {
		if md.threshold(m) > 0 {
			s := md.methods[m]
			switch {
			case s.forced != BreakerClosed:
				want[m] = s.forced
			case s.open:
				want[m] = BreakerOpen
			default:
				want[m] = BreakerClosed
			}
		}
	}
	got := map[string]BreakerState{}
	for _, s := range c.Statuses() {
		if s.Breaker != nil {
			got[s.FullMethod] = s.Breaker.State
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		fail("Statuses' breakers %v, want %v", got, want)
	}
}

// TestMethodTableUnderConcurrentChurn runs, beside each other over real
// gRPC, calls of ever new names (each past the bound of 4 makes room for
// itself: T6b), calls through a generated stub's option, ForceOpen,
// ForceClosed and ResetBreaker of those names, Statuses, Status and config
// updates, for 2 seconds under the race detector; after it, the table
// holds its invariants (checkTable's T1 to T4 on the config in force) and
// nothing is held.
func TestMethodTableUnderConcurrentChurn(t *testing.T) {
	cfgs := []*serviceconfig.Config{mustParse(t, modelCfgs[0]), mustParse(t, modelCfgs[1]), mustParse(t, modelCfgs[4])}
	c := newTestClient(t, WithServiceConfig(cfgs[0]), WithRetryBudget(nil))
	c.table.bound = 4
	cc := anyMethodServer(t, c.DialOptions()...)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 6))
			for i := 0; ctx.Err() == nil; i++ {
				m := fmt.Sprintf("/m.S%d/N%d", 1+r.IntN(2), r.IntN(40))
				switch r.IntN(8) {
				case 0:
					_ = c.ForceOpen(m)
				case 1:
					_ = c.ForceClosed(m)
				case 2:
					_ = c.ResetBreaker(m)
				case 3:
					_ = c.Statuses()
					_ = c.Status(m)
				case 4:
					if g == 0 {
						_ = c.UpdateServiceConfig(cfgs[r.IntN(len(cfgs))])
					}
				default:
					var opts []grpc.CallOption
					if r.IntN(10) == 0 {
						opts = append(opts, grpc.StaticMethod())
					}
					msg := map[bool]string{true: "fail"}[r.IntN(4) == 0]
					_ = cc.Invoke(ctx, m, &echov1.EchoRequest{Message: msg}, &echov1.EchoResponse{}, opts...)
				}
			}
		})
	}
	wg.Wait()
	c.table.mu.Lock()
	counted := map[string]int{}
	breakers := map[*breaker.Breaker]string{}
	for m, r := range c.table.rows {
		if r.key != "" {
			counted[r.key]++
		}
		if b := r.g.breaker; b != nil {
			if other, ok := breakers[b]; ok {
				t.Errorf("%s and %s share a breaker", m, other)
			}
			breakers[b] = m
		}
	}
	c.table.mu.Unlock()
	for key, n := range counted {
		if n > c.table.bound {
			t.Errorf("%d rows counted under %s, bound %d", n, key, c.table.bound)
		}
	}
}
