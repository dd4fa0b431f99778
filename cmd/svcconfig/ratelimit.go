package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/internal/ratelimit"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// rateSummaries writes one line per rate limit of list.
func rateSummaries(p *printer, indent string, list []serviceconfig.RateLimit) {
	for i := range list {
		p.printf("%srateLimit %s: %s\n", indent, list[i].Name, rateSummary(&list[i]))
	}
}

// rateSummary is a limit in a line: "100 per 1m0s (one every 600ms), burst 20, per tenant, distributed".
func rateSummary(r *serviceconfig.RateLimit) string {
	per := r.Per
	if per == 0 {
		per = time.Second
	}
	s := fmt.Sprintf("%s per %v (one every %v), burst %d, %s", strconv.FormatFloat(r.Rate, 'g', -1, 64), per, r.Interval(), r.Burst, keyPhrase(r.Key))
	if r.Distributed {
		s += ", shared by every replica (" + fallbackOf(r) + " while the store is unreachable)"
	}
	return s
}

func keyPhrase(k serviceconfig.RateLimitKey) string {
	switch k {
	case serviceconfig.KeyShared:
		return "one bucket for every caller"
	case serviceconfig.KeyIdempotencyScope:
		return "per idempotency scope"
	default:
		return "per " + string(k)
	}
}

func fallbackOf(r *serviceconfig.RateLimit) string {
	if r.Fallback == "" {
		return string(serviceconfig.FallbackLocalShare)
	}
	return string(r.Fallback)
}

// rateWarnings warns about limits whose key cannot be what the user
// meant: a per-tenant limit with no tenant named in the document, a
// per-peer limit (behind a proxy every caller has the proxy's address).
func rateWarnings(p *printer, cfg *serviceconfig.ServerConfig) {
	var all []*serviceconfig.RateLimit
	for i := range cfg.RateLimits {
		all = append(all, &cfg.RateLimits[i])
	}
	for _, mc := range cfg.MethodConfig {
		for i := range mc.RateLimits {
			all = append(all, &mc.RateLimits[i])
		}
	}
	for _, r := range all {
		switch r.Key {
		case serviceconfig.KeyTenant:
			if cfg.TenantFairness == nil {
				p.printf("WARNING: rateLimit %s is per tenant, and the document names no tenant (tenantFairness.metadataKey): "+
					"the server needs server.Limits.Tenant, or every caller is one tenant\n", r.Name)
			}
		case serviceconfig.KeyPeer:
			p.printf("WARNING: rateLimit %s is per peer address: behind a proxy or a load balancer that ends connections, "+
				"every caller has its address and shares one bucket; prefer key tenant there\n", r.Name)
		}
	}
}

// explainRateLimits writes the rate limits that apply to fullMethod.
func explainRateLimits(p *printer, cfg *serviceconfig.ServerConfig, fullMethod string, rates []serviceconfig.AppliedRateLimit) {
	service, _ := serviceconfig.SplitMethod(fullMethod)
	exempt := slices.Contains(interceptor.DefaultExemptServices, service)
	if len(rates) == 0 {
		p.printf("\nno rate limit applies\n")
		return
	}
	p.printf("\nrate limits (a call must pass each, in this order; the first that refuses it answers)\n")
	applied := 0
	for _, a := range rates {
		r := a.Limit
		scope := "the whole server (top-level rateLimits)"
		switch {
		case a.Scope == fullMethod:
			scope = "this method (its entry)"
		case a.Scope != "":
			scope = "every method of " + a.Scope
		}
		if a.Scope == "" && exempt {
			p.printf("  %s: does not apply: the server exempts %s (health checks and reflection) from the top-level limits unless an entry names it\n", r.Name, service)
			continue
		}
		applied++
		per := r.Per
		if per == 0 {
			per = time.Second
		}
		p.printf("  %s, shared by %s\n", r.Name, scope)
		t := p.table()
		t.row("    rate", fmt.Sprintf("%s per %s: a token every %v", strconv.FormatFloat(r.Rate, 'g', -1, 64), def(per.String(), r.Per == 0), r.Interval()))
		t.row("    burst", fmt.Sprintf("%d: calls admitted at once after a quiet period; tokens that come while the bucket is full are lost", r.Burst))
		t.row("    key", string(r.Key)+": "+keyPhrase(r.Key))
		if r.Key != serviceconfig.KeyShared {
			n := r.MaxKeys
			if n == 0 {
				n = ratelimit.DefaultMaxKeys
			}
			t.row("    maxKeys", def(strconv.Itoa(n), r.MaxKeys == 0)+": keys remembered at once; a new key beyond them takes the place of one whose bucket is full again, or shares one overflow bucket")
		}
		if r.Distributed {
			t.row("    distributed", "true: the rate is the total of every replica, through the server's quota store (Redis) with leased tokens")
			t.row("    fallback", def(fallbackOf(r), r.Fallback == "")+": "+fallbackPhrase(r))
		} else {
			t.row("    distributed", "false: each replica limits on its own (N replicas admit up to N times the rate)")
		}
		t.flush()
		if r.Burst > 1 {
			p.printf("    by criticality, a call is admitted while this many of the %d tokens are left after it: %s\n", r.Burst, reserves(r.Burst))
		} else {
			p.printf("    a burst of 1 keeps no reserve by criticality: the last token is everyone's\n")
		}
	}
	if applied == 0 {
		return
	}
	p.printf("a call refused fails at once with RESOURCE_EXHAUSTED, a google.rpc.QuotaFailure naming the limit,\n")
	p.printf("and RetryInfo and grpc-retry-pushback-ms with the exact time until it would be admitted\n")
}

func fallbackPhrase(r *serviceconfig.RateLimit) string {
	switch fallbackOf(r) {
	case string(serviceconfig.FallbackOpen):
		return "every call is admitted while Redis is unreachable: no limit at all"
	case string(serviceconfig.FallbackClosed):
		return "calls the leased tokens do not cover are refused while Redis is unreachable"
	default:
		return "each replica limits to the rate divided by the replicas seen recently while Redis is unreachable"
	}
}

// reserves lists, per criticality, the tokens a call leaves at least.
func reserves(burst int) string {
	parts := make([]string, 0, 3)
	for _, c := range []struct {
		name string
		crit ratelimit.Criticality
	}{{"CRITICAL and CRITICAL_PLUS", ratelimit.Critical}, {"SHEDDABLE_PLUS", ratelimit.SheddablePlus}, {"SHEDDABLE", ratelimit.Sheddable}} {
		left := (1 - ratelimit.BurstShare[c.crit]) * float64(burst-1)
		parts = append(parts, fmt.Sprintf("%s %s", c.name, strings.TrimSuffix(strconv.FormatFloat(left, 'f', 2, 64), ".00")))
	}
	return strings.Join(parts, ", ")
}
