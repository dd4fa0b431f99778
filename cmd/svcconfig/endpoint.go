package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// endpointPolicy returns the endpoint load-balancing policy of cfg when its
// loadBalancingConfig selects it (the first policy grpc knows, with the
// endpoint package imported), and whether the document sets A50's
// interval, which the policy ignores.
func endpointPolicy(cfg *serviceconfig.Config) (p *serviceconfig.EndpointPolicy, interval bool) {
	var list []map[string]json.RawMessage
	if len(cfg.LoadBalancingConfig) == 0 || json.Unmarshal(cfg.LoadBalancingConfig, &list) != nil {
		return nil, false
	}
	for _, e := range list {
		for name, raw := range e {
			switch name {
			case "round_robin", "pick_first":
				return nil, false
			case serviceconfig.EndpointPolicyName:
				p, err := serviceconfig.ParseEndpointPolicy(raw) // Parse checked it
				if err != nil {
					return nil, false
				}
				var keys map[string]json.RawMessage
				_ = json.Unmarshal(raw, &keys)
				_, interval = keys["interval"]
				return p, interval
			}
		}
	}
	return nil, false
}

// endpointLines describes the policy in a few lines, and its warnings.
func endpointLines(p *serviceconfig.EndpointPolicy, interval bool) (lines, warnings []string) {
	child := def("round_robin", p.ChildPolicy == "")
	order := "rotates over the endpoints"
	if p.ChildPolicy == "pick_first" {
		child, order = "pick_first", "sends calls to the first usable endpoint in the resolver's order, with a connection to every endpoint"
	}
	lines = append(lines,
		"loadBalancingConfig: "+serviceconfig.EndpointPolicyName+" (import github.com/grpc-resilience/resilience/interceptor/endpoint to register it)",
		"  childPolicy "+child+": "+order+"; a retry or hedged copy goes to an endpoint its call has not used while one is READY")
	var conds []string
	switch {
	case p.ConsecutiveFailures > 0:
		conds = append(conds, itoa(p.ConsecutiveFailures)+" failures in a row")
	case p.ConsecutiveFailures == 0 && p.FailurePercentage == nil:
		conds = append(conds, def(itoa(serviceconfig.DefaultEndpointConsecutiveFailures), true)+" failures in a row")
	}
	if f := p.FailurePercentage; f != nil {
		vol, win := f.RequestVolume, f.Window
		conds = append(conds, itoa(f.Threshold)+"% failures over "+
			def(fmtDur(orDur(win, serviceconfig.DefaultFailurePercentageWindow)), win == 0)+" once "+
			def(itoa(orInt(vol, serviceconfig.DefaultFailurePercentageVolume)), vol == 0)+" outcomes are in it")
	}
	base := orDur(p.BaseEjectionTime, serviceconfig.DefaultEndpointBaseEjectionTime)
	maxT := orDur(p.MaxEjectionTime, serviceconfig.DefaultEndpointMaxEjectionTime)
	pct := orInt(p.MaxEjectionPercent, serviceconfig.DefaultEndpointMaxEjectionPercent)
	failures := "UNAVAILABLE, UNKNOWN, INTERNAL, DATA_LOSS (default)"
	if len(p.FailureStatusCodes) > 0 {
		failures = rescodes.Of(p.FailureStatusCodes...).String()
	}
	lines = append(lines,
		"  ejects an endpoint after "+strings.Join(conds, " or ")+"; failures are "+failures+
			"; RESOURCE_EXHAUSTED and pushback are busy, not failures",
		"  the k-th ejection in a row lasts min(k × "+def(fmtDur(base), p.BaseEjectionTime == 0)+", "+
			def(fmtDur(max(maxT, base)), p.MaxEjectionTime == 0)+"); at most "+def(itoa(pct), p.MaxEjectionPercent == 0)+
			"% of the endpoints out at once (strictly: with 3 endpoints, "+itoa(pct*3/100)+" at most)")
	if interval {
		warnings = append(warnings, "loadBalancingConfig: "+serviceconfig.EndpointPolicyName+
			".interval is ignored: the policy computes ejections on each outcome, with no sweep")
	}
	if pct*3/100 == 0 && pct < 100 {
		warnings = append(warnings, "loadBalancingConfig: "+serviceconfig.EndpointPolicyName+".maxEjectionPercent "+
			itoa(pct)+" ejects nothing with fewer than "+itoa((100+pct-1)/pct)+" endpoints")
	}
	return lines, warnings
}

func itoa(n int) string { return strconv.Itoa(n) }

func orDur(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func orInt(n, def int) int {
	if n == 0 {
		return def
	}
	return n
}
