package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
)

// clock formats a time of the view as a wall-clock time, in the local
// zone; "-" for none.
func clock(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().Local().Format("15:04:05.000")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// table writes rows of cells separated by tabs, aligned.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

// oneCell keeps a cell on one line, in one column.
var oneCell = strings.NewReplacer("\t", " ", "\n", " ")

func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = oneCell.Replace(c)
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// printView prints the view as tables: refusing now, the clients, the
// servers, the channels, then the latest events.
func printView(w io.Writer, v *adminv1.View, events []*adminv1.Event) error {
	fmt.Fprintf(w, "view at %s; write actions %s\n\n", clock(v.GetTime()), map[bool]string{true: "on", false: "off"}[v.GetWritesAllowed()])
	if len(v.GetRefusing()) == 0 {
		fmt.Fprintln(w, "REFUSING NOW: nothing")
	} else {
		fmt.Fprintln(w, "REFUSING NOW")
		t := newTable(w, "SIDE", "SOURCE", "PART", "SUBJECT", "SINCE", "WHY")
		for _, r := range v.GetRefusing() {
			t.row(r.GetSide(), r.GetSource(), r.GetPart().Label(), r.GetSubject(), clock(r.GetSince()), r.GetCause())
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	for _, c := range v.GetClients() {
		printClient(w, c)
	}
	for _, s := range v.GetServers() {
		printServer(w, s)
	}
	for _, ch := range v.GetChannels() {
		printChannel(w, ch)
	}
	fmt.Fprintln(w)
	return printEvents(w, events, 0)
}

func printClient(w io.Writer, c *adminv1.Client) {
	budget, throttling := "off", "off"
	if b := c.GetRetryBudget(); b != nil {
		budget = fmt.Sprintf("%.1f retries available", b.GetAvailable())
	}
	if th := c.GetRetryThrottling(); th != nil {
		throttling = fmt.Sprintf("%.1f of %.0f tokens", th.GetTokens(), th.GetMaxTokens())
	}
	fmt.Fprintf(w, "\nCLIENT %s (retry budget: %s; retry throttling: %s)\n", c.GetName(), budget, throttling)
	if len(c.GetMethods()) == 0 {
		fmt.Fprintln(w, "no method with a guard has been configured or called, and none failed")
		return
	}
	t := newTable(w, "METHOD", "BREAKER", "WINDOW", "ADAPTIVE", "BULKHEAD", "RATE LIMIT", "HEDGING", "LAST FAILURE", "POLICY FROM")
	for _, m := range c.GetMethods() {
		br, win, ad, bh, rl, hd, last, pol := "-", "-", "-", "-", "-", "-", "-", "-"
		if b := m.GetBreaker(); b != nil {
			br = b.GetState().Label()
			if b.GetOpenUntil() != nil {
				br += " until " + clock(b.GetOpenUntil())
			}
			br += fmt.Sprintf(" (%d trips)", b.GetTrips())
			win = fmt.Sprintf("%d/%d failed, %d in a row", b.GetFailures(), b.GetCalls(), b.GetConsecutiveFailures())
		}
		if a := m.GetAdaptive(); a != nil {
			ad = fmt.Sprintf("rejects %.0f%%", 100*a.GetRejectProbability())
		}
		if b := m.GetBulkhead(); b != nil {
			bh = fmt.Sprintf("%d in flight, %d queued", b.GetInFlight(), b.GetQueued())
		}
		if r := m.GetRateLimit(); r != nil {
			rl = fmt.Sprintf("%d waiting", r.GetWaiting())
			if r.GetPacedUntil() != nil {
				rl = fmt.Sprintf("paced 1 per %v until %s, %d waiting", r.GetPeriod().AsDuration(), clock(r.GetPacedUntil()), r.GetWaiting())
			}
		}
		if d := m.GetHedgingDelay(); d != nil {
			hd = measured(d.AsDuration())
		}
		if fs := m.GetRecentFailures(); len(fs) > 0 {
			f := fs[len(fs)-1]
			last = clock(f.GetTime()) + " " + f.GetCode() + " " + strconv.Quote(f.GetMessage())
		}
		if p := m.GetPolicySource(); p != "" {
			pol = p
		}
		t.row(m.GetFullMethod(), br, win, ad, bh, rl, hd, last, pol)
	}
	_ = t.flush()
}

// printRateLimits prints a Server's rate limits, when it has any.
func printRateLimits(w io.Writer, rls []*adminv1.RateLimit) {
	if len(rls) == 0 {
		return
	}
	t := newTable(w, "RATE LIMIT", "WHERE", "KEY", "RATE", "BURST", "KEYS", "OVERFLOWED")
	for _, r := range rls {
		keys, over := strconv.FormatInt(r.GetKeys(), 10), strconv.FormatUint(r.GetOverflowed(), 10)
		if r.GetDistributed() {
			keys, over = "(distributed)", "-"
		}
		t.row(r.GetName(), r.GetPath(), r.GetKey(), strconv.FormatFloat(r.GetRate(), 'g', -1, 64)+" per "+r.GetPer().AsDuration().String(),
			strconv.FormatInt(r.GetBurst(), 10), keys, over)
	}
	_ = t.flush()
}

func printServer(w io.Writer, s *adminv1.Server) {
	fmt.Fprintf(w, "\nSERVER %s\n", s.GetName())
	if st := s.GetStore(); st != nil {
		health := "healthy"
		if !st.GetHealthy() {
			health = "FAILING"
		}
		fmt.Fprintf(w, "idempotency store%s: %s", parens(st.GetDescription()), health)
		if st.GetFailures() > 0 {
			fmt.Fprintf(w, "; %d failures, the latest at %s: %q", st.GetFailures(), clock(st.GetLastFailureTime()), st.GetLastFailure())
		}
		fmt.Fprintln(w)
	}
	printRateLimits(w, s.GetRateLimits())
	if len(s.GetLimits()) == 0 {
		fmt.Fprintln(w, "no concurrency limit")
		return
	}
	t := newTable(w, "LIMIT", "LIMIT", "IN FLIGHT", "QUEUED", "BASE RTT", "SMOOTHED RTT", "TENANTS", "ADMITTED", "SHED")
	for _, l := range s.GetLimits() {
		var admitted, shed uint64
		for _, c := range l.GetByCriticality() {
			admitted += c.GetAdmitted()
			shed += c.GetShedLimit() + c.GetShedDeadline()
		}
		t.row(l.GetName(), strconv.FormatInt(l.GetLimit(), 10), strconv.FormatInt(l.GetInFlight(), 10), strconv.FormatInt(l.GetQueued(), 10),
			measured(l.GetBaseRtt().AsDuration()), measured(l.GetSmoothedRtt().AsDuration()), strconv.FormatInt(l.GetTenants(), 10),
			strconv.FormatUint(admitted, 10), strconv.FormatUint(shed, 10))
	}
	_ = t.flush()
	for _, l := range s.GetLimits() {
		if ts := l.GetBusiestTenants(); len(ts) > 0 {
			fmt.Fprintf(w, "busiest tenants of %s:", l.GetName())
			for _, tl := range ts {
				name := tl.GetTenant()
				if name == "" {
					name = "(none)"
				}
				fmt.Fprintf(w, " %s %d in flight", name, tl.GetInFlight())
				if q := tl.GetQueued(); q > 0 {
					fmt.Fprintf(w, ", %d queued", q)
				}
				fmt.Fprint(w, ";")
			}
			fmt.Fprintln(w)
		}
	}
}

func parens(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

func printChannel(w io.Writer, ch *adminv1.Channel) {
	idle := ""
	if ch.GetIdle() {
		idle = ", idle"
	}
	child := ch.GetChildPolicy()
	if ch.GetEndpointConcurrency() > 0 { // peak_ewma's settings in effect
		child += fmt.Sprintf(" decayTime %v endpointConcurrency %d", ch.GetDecayTime().AsDuration(), ch.GetEndpointConcurrency())
	}
	fmt.Fprintf(w, "\nCHANNEL %s (resilience_endpoint, %s%s): %d ejections, %d returns, %d refused by maxEjectionPercent, %d attempts sent elsewhere\n",
		ch.GetTarget(), child, idle, ch.GetEjections(), ch.GetReturns(), ch.GetOverflow(), ch.GetAttemptsAvoided())
	t := newTable(w, "ENDPOINT", "CONNECTIVITY", "STATE", "FAILURES", "LOAD", "WHY")
	for _, e := range ch.GetEndpoints() {
		state := "in rotation"
		if e.GetProbation() {
			state += ", on probation"
		}
		if e.GetEjectedUntil() != nil {
			state = "EJECTED until " + clock(e.GetEjectedUntil())
			if e.GetEjectedSince() != nil {
				state = "EJECTED " + clock(e.GetEjectedSince()) + "-" + clock(e.GetEjectedUntil())
			}
		}
		t.row(strings.Join(e.GetAddresses(), ","), e.GetConnectivity(), state,
			fmt.Sprintf("%d in a row, %d/%d in the window", e.GetConsecutiveFailures(), e.GetFailures(), e.GetCalls()), endpointLoad(e),
			dash(e.GetCause()))
	}
	_ = t.flush()
}

// endpointLoad is an endpoint's attempts in flight and, under peak_ewma,
// its latency estimate.
func endpointLoad(e *adminv1.Endpoint) string {
	load := strconv.FormatInt(e.GetOutstanding(), 10) + " in flight"
	if e.GetLatency() != nil {
		load += ", latency " + measured(e.GetLatency().AsDuration())
	}
	return load
}

// measured prints a measured duration (an estimate, an average, an adaptive
// delay) to four significant digits at most: 6.123ms, not 6.123456ms,
// whose last digits are noise that only widens a column. Settings print
// as they were set.
func measured(d time.Duration) string {
	unit := time.Duration(1)
	for top := max(d, -d) / 10000; unit <= top; unit *= 10 {
	}
	return d.Round(unit).String()
}

func printEvents(w io.Writer, events []*adminv1.Event, dropped uint64) error {
	if len(events) == 0 {
		fmt.Fprintln(w, "EVENTS: none")
		return nil
	}
	fmt.Fprintln(w, "EVENTS (oldest first)")
	t := newTable(w, "#", "TIME", "SIDE", "SOURCE", "PART", "SUBJECT", "EVENT", "COUNT", "LATEST", "WHY")
	for _, e := range events {
		t.row(strconv.FormatUint(e.GetSequence(), 10), clock(e.GetTime()), e.GetSide(), e.GetSource(), e.GetPart().Label(),
			e.GetSubject(), eventWhat(e), strconv.FormatUint(e.GetCount(), 10), clock(e.GetLastTime()), e.GetCause())
	}
	if err := t.flush(); err != nil {
		return err
	}
	if dropped > 0 {
		fmt.Fprintf(w, "(%d older events were let go by the bounded log)\n", dropped)
	}
	return nil
}

// eventWhat is what happened, with a breaker's states.
func eventWhat(e *adminv1.Event) string {
	what := e.GetKind().Label()
	switch {
	case e.GetFrom() != "":
		what += " " + e.GetFrom() + " → " + e.GetTo()
	case e.GetTo() != "":
		what += " " + e.GetTo()
	case e.GetReason() != "":
		what += " " + e.GetReason()
	}
	return what
}

// eventLine is one event as watch prints it: when, which part of which
// source, what happened, how many times, and why.
func eventLine(e *adminv1.Event) string {
	count := ""
	if e.GetCount() > 1 {
		count = fmt.Sprintf(" ×%d (latest %s)", e.GetCount(), clock(e.GetLastTime()))
	}
	return fmt.Sprintf("%s #%d %s/%s %s %s: %s%s: %s", clock(e.GetTime()), e.GetSequence(), e.GetSide(), e.GetSource(),
		e.GetPart().Label(), e.GetSubject(), eventWhat(e), count, e.GetCause())
}
