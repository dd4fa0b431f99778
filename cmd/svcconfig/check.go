package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/internal/budget"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// check validates data and writes "ok" and one line per methodConfig entry to
// w, with the entry's warnings under it, then the client-wide blocks. It
// returns the number of warnings, and of those that change which methods
// a policy covers (only under -lenient), or Parse's error for an invalid
// document.
func check(w io.Writer, data []byte, opts options) (warnings, coverage int, err error) {
	d, err := load(data, opts)
	if err != nil {
		return 0, 0, err
	}
	p := &printer{w: w}
	type line struct {
		text     string
		warnings []string
		note     string
	}
	var lines []line
	for i, mc := range d.cfg.MethodConfig {
		a := analyze(mc, d.uncapped.MethodConfig[i], opts, d.cap)
		lines = append(lines, line{d.label(i) + " " + summary(mc, a), a.warnings, hedgedStreamsNote(mc)})
		warnings += len(a.warnings)
	}
	if d.pos != nil { // put the skipped entries back in document order
		all := make([]line, d.entries)
		for i := range all {
			all[i].text = "methodConfig[" + strconv.Itoa(i) + "]: skipped: it has no name, so grpc ignores it"
		}
		for i, pos := range d.pos {
			all[pos] = lines[i]
		}
		lines = all
	}

	var epLines, epWarnings []string
	if ep, interval := endpointPolicy(d.cfg); ep != nil {
		epLines, epWarnings = endpointLines(ep, interval)
		warnings += len(epWarnings)
	}
	docWarnings := d.parseWarnings()
	warnings += len(docWarnings)
	if warnings == 0 {
		p.printf("ok\n")
	} else {
		p.printf("ok, with %s\n", plural(warnings, "warning", "warnings"))
	}
	for _, wn := range docWarnings {
		p.printf("WARNING: %s\n", wn)
	}
	if len(lines) == 0 {
		p.printf("no methodConfig entries: no method gets a policy\n")
	}
	for _, l := range lines {
		p.printf("%s\n", l.text)
		for _, wn := range l.warnings {
			p.printf("  WARNING: %s\n", wn)
		}
		if l.note != "" {
			p.printf("  note: %s\n", l.note)
		}
	}
	if t := d.cfg.RetryThrottling; t != nil {
		p.printf("retryThrottling: maxTokens %s, tokenRatio %s\n", num(t.MaxTokens), num(t.TokenRatio))
	}
	if b := d.cfg.RetryBudget; b != nil && b.Zero {
		p.printf("retryBudget: ratio 0 and minRetriesPerSecond 0: a zero budget, the kill switch: no call is retried, and no hedged copy is sent after the first\n")
	} else if b != nil {
		ratio, perSec, ttl := budgetValues(b)
		p.printf("retryBudget: ratio %s, minRetriesPerSecond %s, ttl %s\n", ratio, perSec, ttl)
	} else {
		p.printf("retryBudget: none in the document; the client's default applies (ratio %s, minRetriesPerSecond %s, ttl %v)\n",
			num(budget.DefaultRatio), num(budget.DefaultMinRetriesPerSecond), budget.DefaultTTL)
	}
	for _, l := range epLines {
		p.printf("%s\n", l)
	}
	for _, wn := range epWarnings {
		p.printf("  WARNING: %s\n", wn)
	}
	return warnings, d.coverage(), p.err
}

// summary describes an entry on one line: its names, then its settings.
func summary(mc serviceconfig.MethodConfig, a analysis) string {
	names := make([]string, len(mc.Name))
	for i, n := range mc.Name {
		names[i] = nameString(n)
	}
	var parts []string
	if mc.Timeout > 0 {
		parts = append(parts, "timeout "+mc.Timeout.String())
	} else {
		parts = append(parts, "no timeout")
	}
	if mc.WaitForReady != nil {
		parts = append(parts, "waitForReady "+strconv.FormatBool(*mc.WaitForReady))
	}
	switch {
	case a.retry != nil:
		v := a.retry
		s := fmt.Sprintf("retry maxAttempts %d", v.maxAttempts)
		if v.asked > v.maxAttempts {
			s += fmt.Sprintf(" (capped from %d)", v.asked)
		}
		s += fmt.Sprintf(" on %s, backoff %v to %v ×%s, jitter %s",
			retryCodes(v), v.b.Initial, v.b.Max, num(v.b.Multiplier), def(string(v.jitter), v.defJitter))
		if v.perAttempt > 0 {
			s += ", perAttemptRecvTimeout " + v.perAttempt.String()
		}
		parts = append(parts, s)
	case mc.HedgingPolicy != nil:
		h := mc.HedgingPolicy
		s := fmt.Sprintf("hedging maxAttempts %d, hedgingDelay %v", h.MaxAttempts, h.HedgingDelay)
		if h.HedgingDelayQuantile > 0 {
			s += fmt.Sprintf(", hedgingDelayQuantile %s", num(h.HedgingDelayQuantile))
			if h.HedgingDelayFloor > 0 {
				s += ", hedgingDelayFloor " + h.HedgingDelayFloor.String()
			}
			if h.HedgingDelayMinSamples > 0 {
				s += fmt.Sprintf(", hedgingDelayMinSamples %d", h.HedgingDelayMinSamples)
			}
		}
		if len(h.NonFatalStatusCodes) > 0 {
			s += ", nonFatalStatusCodes " + codeList(rescodes.Of(h.NonFatalStatusCodes...))
		}
		parts = append(parts, s)
	default:
		parts = append(parts, "no retry")
	}
	if b := mc.CircuitBreaker; b != nil && b.Mode == serviceconfig.ModeAdaptive {
		parts = append(parts, "circuitBreaker adaptive")
	} else if b != nil {
		parts = append(parts, "circuitBreaker")
	}
	if b := mc.Bulkhead; b != nil {
		parts = append(parts, fmt.Sprintf("bulkhead maxConcurrent %d, maxQueue %d", b.MaxConcurrent, b.MaxQueue))
	}
	if r := mc.RateLimit; r != nil {
		s := "rateLimit pacing only"
		if r.Rate > 0 {
			s = fmt.Sprintf("rateLimit %s per %v, burst %d", num(r.Rate), orSecond(r.Per), r.Burst)
		}
		parts = append(parts, s+", maxWait "+r.MaxWait.String())
	}
	if len(names) == 0 {
		return "(no names): " + strings.Join(parts, "; ")
	}
	return strings.Join(names, ", ") + ": " + strings.Join(parts, "; ")
}

// retryCodes names the codes a policy retries, briefly.
func retryCodes(v *retryView) string {
	if v.explicit {
		return codeList(v.codes)
	}
	return "the default codes"
}

// hedgedStreamsNote returns the note under an entry whose hedgingPolicy
// covers methods by a service's name or the default name: the client never
// hedges a stream, so a streaming method among them runs one attempt,
// without retries. svcconfig has no descriptors to tell which methods
// stream; the client names them when it loads the config. "" otherwise.
func hedgedStreamsNote(mc serviceconfig.MethodConfig) string {
	if mc.HedgingPolicy == nil {
		return ""
	}
	for _, n := range mc.Name {
		if n.Method != "" {
			continue
		}
		what := "the services it names"
		if n.Service == "" {
			what = "every method no other entry names"
		}
		return "its hedgingPolicy covers " + what + ", and a stream is never hedged: a streaming method among them runs one attempt, " +
			"without retries (svcconfig cannot tell which methods stream; the client logs them when it loads the config)"
	}
	return ""
}
