package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/internal/adaptive"
	"github.com/grpc-resilience/resilience/internal/breaker"
	"github.com/grpc-resilience/resilience/internal/budget"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// explain writes to w what the client does for calls to fullMethod under
// the document data, and returns the number of warnings, and of those
// that change which methods a policy covers (only under -lenient), or
// Parse's error for an invalid document.
func explain(w io.Writer, data []byte, fullMethod string, opts options) (warnings, coverage int, err error) {
	d, err := load(data, opts)
	if err != nil {
		return 0, 0, err
	}
	p := &printer{w: w}
	r := d.resolve(fullMethod)
	service, _ := serviceconfig.SplitMethod(fullMethod)

	t := p.table()
	t.row("method", fullMethod)
	if !r.found {
		t.row("entry", "none: no methodConfig entry names the method, its service "+service+", or a default")
		t.flush()
		ws := append([]string{"nothing to explain: no entry applies, so calls to " + fullMethod +
			" get no timeout and are not retried under this document"}, d.parseWarnings()...)
		p.warnings(ws)
		return len(ws), d.coverage(), p.err
	}
	mc := r.mc
	switch r.level {
	case levelExact:
		t.row("entry", d.label(r.entry)+", which names the method")
	case levelService:
		t.row("entry", d.label(r.entry)+", which names its service "+r.name.Service+" (no entry names the method)")
	default:
		t.row("entry", d.label(r.entry)+", the default entry (no entry names the method or its service)")
	}
	for _, i := range r.shadowed {
		t.row("", "not merged with "+d.label(i)+", which also matches at a lower level: levels are never merged")
	}
	if mc.Timeout > 0 {
		t.row("timeout", mc.Timeout.String()+": one deadline over all attempts; a shorter caller deadline wins")
	} else {
		t.row("timeout", "none: only the caller's deadline bounds the call")
	}
	switch {
	case mc.WaitForReady == nil:
		t.row("waitForReady", "not set: the channel's default (fail fast)")
	case *mc.WaitForReady:
		t.row("waitForReady", "true: an attempt waits for a ready connection instead of failing with UNAVAILABLE")
	default:
		t.row("waitForReady", "false: an attempt fails fast with UNAVAILABLE when no connection is ready")
	}
	t.flush()

	a := analyze(mc, r.raw, opts, d.cap)
	switch {
	case a.retry != nil:
		explainRetry(p, a, d.cfg, mc.Timeout)
	case mc.HedgingPolicy != nil:
		explainHedging(p, mc.HedgingPolicy, d.cfg.RetryBudget, a, mc.Timeout)
	default:
		a.warnings = append(a.warnings, "nothing to explain: the entry has neither retryPolicy nor hedgingPolicy, so calls are not retried")
	}
	if mc.CircuitBreaker != nil {
		explainBreaker(p, mc.CircuitBreaker)
	}
	if mc.Bulkhead != nil {
		explainBulkhead(p, mc.Bulkhead)
	}
	if mc.RateLimit != nil {
		explainRateLimit(p, mc.RateLimit)
	}
	if (mc.CircuitBreaker != nil || mc.Bulkhead != nil || mc.RateLimit != nil) && slices.Contains(interceptor.DefaultExemptServices, service) {
		p.printf("\nnote: the client exempts %s from breakers, bulkheads and rate limits unless built with WithExemptMethods\n", service)
	}
	if ep, interval := endpointPolicy(d.cfg); ep != nil {
		lines, ws := endpointLines(ep, interval)
		p.printf("\n")
		for _, l := range lines {
			p.printf("%s\n", l)
		}
		a.warnings = append(a.warnings, ws...)
	}
	a.warnings = append(a.warnings, d.parseWarnings()...)
	p.warnings(a.warnings)
	return len(a.warnings), d.coverage(), p.err
}

// explainRetry writes the retry policy with its defaults, the client-wide
// retry limits and the schedule.
func explainRetry(p *printer, a analysis, cfg *serviceconfig.Config, timeout time.Duration) {
	v := a.retry
	p.printf("\nretryPolicy\n")
	t := p.table()
	maxAttempts := fmt.Sprintf("%d: the first call and up to %s", v.maxAttempts, plural(v.maxAttempts-1, "retry", "retries"))
	if v.asked > v.maxAttempts {
		maxAttempts += fmt.Sprintf(" (the document asks for %d; the cap is %d)", v.asked, v.maxAttempts)
	}
	t.row("  maxAttempts", def(maxAttempts, v.defMaxAttempts))
	t.row("  initialBackoff", def(v.b.Initial.String(), v.defInitial))
	t.row("  maxBackoff", def(v.b.Max.String(), v.defMax))
	mult := num(v.b.Multiplier)
	if v.jitter == serviceconfig.JitterDecorrelated {
		mult += ": not used by decorrelated jitter"
	}
	t.row("  backoffMultiplier", def(mult, v.defMultiplier))
	t.row("  jitter", def(string(v.jitter), v.defJitter)+": "+jitterFormula(v.jitter))
	if v.explicit {
		t.row("  retryableStatusCodes", codeList(v.codes)+": exactly these, for every method")
	} else {
		t.row("  retryableStatusCodes", "none listed (default): "+codeList(rescodes.DefaultRetryable)+
			"; DEADLINE_EXCEEDED when the attempt's own timeout fired; ABORTED for idempotent methods")
	}
	if v.perAttempt > 0 {
		t.row("  perAttemptRecvTimeout", v.perAttempt.String()+": each attempt's timeout, within the call's deadline")
	} else {
		t.row("  perAttemptRecvTimeout", "none (default): an attempt runs until the call's deadline")
	}
	t.flush()

	p.printf("\nretry limits (shared by every method of the client)\n")
	t = p.table()
	if b := cfg.RetryBudget; b != nil && b.Zero {
		t.row("  retryBudget", "ratio 0 and minRetriesPerSecond 0: a zero budget, the kill switch: "+
			"no call is retried, and no hedged copy is sent after the first")
	} else {
		if b != nil {
			ratio, perSec, ttl := budgetValues(b)
			t.row("  retryBudget", "ratio "+ratio+", minRetriesPerSecond "+perSec+", ttl "+ttl)
		} else {
			t.row("  retryBudget", fmt.Sprintf("ratio %s, minRetriesPerSecond %s, ttl %v",
				num(budget.DefaultRatio), num(budget.DefaultMinRetriesPerSecond), budget.DefaultTTL))
			t.row("", "the client's default: the document has no retryBudget (WithRetryBudget(nil) turns it off)")
		}
		t.row("", "a retry is sent while retries over the last ttl stay within ratio × requests + minRetriesPerSecond × ttl")
	}
	if th := cfg.RetryThrottling; th != nil {
		t.row("  retryThrottling", fmt.Sprintf("maxTokens %s, tokenRatio %s: retries stop while the tokens are at most %s; "+
			"each retryable failure takes 1, each success gives back %s",
			num(th.MaxTokens), num(th.TokenRatio), num(th.MaxTokens/2), num(th.TokenRatio)))
	} else {
		t.row("  retryThrottling", "none")
	}
	t.flush()

	p.printf("\nretry schedule\n")
	if b := cfg.RetryBudget; b != nil && b.Zero {
		p.printf("  WARNING: the zero retry budget sends none of the retries below: every call makes one attempt\n")
	}
	p.printf("  the delay before attempt k ≥ 2 is in [lo, hi], per the jitter, with\n")
	p.printf("  d = min(initialBackoff × backoffMultiplier^(k−2), maxBackoff)\n")
	p.printf("  %s\n", attemptTimeNote(a))
	writeSteps(p, a.steps, "attempt", "delay before it", timeout)
	if len(a.steps) < a.attempts {
		p.printf("  the schedule stops at attempt %d of %d\n", len(a.steps), a.attempts)
	}
	if len(a.steps) > 0 {
		var lo, hi time.Duration
		for _, s := range a.steps {
			lo, hi = addSat(lo, s.lo), addSat(hi, s.hi)
		}
		last := a.steps[len(a.steps)-1]
		p.printf("  delays in total: [%s, %s] over %s; worst case for the call: %s\n",
			fmtDur(lo), fmtDur(hi), plural(len(a.steps)-1, "retry", "retries"), fmtDur(last.end))
	}
	p.printf("  a server's grpc-retry-pushback-ms or RetryInfo replaces the delay (capped at %v by default) and restarts the backoff\n",
		interceptor.DefaultMaxServerPushback)
}

// explainHedging writes the hedging policy and its schedule.
func explainHedging(p *printer, h *serviceconfig.HedgingPolicy, b *serviceconfig.RetryBudget, a analysis, timeout time.Duration) {
	p.printf("\nhedgingPolicy\n")
	t := p.table()
	t.row("  maxAttempts", fmt.Sprintf("%d: the first call and up to %d hedged copies", h.MaxAttempts, h.MaxAttempts-1))
	adaptive := h.HedgingDelayQuantile > 0
	minSamples := h.HedgingDelayMinSamples
	if minSamples == 0 {
		minSamples = serviceconfig.DefaultHedgingDelayMinSamples
	}
	switch {
	case adaptive && h.HedgingDelay > 0:
		t.row("  hedgingDelay", fmt.Sprintf("%v: the wait before each further copy until %d attempts were observed", h.HedgingDelay, minSamples))
	case adaptive:
		t.row("  hedgingDelay", fmt.Sprintf("not set: until %d attempts were observed, further copies go out only after non-fatal failures", minSamples))
	case h.HedgingDelay > 0:
		t.row("  hedgingDelay", h.HedgingDelay.String()+": the wait before each further copy")
	default:
		t.row("  hedgingDelay", "0s (default): every copy is sent at once")
	}
	if adaptive {
		q := strconv.FormatFloat(h.HedgingDelayQuantile, 'g', -1, 64)
		t.row("  hedgingDelayQuantile", fmt.Sprintf("%s: then the wait is the method's observed attempt latency at this quantile "+
			"(over its last 256 to 512 attempts, rounded up by at most 12.5%%), so about %s%% of calls are hedged however the latency drifts "+
			"(up to twice that where a cluster of slow calls sits just past a gap in the latencies: the cluster is hedged whole)",
			q, strconv.FormatFloat(100*(1-h.HedgingDelayQuantile), 'g', 4, 64)))
		if h.HedgingDelayFloor > 0 {
			t.row("  hedgingDelayFloor", h.HedgingDelayFloor.String()+": the adaptive wait is never shorter")
		} else {
			t.row("  hedgingDelayFloor", "0s (default): no least wait")
		}
		if h.HedgingDelayMinSamples > 0 {
			t.row("  hedgingDelayMinSamples", fmt.Sprintf("%d: attempts observed before the adaptive wait applies", minSamples))
		} else {
			t.row("  hedgingDelayMinSamples", fmt.Sprintf("%d (default): attempts observed before the adaptive wait applies", minSamples))
		}
	}
	if len(h.NonFatalStatusCodes) == 0 {
		t.row("  nonFatalStatusCodes", "none (default): any failure ends the call")
	} else {
		t.row("  nonFatalStatusCodes", codeList(rescodes.Of(h.NonFatalStatusCodes...))+": hedging goes on after these; any other code ends the call")
	}
	t.flush()
	p.printf("note: the grpc-resilience client hedges unary calls only (a non-fatal failure sends the next copy at once); streams are called once\n")
	switch {
	case b != nil && b.Zero:
		p.printf("WARNING: the zero retry budget sends no copy after the first: calls are not hedged\n")
	default:
		if !adaptive {
			minSamples = serviceconfig.FixedHedgingDelayMinSamples
		}
		p.printf("what a hedge may spend: once %d attempts were observed, the wait is at least the latency that three quarters\n", minSamples)
		p.printf("  of the share of calls the retry budget pays for outlasts (ratio + minRetriesPerSecond ÷ the calls per second under\n")
		p.printf("  a retry or hedging policy; without a budget, no limit), so the budget's hedges go to the slowest calls, except\n")
		p.printf("  where that latency falls past a gap into a cluster of slow calls no bigger than twice the share: then the wait\n")
		p.printf("  is the gap's fast edge (at most 1.25× the latency twice the share outlasts), and the cluster is hedged whole;\n")
		p.printf("  each copy takes a budget token, and when more calls are slow than the budget pays for, the wait stays above\n")
		p.printf("  them: hedging cannot lower the p99\n")
	}
	p.printf("\nhedging schedule (gRFC A6)\n")
	switch {
	case adaptive && h.HedgingDelay > 0:
		p.printf("  copy k is sent at (k−1) × hedgingDelay unless a reply ended the call; this is the schedule until %d attempts were observed,\n", minSamples)
		p.printf("  then hedgingDelay is the observed latency at the quantile, which no schedule can show\n")
	case adaptive:
		p.printf("  until %d attempts were observed, only the first copy is sent on a schedule; then copy k is sent at\n", minSamples)
		p.printf("  (k−1) × the observed latency at the quantile, which no schedule can show\n")
	default:
		p.printf("  copy k is sent at (k−1) × hedgingDelay unless a reply ended the call\n")
	}
	p.printf("  %s\n", attemptTimeNote(a))
	writeSteps(p, a.steps, "copy", "wait before it", timeout)
	if len(a.steps) < a.attempts {
		p.printf("  the schedule stops at copy %d of %d\n", len(a.steps), a.attempts)
	}
}

// attemptTimeNote says how long the schedule takes an attempt to be.
func attemptTimeNote(a analysis) string {
	switch a.attemptFrom {
	case "-attempt-time":
		return "each attempt takes at most " + a.attemptTime.String() + " (-attempt-time)"
	case "perAttemptRecvTimeout":
		return "each attempt takes at most " + a.attemptTime.String() + " (perAttemptRecvTimeout; -attempt-time sets another)"
	}
	if a.retry == nil {
		return "attempt time 0 (no -attempt-time): the times count the delays alone"
	}
	return "attempt time 0: no perAttemptRecvTimeout and no -attempt-time, so the times count the delays alone"
}

// fmtDur writes a computed time for a reader: to the microsecond under a
// second, to the millisecond above (time.Duration's String otherwise).
func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		d = d.Round(time.Millisecond)
	case d >= time.Millisecond:
		d = d.Round(time.Microsecond)
	}
	return d.String()
}

// maxRows is the most schedule rows written in full; a longer schedule
// shows its first and last rows.
const (
	maxRows  = 24
	headRows = 20
)

// writeSteps writes a schedule as a table, marking the rows that end past
// timeout (when positive).
func writeSteps(p *printer, steps []step, what, delay string, timeout time.Duration) {
	t := p.table()
	t.row("  "+what, delay, "worst-case start", "worst-case end")
	for i, s := range steps {
		if len(steps) > maxRows && i >= headRows && i < len(steps)-(maxRows-headRows-1) {
			if i == headRows {
				t.row("  ...", "...", "...", "...")
			}
			continue
		}
		d := "-"
		if s.attempt > 1 {
			d = "[" + fmtDur(s.lo) + ", " + fmtDur(s.hi) + "]"
		}
		cells := []string{"  " + strconv.Itoa(s.attempt), d, fmtDur(s.start), fmtDur(s.end)}
		if timeout > 0 && s.end > timeout {
			cells = append(cells, "past the "+timeout.String()+" timeout")
		}
		t.row(cells...)
	}
	t.flush()
}

// jitterFormula says how a jitter draws a delay from d.
func jitterFormula(j serviceconfig.Jitter) string {
	switch j {
	case serviceconfig.JitterFull:
		return "a delay in [0, d]"
	case serviceconfig.JitterEqual:
		return "a delay in [d/2, d]"
	case serviceconfig.JitterDecorrelated:
		return "a delay in [initialBackoff, min(3 × the previous delay, maxBackoff)]; the previous delay is initialBackoff at first"
	case serviceconfig.JitterNone:
		return "a delay of d exactly"
	}
	return "a delay in [0.8 d, 1.2 d], gRFC A6's ±20%, which may pass maxBackoff by 20%"
}

// explainBreaker writes a circuitBreaker block with its defaults, as the
// client resolves them.
func explainBreaker(p *printer, cb *serviceconfig.CircuitBreaker) {
	if cb.Mode == serviceconfig.ModeAdaptive {
		explainAdaptive(p, cb)
		return
	}
	p.printf("\ncircuitBreaker (one per method)\n")
	t := p.table()
	consecutive, rate := cb.ConsecutiveFailures, cb.FailureRateThreshold
	both := consecutive == 0 && rate == 0
	if both {
		consecutive, rate = breaker.DefaultConsecutiveFailures, breaker.DefaultFailureRateThreshold
	}
	if consecutive > 0 {
		t.row("  consecutiveFailures", def(strconv.Itoa(consecutive), both)+": opens after that many failures in a row")
	} else {
		t.row("  consecutiveFailures", "off (failureRateThreshold is set)")
	}
	minCalls := cb.MinimumCalls
	if minCalls == 0 {
		minCalls = breaker.DefaultMinimumCalls
	}
	window := cb.Window
	if window == 0 {
		window = breaker.DefaultWindow
	}
	if rate > 0 {
		t.row("  failureRateThreshold", def(num(rate), both)+": opens when failures/calls over the window reach it")
	} else {
		t.row("  failureRateThreshold", "off (consecutiveFailures is set)")
	}
	if cb.SlowCallDuration > 0 {
		t.row("  slowCallDuration", cb.SlowCallDuration.String()+": a call above it is slow")
		if r := cb.SlowCallRateThreshold; r > 0 {
			t.row("  slowCallRateThreshold", num(r)+": opens when slow calls/calls over the window reach it")
		} else {
			t.row("  slowCallRateThreshold", "1 (default): opens when every call in the window is slow")
		}
	} else {
		t.row("  slowCallDuration", "off (default)")
	}
	t.row("  minimumCalls", def(strconv.Itoa(minCalls), cb.MinimumCalls == 0)+": calls in the window before a rate can open it")
	t.row("  window", def(window.String(), cb.Window == 0))
	open := cb.OpenDuration
	if open == 0 {
		open = breaker.DefaultOpenDuration
	}
	t.row("  openDuration", def(open.String(), cb.OpenDuration == 0)+": open time after a trip from closed")
	if cb.MaxOpenDuration > 0 {
		t.row("  maxOpenDuration", cb.MaxOpenDuration.String()+": the open time doubles on each failed probe, up to this")
	} else {
		t.row("  maxOpenDuration", "= openDuration (default): the open time does not grow")
	}
	probes := cb.HalfOpenProbes
	if probes == 0 {
		probes = breaker.DefaultHalfOpenProbes
	}
	t.row("  halfOpenProbes", def(strconv.Itoa(probes), cb.HalfOpenProbes == 0)+": probes let through half-open; that many successes close it")
	if len(cb.FailureStatusCodes) == 0 {
		t.row("  failureStatusCodes", "(default) "+codeList(rescodes.DefaultBreakerFailures))
	} else {
		t.row("  failureStatusCodes", codeList(rescodes.Of(cb.FailureStatusCodes...)))
	}
	t.flush()
	p.printf("the breaker sees every attempt; while it is open, attempts fail fast with UNAVAILABLE and are not retried\n")
}

// explainAdaptive writes a circuitBreaker block in mode "adaptive".
func explainAdaptive(p *printer, cb *serviceconfig.CircuitBreaker) {
	p.printf("\ncircuitBreaker, mode adaptive: client-side adaptive throttling (one per method)\n")
	t := p.table()
	k := cb.K
	if k == 0 {
		k = adaptive.DefaultK
	}
	window := cb.Window
	if window == 0 {
		window = adaptive.DefaultWindow
	}
	t.row("  k", def(num(k), cb.K == 0)+": the client sends about k times what the backend accepts")
	t.row("  window", def(window.String(), cb.Window == 0)+": requests and accepts are reported over it; without an answer, the probability halves every window/4")
	t.flush()
	p.printf("each attempt is rejected locally (UNAVAILABLE, not retried) with a probability p, at most 0.9,\n")
	p.printf("that each answer of the backend moves: up by 0.02/k for a RESOURCE_EXHAUSTED or UNAVAILABLE,\n")
	p.printf("down by 0.02*(1 - 1/k) for any other outcome; the client's own rejections and the caller's\n")
	p.printf("cancellations move nothing. With a backend that accepts a share a < 1/k of the offered load,\n")
	target := max(1-1/k, 0.05) // internal/adaptive's: the share of refusals p settles at
	up, down := 0.9/(0.02*(1-target)), 0.9/(0.02*target)
	p.printf("about k*a of it is sent; p reaches 0.9 within about %.0f refusals in an outage and falls back\n", up)
	p.printf("within about %.0f acceptances after it, whatever small error rate remains\n", down)
}

// explainBulkhead writes a bulkhead block with its defaults.
func explainBulkhead(p *printer, b *serviceconfig.Bulkhead) {
	p.printf("\nbulkhead (one per method)\n")
	t := p.table()
	t.row("  maxConcurrent", strconv.Itoa(b.MaxConcurrent)+": attempts in flight at once")
	switch {
	case b.MaxQueue == 0:
		t.row("  maxQueue", "0 (default): no attempt waits; a full bulkhead fails the attempt with RESOURCE_EXHAUSTED")
	default:
		t.row("  maxQueue", strconv.Itoa(b.MaxQueue)+": attempts that may wait for a slot")
		if b.MaxQueueWait > 0 {
			t.row("  maxQueueWait", b.MaxQueueWait.String()+": the longest wait, within the deadline")
		} else {
			t.row("  maxQueueWait", "none (default): a wait is bounded by the deadline alone")
		}
	}
	t.flush()
	p.printf("an attempt holds a slot only while it runs, not during backoff; a rejected attempt is not retried\n")
}

// explainRateLimit writes a client's rateLimit block with its defaults.
func explainRateLimit(p *printer, r *serviceconfig.ClientRateLimit) {
	p.printf("\nrateLimit (one per method)\n")
	t := p.table()
	if r.Rate > 0 {
		per := orSecond(r.Per)
		t.row("  rate", num(r.Rate)+" attempts per "+per.String()+": one every "+
			(time.Duration(float64(per)/r.Rate)).String()+", every attempt counted (retries and hedged copies too)")
		t.row("  burst", strconv.Itoa(r.Burst)+": attempts sent at once after a quiet period")
	} else {
		t.row("  rate", "none: the block only paces the method as the server says")
	}
	if r.MaxWait > 0 {
		t.row("  maxWait", r.MaxWait.String()+": the longest wait for a token or slot, and never past the deadline")
	} else {
		t.row("  maxWait", "0 (default): no attempt waits; one that cannot go at once fails locally")
	}
	t.flush()
	p.printf("after a RESOURCE_EXHAUSTED with RetryInfo or grpc-retry-pushback-ms, the method's attempts go one per\n")
	p.printf("that wait (capped by WithMaxServerPushback, 30s by default), each admitted attempt halving the spacing;\n")
	p.printf("a local refusal is RESOURCE_EXHAUSTED with a RetryInfo, never reaches the server and never counts as a failure\n")
}

// orSecond is d, or one second when d is 0 (a rate's default period).
func orSecond(d time.Duration) time.Duration {
	if d == 0 {
		return time.Second
	}
	return d
}

// budgetValues writes a retryBudget block's fields with their defaults, as
// the client resolves them.
func budgetValues(b *serviceconfig.RetryBudget) (ratio, perSecond, ttl string) {
	ratio = def(num(b.Ratio), false)
	if b.Ratio == 0 {
		ratio = def(num(budget.DefaultRatio), true)
	}
	perSecond = def(num(b.MinRetriesPerSecond), false)
	if b.MinRetriesPerSecond == 0 {
		perSecond = def(num(budget.DefaultMinRetriesPerSecond), true)
	}
	ttl = def(b.TTL.String(), false)
	if b.TTL == 0 {
		ttl = def(budget.DefaultTTL.String(), true)
	}
	return ratio, perSecond, ttl
}

// def appends " (default)" to s when isDefault.
func def(s string, isDefault bool) string {
	if !isDefault {
		return s
	}
	if i := strings.Index(s, ":"); i >= 0 {
		return s[:i] + " (default)" + s[i:]
	}
	return s + " (default)"
}

// num writes a float as briefly as it reads back: 2, 0.1, 1.5.
func num(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// printer writes to w and keeps the first error.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) Write(b []byte) (int, error) {
	if p.err != nil {
		return 0, p.err
	}
	n, err := p.w.Write(b)
	p.err = err
	return n, err
}

func (p *printer) printf(format string, args ...any) { fmt.Fprintf(p, format, args...) }

// warnings writes each warning on a line of its own, after a blank line.
func (p *printer) warnings(ws []string) {
	if len(ws) > 0 {
		p.printf("\n")
	}
	for _, w := range ws {
		p.printf("WARNING: %s\n", w)
	}
}

// table is a block of aligned columns.
type table struct{ tw *tabwriter.Writer }

func (p *printer) table() table { return table{tabwriter.NewWriter(p, 0, 0, 2, ' ', 0)} }

func (t table) row(cells ...string) { fmt.Fprintln(t.tw, strings.Join(cells, "\t")) }

func (t table) flush() { t.tw.Flush() }
