package overload

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Scenario names, for Suite's only.
const (
	ScenStep     = "step"
	ScenHostile  = "hostile"
	ScenFairness = "fairness"
	ScenThrottle = "throttle"
	ScenCost     = "cost"
	ScenRecovery = "recovery"
)

// Scenarios lists them in report order.
var Scenarios = []string{ScenStep, ScenCost, ScenHostile, ScenFairness, ScenThrottle, ScenRecovery}

// measure is one number of one run: a cell of a table.
type measure struct {
	table, row, col string
	v               float64
	format          func(float64) string
}

// Suite runs the scenarios named in only (all when empty) runs times,
// printing each run's numbers to progress as they come, and returns the
// tables of min/median/max over the runs, with the targets checked.
type Suite struct {
	Config Config
	Runs   int
	Only   []string
	// Progress, when set, receives a line per scenario and run.
	Progress io.Writer

	ms []measure
}

func pct(v float64) string  { return fmt.Sprintf("%.1f%%", 100*v) }
func x(v float64) string    { return fmt.Sprintf("%.2f×", v) }
func num(v float64) string  { return fmt.Sprintf("%.0f", v) }
func num2(v float64) string { return fmt.Sprintf("%.2f", v) }
func ms(v float64) string {
	if v < 0 {
		return "never"
	}
	return fmt.Sprintf("%.0fms", v)
}
func signed(v float64) string { return fmt.Sprintf("%+.0f%%", 100*v) }
func durMS(d time.Duration) float64 {
	if d < 0 {
		return -1
	}
	return float64(d) / float64(time.Millisecond)
}

func (s *Suite) add(table, row, col string, v float64, f func(float64) string) {
	s.ms = append(s.ms, measure{table, row, col, v, f})
}

func (s *Suite) logf(format string, args ...any) {
	if s.Progress != nil {
		fmt.Fprintf(s.Progress, format+"\n", args...)
	}
}

func (s *Suite) wants(name string) bool { return len(s.Only) == 0 || slices.Contains(s.Only, name) }

// Run runs the suite.
func (s *Suite) Run() error {
	cfg := s.Config.withDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	for run := 1; run <= max(s.Runs, 1); run++ {
		if s.wants(ScenStep) {
			if err := s.step(cfg, run); err != nil {
				return err
			}
		}
		if s.wants(ScenCost) {
			if err := s.cost(cfg, run); err != nil {
				return err
			}
		}
		if s.wants(ScenHostile) {
			if err := s.hostile(cfg, run); err != nil {
				return err
			}
		}
		if s.wants(ScenFairness) {
			if err := s.fairness(cfg, run); err != nil {
				return err
			}
		}
		if s.wants(ScenThrottle) {
			if err := s.throttle(run); err != nil {
				return err
			}
		}
		if s.wants(ScenRecovery) {
			if err := s.recovery(run); err != nil {
				return err
			}
		}
	}
	return nil
}

const (
	tStep    = "Step 0.5× → 3× → 0.5× (server)"
	tHostile = "Hostile callers beside honest CRITICAL ones (grpc-resilience)"
	tCost    = "A cheap method at 1% of the calls beside the expensive one, under one server-wide limit"
	tFair    = "Fairness: tenant A at 10× its share, tenant B at half (grpc-resilience)"
	tIso     = "Adaptive throttling: isolation (64 callers on a 500ms method, fast method beside it, fresh client)"
	tOutage  = "Adaptive throttling: 1.5s outage, then healthy (200 calls/s, default K 2 and window 60s)"
	tQuota   = "Adaptive throttling: backend accepting 30% of the load (K 2, window 10s, 100 calls/s)"
	tRecover = "Throttling through an outage and 1.5s after it (fresh client, 2,000 calls/s open loop, 1s deadlines)"
)

// recoveryRow names a row of tRecover.
func recoveryRow(contender string, outage time.Duration, failing float64) string {
	return fmt.Sprintf("%s, outage %v, %.0f%% refused after", contender, outage, 100*failing)
}

// Columns of tRecover.
const (
	colRecovered = "10 successes in a row after the outage"
	colAdmitted  = "calls after the outage admitted (not rejected locally)"
	colSucceeded = "calls after the outage that succeed"
	colTimedOut  = "calls after the outage past their deadline (a busy machine)"
	colInOutage  = "attempts reaching the backend in the outage"
)

func (s *Suite) recovery(run int) error {
	for _, c := range RecoveryContenders {
		for _, o := range RecoveryOutages {
			for _, f := range []float64{0, 0.01} {
				r, err := RunRecovery(c, o, f)
				if err != nil {
					return err
				}
				row := recoveryRow(c, o, f)
				s.add(tRecover, row, colRecovered, durMS(r.Recovered), ms)
				s.add(tRecover, row, colAdmitted, 1-r.RejectedAfter, pct)
				s.add(tRecover, row, colSucceeded, r.Succeeded, pct)
				s.add(tRecover, row, colTimedOut, r.TimedOutAfter, pct)
				s.add(tRecover, row, colInOutage, float64(r.AttemptsInOutage), num)
				s.logf("run %d recovery %v", run, r)
			}
		}
	}
	return nil
}

// recoveryBefore is the median, over three runs, of the attempts that
// reached the backend in the outage through the adaptive mode before
// issue 32 (commit 6257047, the SRE book's formula), per outage.
var recoveryBefore = map[time.Duration]float64{time.Second: 212, 1250 * time.Millisecond: 255, 1500 * time.Millisecond: 315}

func (s *Suite) step(cfg Config, run int) error {
	rep, err := Run(cfg)
	if err != nil {
		return err
	}
	for _, r := range rep.Results {
		row := r.Name
		if r.Retrying {
			row += ", our client retrying"
		} else {
			row += ", no retries"
		}
		s.add(tStep, row, "goodput (of capacity)", r.Goodput, pct)
		s.add(tStep, row, "goodput (of the capacity delivered)", r.Goodput*float64(r.MeanHold)/float64(cfg.Service), pct)
		s.add(tStep, row, "admitted p99 / unloaded p99", ratio(r.AdmittedP99, r.UnloadedP99), x)
		s.add(tStep, row, "unloaded p99", durMS(r.UnloadedP99), ms)
		s.add(tStep, row, "in the server: admitted p99 / unloaded p99", ratio(r.ServerAdmittedP99, r.ServerUnloadedP99), x)
		s.add(tStep, row, "attempts/call", r.AttemptsPerCall(), num2)
		s.add(tStep, row, "tokens busy (overload)", r.Utilization, pct)
		s.add(tStep, row, "answered late (of capacity)", r.Late, pct)
		s.add(tStep, row, "service time as delivered", float64(r.MeanHold)/float64(time.Millisecond), func(v float64) string { return fmt.Sprintf("%.2fms", v) })
		if r.LimitBefore > 0 {
			s.add(tStep, row, "limit before overload", r.LimitBefore, num)
			s.add(tStep, row, "limit in overload", r.LimitOverload, num)
			s.add(tStep, row, "limit back within 10% after step down", durMS(r.LimitBack), ms)
		}
		s.logf("run %d step %s: goodput %s (tokens busy %s, late %s, service as delivered %v), p99 %v (%s of %v; in the server %s), limit %.0f → %.0f, back after %s, %.2f attempts/call",
			run, row, pct(r.Goodput), pct(r.Utilization), pct(r.Late), r.MeanHold.Round(10*time.Microsecond), r.AdmittedP99.Round(time.Millisecond), x(ratio(r.AdmittedP99, r.UnloadedP99)),
			r.UnloadedP99.Round(time.Millisecond), x(ratio(r.ServerAdmittedP99, r.ServerUnloadedP99)), r.LimitBefore, r.LimitOverload,
			ms(durMS(r.LimitBack)), r.AttemptsPerCall())
		s.logf("run %d step %s: codes %v", run, row, r.Codes)
	}
	return nil
}

func (s *Suite) cost(cfg Config, run int) error {
	for _, load := range CostLoads {
		for _, name := range []string{Failsafe, Ours} {
			r, err := RunCost(cfg, name, load)
			if err != nil {
				return err
			}
			row := fmt.Sprintf("%s, %.1f× the capacity", name, load)
			s.add(tCost, row, "expensive calls shed", r.Shed, pct)
			s.add(tCost, row, "goodput (of capacity)", r.Goodput, pct)
			s.logf("run %d cost %v", run, r)
		}
	}
	return nil
}

func (s *Suite) hostile(cfg Config, run int) error {
	for _, kind := range HostileKinds {
		r, err := RunHostile(cfg, kind)
		if err != nil {
			return err
		}
		s.add(tHostile, kind, "honest CRITICAL success", r.HonestSuccess, pct)
		s.add(tHostile, kind, "limit", r.Limit, num)
		s.add(tHostile, kind, "limit, honest callers alone", r.Alone, num)
		s.add(tHostile, kind, "drift from alone", r.Drift(), signed)
		if r.AllHonest > 0 {
			s.add(tHostile, kind, "limit, the same load all honest", r.AllHonest, num)
			s.add(tHostile, kind, "drift from the same load, all honest", r.Limit/r.AllHonest-1, signed)
		}
		s.logf("run %d hostile %v", run, r)
	}
	return nil
}

func (s *Suite) fairness(cfg Config, run int) error {
	for _, fair := range []bool{true, false} {
		r, err := RunFairness(cfg, fair)
		if err != nil {
			return err
		}
		row := "tenantFairness"
		if !fair {
			row = "no fairness (one tenant)"
		}
		s.add(tFair, row, "B success", r.BSuccess, pct)
		s.add(tFair, row, "B p99 / B idle p99", ratio(r.BP99, r.BIdleP99), x)
		s.add(tFair, row, "B idle p99", durMS(r.BIdleP99), ms)
		s.add(tFair, row, "A goodput (of capacity)", r.AGoodput, pct)
		s.logf("run %d fairness %s: B %s, p99 %v (idle %v), A %s", run, row, pct(r.BSuccess), r.BP99.Round(time.Millisecond),
			r.BIdleP99.Round(time.Millisecond), pct(r.AGoodput))
	}
	return nil
}

func (s *Suite) throttle(run int) error {
	for _, c := range []struct{ adaptive, bulkhead bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		r, err := RunIsolation(c.adaptive, c.bulkhead)
		if err != nil {
			return err
		}
		row := "no adaptive throttling"
		if c.adaptive {
			row = "adaptive throttling"
		}
		if c.bulkhead {
			row += ", slow bulkhead 48 < 64 streams"
		} else {
			row += ", no bulkhead"
		}
		s.add(tIso, row, "fast p99 / idle p99", ratio(r.LoadedP99, r.IdleP99), x)
		s.add(tIso, row, "fast p99", durMS(r.LoadedP99), ms)
		s.add(tIso, row, "fast calls failed", float64(r.FastFailed), num)
		s.add(tIso, row, "slow calls rejected locally", float64(r.Throttled), num)
		s.logf("run %d isolation %s: fast p99 %v (idle %v), %d failed, %d throttled", run, row, r.LoadedP99.Round(time.Millisecond),
			r.IdleP99.Round(time.Millisecond), r.FastFailed, r.Throttled)
	}
	for _, fresh := range []bool{true, false} {
		o, err := RunOutage(fresh)
		if err != nil {
			return err
		}
		row := "outage first, to a fresh client"
		if !fresh {
			row = "outage after 1.5s healthy"
		}
		s.add(tOutage, row, "back to ≥ 90% after recovery", durMS(o.Recovered), ms)
		s.add(tOutage, row, "share of calls sent in the outage", o.SentInOutage, pct)
		s.logf("run %d outage (%s): back after %s, %s sent in the outage", run, row, ms(durMS(o.Recovered)), pct(o.SentInOutage))
	}
	q, err := RunQuota()
	if err != nil {
		return err
	}
	s.add(tQuota, "adaptive throttling", "sent (of offered)", q.Sent, pct)
	s.add(tQuota, "adaptive throttling", "accepted (of offered)", q.Accepted, pct)
	s.add(tQuota, "adaptive throttling", "sent / (K·accepted)", q.Sent/(q.K*q.Accepted), x)
	s.logf("run %d quota: sent %s, accepted %s, sent/(K·accepted) %s", run, pct(q.Sent), pct(q.Accepted), x(q.Sent/(q.K*q.Accepted)))
	return nil
}

// cell is the min/median/max of one cell over the runs.
type cell struct {
	v      []float64
	format func(float64) string
}

func (c cell) String() string {
	v := slices.Clone(c.v)
	slices.Sort(v)
	if len(v) == 1 {
		return c.format(v[0])
	}
	return fmt.Sprintf("%s (%s–%s)", c.format(v[len(v)/2]), c.format(v[0]), c.format(v[len(v)-1]))
}

func (c cell) median() float64 {
	v := slices.Clone(c.v)
	slices.Sort(v)
	return v[len(v)/2]
}

// tables groups the measures by table, row and column, in the order seen.
func (s *Suite) tables() (order []string, rows map[string][]string, cols map[string][]string, cells map[[3]string]*cell) {
	rows, cols, cells = map[string][]string{}, map[string][]string{}, map[[3]string]*cell{}
	for _, m := range s.ms {
		if _, ok := rows[m.table]; !ok {
			order = append(order, m.table)
		}
		if !slices.Contains(rows[m.table], m.row) {
			rows[m.table] = append(rows[m.table], m.row)
		}
		if !slices.Contains(cols[m.table], m.col) {
			cols[m.table] = append(cols[m.table], m.col)
		}
		k := [3]string{m.table, m.row, m.col}
		if cells[k] == nil {
			cells[k] = &cell{format: m.format}
		}
		cells[k].v = append(cells[k].v, m.v)
	}
	return order, rows, cols, cells
}

// Markdown renders the tables: each cell is the median over the runs, with
// the min and max in parentheses.
func (s *Suite) Markdown() string {
	c := s.Config.withDefaults()
	var b strings.Builder
	fmt.Fprintf(&b, "Real time, loopback TCP, open loop, %d run(s); each cell: median (min–max). Server: %d tokens × %v (capacity %.0f calls/s), calls with a %v deadline.\n",
		max(s.Runs, 1), c.Tokens, c.Service, c.capacity(), c.Deadline)
	order, rows, cols, cells := s.tables()
	for _, t := range order {
		fmt.Fprintf(&b, "\n### %s\n\n| |", t)
		for _, col := range cols[t] {
			fmt.Fprintf(&b, " %s |", col)
		}
		b.WriteString("\n|---|" + strings.Repeat("---|", len(cols[t])) + "\n")
		for _, row := range rows[t] {
			fmt.Fprintf(&b, "| %s |", row)
			for _, col := range cols[t] {
				if c := cells[[3]string{t, row, col}]; c != nil {
					fmt.Fprintf(&b, " %s |", c)
				} else {
					b.WriteString(" — |")
				}
			}
			b.WriteString("\n")
		}
	}
	b.WriteString(s.targets(cells))
	return b.String()
}

// target is one of the targets: a cell's every run (all) or
// median within [lo, hi].
type target struct {
	goal            string
	table, row, col string
	lo, hi          float64
	all             bool // every run, not the median
}

var targets = []target{
	{"ours ≥ 95% goodput at 3×, every run", tStep, Ours + ", no retries", "goodput (of capacity)", 0.95, 10, true},
	{"ours admitted p99 ≤ 2× unloaded, every run", tStep, Ours + ", no retries", "admitted p99 / unloaded p99", 0, 2, true},
	{"ours ≥ 95% of the capacity the machine delivered at 3×, every run", tStep, Ours + ", no retries", "goodput (of the capacity delivered)", 0.95, 10, true},
	{"ours ≥ 95% goodput with our client retrying, every run", tStep, Ours + ", our client retrying", "goodput (of capacity)", 0.95, 10, true},
	{"ours p99 ≤ 2× with our client retrying (in the server: per attempt), every run", tStep, Ours + ", our client retrying", "in the server: admitted p99 / unloaded p99", 0, 2, true},
	{"limit back within 10% within 2s of the step down, every run", tStep, Ours + ", no retries", "limit back within 10% after step down", 0, 2000, true},
	{"limit back within 10% within 2s, our client retrying", tStep, Ours + ", our client retrying", "limit back within 10% after step down", 0, 2000, true},
	{"cheap method at 1%: ours sheds ≤ 5% of the expensive calls at 0.5×", tCost, Ours + ", 0.5× the capacity", "expensive calls shed", 0, 0.05, true},
	{"cheap method at 1%: ours sheds ≤ 5% of the expensive calls at 0.9×", tCost, Ours + ", 0.9× the capacity", "expensive calls shed", 0, 0.05, true},
	{"cheap method at 1%: ours ≥ 95% goodput at 3×", tCost, Ours + ", 3.0× the capacity", "goodput (of capacity)", 0.95, 10, true},
	{"fast failures: honest ≥ 99%", tHostile, FastFailures, "honest CRITICAL success", 0.99, 1, true},
	{"fast failures: limit within 20%", tHostile, FastFailures, "drift from alone", -0.2, 0.2, true},
	{"short deadlines: honest ≥ 99%", tHostile, ShortDeadline, "honest CRITICAL success", 0.99, 1, true},
	{"short deadlines: limit within 20% of the same load all honest", tHostile, ShortDeadline, "drift from the same load, all honest", -0.2, 0.2, true},
	{"SHEDDABLE flood: honest ≥ 99%", tHostile, SheddableFlood, "honest CRITICAL success", 0.99, 1, true},
	{"fairness: B ≥ 99%", tFair, "tenantFairness", "B success", 0.99, 1, true},
	{"fairness: B p99 ≤ 1.5× idle", tFair, "tenantFairness", "B p99 / B idle p99", 0, 1.5, true},
	{"isolation, bulkhead: fast p99 ≤ 1.5× idle", tIso, "adaptive throttling, slow bulkhead 48 < 64 streams", "fast p99 / idle p99", 0, 1.5, true},
	{"outage first, fresh client: ≥ 90% within 3s of recovery", tOutage, "outage first, to a fresh client", "back to ≥ 90% after recovery", 0, 3000, true},
	{"outage after 1.5s healthy: ≥ 90% within 3s of recovery", tOutage, "outage after 1.5s healthy", "back to ≥ 90% after recovery", 0, 3000, true},
	{"30% backend: sent ≈ K·accepted ±20%", tQuota, "adaptive throttling", "sent / (K·accepted)", 0.8, 1.2, true},
}

func init() {
	for _, o := range RecoveryOutages {
		for _, f := range []float64{0, 0.01} {
			row := recoveryRow(RecAdaptive, o, f)
			what := fmt.Sprintf("adaptive, outage %v, %.0f%% refused after (issue 32): ", o, 100*f)
			targets = append(targets,
				target{what + "10 in a row within 0.6s", tRecover, row, colRecovered, 0, 600, true},
				target{what + "≥ 80% of the calls after admitted", tRecover, row, colAdmitted, 0.8, 1, true},
				target{what + fmt.Sprintf("attempts in the outage ≤ 2× before (%.0f)", recoveryBefore[o]), tRecover, row, colInOutage, 0, 2 * recoveryBefore[o], true})
		}
	}
}

// targets checks the targets against the cells present.
func (s *Suite) targets(cells map[[3]string]*cell) string {
	var b strings.Builder
	b.WriteString("\n### Targets of issues 19, 32 and 33\n\n| target | runs meeting it | result |\n|---|---|---|\n")
	for _, t := range targets {
		c := cells[[3]string{t.table, t.row, t.col}]
		if c == nil {
			continue
		}
		n := 0
		for _, v := range c.v {
			// -1 stands for "never" in the time columns, which start at 0.
			if v >= t.lo && v <= t.hi {
				n++
			}
		}
		res := "met"
		if n < len(c.v) {
			res = "NOT met"
		}
		fmt.Fprintf(&b, "| %s | %d of %d | %s |\n", t.goal, n, len(c.v), res)
	}
	s.compare(&b, cells)
	return b.String()
}

// compare checks ours against failsafe-go's median on goodput and p99.
func (s *Suite) compare(b *strings.Builder, cells map[[3]string]*cell) {
	for _, client := range []string{", no retries", ", our client retrying"} {
		for _, col := range []string{"goodput (of capacity)", "admitted p99 / unloaded p99", "in the server: admitted p99 / unloaded p99"} {
			o, f := cells[[3]string{tStep, Ours + client, col}], cells[[3]string{tStep, Failsafe + client, col}]
			if o == nil || f == nil {
				continue
			}
			better := o.median() >= f.median()
			if strings.Contains(col, "p99") {
				better = o.median() <= f.median()
			}
			res := "met"
			if !better {
				res = "NOT met"
			}
			fmt.Fprintf(b, "| ours%s %s vs failsafe-go's median: %s vs %s | — | %s |\n", client, col, o.format(o.median()), f.format(f.median()), res)
		}
	}
}
