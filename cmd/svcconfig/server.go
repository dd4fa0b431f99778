package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-resilience/resilience/internal/limit"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The defaults of a concurrency limit, as internal/limit applies them.
const (
	defInitialLimit = 20
	defMinLimit     = 1
	defMaxLimit     = 1000
	defBaseWindow   = 30 * time.Second
)

// server checks a server document (serviceconfig.ParseServer) and, when
// fullMethod is not empty, explains the limit that applies to it.
func server(w io.Writer, data []byte, fullMethod string) error {
	cfg, err := serviceconfig.ParseServer(data)
	if err != nil {
		return err
	}
	p := &printer{w: w}
	if fullMethod == "" {
		p.printf("ok\n")
		if l := cfg.ConcurrencyLimit; l != nil {
			p.printf("  (server): %s\n", limitSummary(l))
		} else {
			p.printf("  (server): no limit\n")
		}
		rateSummaries(p, "    ", cfg.RateLimits)
		for i, mc := range cfg.MethodConfig {
			names := make([]string, 0, len(mc.Name))
			for _, n := range mc.Name {
				names = append(names, limitName(n))
			}
			summary := "no concurrency limit"
			if mc.ConcurrencyLimit != nil {
				summary = limitSummary(mc.ConcurrencyLimit)
			}
			p.printf("  methodConfig[%d] %s: %s\n", i, strings.Join(names, ", "), summary)
			rateSummaries(p, "    ", mc.RateLimits)
		}
		if f := cfg.TenantFairness; f != nil {
			p.printf("  tenantFairness: %s\n", fairnessSummary(f))
		}
		rateWarnings(p, cfg)
		return p.err
	}
	rates := cfg.LookupRateLimits(fullMethod)
	l, name, ok := cfg.Lookup(fullMethod)
	if !ok {
		p.printf("%s: no concurrency limit applies (no entry names it and there is no top-level concurrencyLimit)\n", fullMethod)
		explainRateLimits(p, cfg, fullMethod, rates)
		return p.err
	}
	switch name {
	case "":
		p.printf("%s: the server's limit (top-level concurrencyLimit), shared with every method no entry names\n", fullMethod)
	case fullMethod:
		p.printf("%s: its own limit (entry for the method)\n", fullMethod)
	default:
		p.printf("%s: the limit of service %s, shared by its methods\n", fullMethod, name)
	}
	explainLimit(p, l)
	explainFairness(p, cfg.TenantFairness)
	explainRateLimits(p, cfg, fullMethod, rates)
	return p.err
}

// fairnessValues fills the defaults of f.
func fairnessValues(f *serviceconfig.TenantFairness) (maxTenants int, idle time.Duration) {
	maxTenants, idle = f.MaxTenants, f.IdleTimeout
	if maxTenants == 0 {
		maxTenants = limit.DefaultMaxTenants
	}
	if idle == 0 {
		idle = limit.DefaultTenantIdle
	}
	return maxTenants, idle
}

func fairnessSummary(f *serviceconfig.TenantFairness) string {
	n, idle := fairnessValues(f)
	return fmt.Sprintf("tenant from metadata %s, at most %d tenants per limit, forgotten %v after their last call", f.MetadataKey, n, idle)
}

// explainFairness writes the tenant fairness, or that there is none.
func explainFairness(p *printer, f *serviceconfig.TenantFairness) {
	if f == nil {
		p.printf("\nno tenantFairness: every caller is one tenant, and a noisy caller makes everyone shed at its rate\n")
		return
	}
	n, idle := fairnessValues(f)
	p.printf("\ntenantFairness (every limit of the server)\n")
	t := p.table()
	t.row("  metadataKey", f.MetadataKey+": names the tenant (a caller can send any value: let an authenticating proxy set it)")
	t.row("  maxTenants", def(strconv.Itoa(n), f.MaxTenants == 0)+": tenants remembered per limit; the names beyond share one")
	t.row("  idleTimeout", def(idle.String(), f.IdleTimeout == 0)+": a tenant with nothing in flight keeps its share this long")
	t.flush()
	p.printf("under pressure each active tenant has a fair share of its criticality's share; a tenant under it is admitted\n")
	p.printf("whatever the others hold, one over it is shed first (a slot is kept free for each tenant under its share)\n")
}

// limitName writes a name as a full method or a service.
func limitName(n serviceconfig.Name) string {
	if n.Method == "" {
		return n.Service
	}
	return "/" + n.Service + "/" + n.Method
}

// limitValues fills the defaults of l.
func limitValues(l *serviceconfig.ConcurrencyLimit) (alg string, initial, lo, hi int, window time.Duration) {
	alg, initial, lo, hi, window = l.Algorithm, l.InitialLimit, l.MinLimit, l.MaxLimit, l.BaseWindow
	if alg == "" {
		alg = "vegas"
	}
	if lo == 0 {
		lo = defMinLimit
	}
	if hi == 0 {
		hi = defMaxLimit
	}
	if initial == 0 {
		initial = min(max(defInitialLimit, lo), hi)
	}
	if window == 0 {
		window = defBaseWindow
	}
	return alg, initial, lo, hi, window
}

func limitSummary(l *serviceconfig.ConcurrencyLimit) string {
	alg, initial, lo, hi, _ := limitValues(l)
	return fmt.Sprintf("%s, limit %d in [%d, %d]", alg, initial, lo, hi)
}

// explainLimit writes a limit with its defaults and what the server does.
func explainLimit(p *printer, l *serviceconfig.ConcurrencyLimit) {
	alg, initial, lo, hi, window := limitValues(l)
	p.printf("\nconcurrencyLimit (unary calls; streams only where server.Limits.Streams names them)\n")
	t := p.table()
	switch alg {
	case "aimd":
		t.row("  algorithm", "aimd: +1 per call while the latency stays within 2x the base RTT, x0.9 on a slower or dropped call")
	default:
		t.row("  algorithm", def("vegas", l.Algorithm == "")+": queue = limit x (1 - baseRTT/RTT) per RTT window; grows below 3 log10(limit), shrinks above 6 log10(limit); every ~10 x limit calls, unless it sheds, a probe takes the latest RTT for the base RTT, and a limit that falls while the RTT does not takes the new RTT too, so a lasting slowdown is learned in seconds")
	}
	t.row("  initialLimit", def(strconv.Itoa(initial), l.InitialLimit == 0))
	t.row("  minLimit", def(strconv.Itoa(lo), l.MinLimit == 0))
	t.row("  maxLimit", def(strconv.Itoa(hi), l.MaxLimit == 0))
	t.row("  baseWindow", def(window.String(), l.BaseWindow == 0)+": the base RTT is the least latency of the last two windows (up to 4 under a tenth of the 5th least ignored); it ages out after two windows without a call")
	if l.MaxQueue > 0 {
		t.row("  maxQueue", strconv.Itoa(l.MaxQueue)+": calls over the limit that may wait for a slot; the most critical first, and a full queue gives a less critical call's place to a more critical one")
		t.row("  maxQueueWait", l.MaxQueueWait.String()+": the longest wait (less when the deadline is nearer); it adds to their latency")
	} else {
		t.row("  maxQueue", "0 (default): calls over the limit are shed at once")
	}
	t.flush()
	p.printf("\nshares of the limit by criticality (metadata resilience-criticality; retries count as SHEDDABLE_PLUS at most)\n")
	t = p.table()
	for _, s := range []struct {
		name  string
		share float64
	}{{"CRITICAL_PLUS (only callers Limits.Criticality trusts)", 1}, {"CRITICAL (default, and the most a caller may claim)", 0.9}, {"SHEDDABLE_PLUS", 0.75}, {"SHEDDABLE", 0.5}} {
		t.row("  "+s.name, strconv.Itoa(int(s.share*100))+"%", fmt.Sprintf("%d of the initial limit", ceilShare(initial, s.share)))
	}
	t.flush()
	p.printf("\nonly a call answered OK is a latency sample; one whose deadline ended is a drop (the limit falls) only\n")
	p.printf("when it had twice the base RTT left when admitted; a failure, a cancellation or an idempotent replay teach nothing;\n")
	p.printf("a call whose deadline has less left than the door's service time (the least latency of the last 32 to 64 calls;\n")
	p.printf("open once none completed for 8 smoothed latencies) fails with DEADLINE_EXCEEDED, not started;\n")
	p.printf("a call over its share fails at once with RESOURCE_EXHAUSTED, RetryInfo and grpc-retry-pushback-ms\n")
	p.printf("(smoothed latency x (1 + shed/admitted), in steps of at most 25%%), or pushback -1 (do not retry) once half or more are shed\n")
}

// ceilShare is the in-flight count at which a share of limit sheds.
func ceilShare(limit int, share float64) int {
	n := int(float64(limit) * share)
	if float64(n) < float64(limit)*share {
		n++
	}
	return max(1, n)
}
