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
	switch p.ChildPolicy {
	case "pick_first":
		child, order = "pick_first", "sends calls to the first usable endpoint in the resolver's order, with a connection to every endpoint"
	case "peak_ewma":
		decay := def(fmtDur(orDur(p.DecayTime, serviceconfig.DefaultPeakEWMADecayTime)), p.DecayTime == 0)
		conc := def(itoa(orInt(p.EndpointConcurrency, serviceconfig.DefaultPeakEWMAEndpointConcurrency)), p.EndpointConcurrency == 0)
		child, order = "peak_ewma", "picks the cheaper of two random endpoints, cost = latency estimate × (1 + attempts outstanding / "+
			"endpointConcurrency "+conc+"); "+
			"the estimate takes a slower latency at once and forgets it with decay time "+decay+
			" (an endpoint not picked looks cheaper with time, so a slow one is tried again)"
	}
	lines = append(lines,
		"loadBalancingConfig: "+serviceconfig.EndpointPolicyName+" (import github.com/grpc-resilience/resilience/interceptor/endpoint to register it)",
		"  childPolicy "+child+": "+order+"; every attempt's endpoint is recorded, so a retry or hedged copy goes to an endpoint its call has not used while one is READY")
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
	pct := serviceconfig.DefaultEndpointMaxEjectionPercent
	if p.MaxEjectionPercent != nil {
		pct = *p.MaxEjectionPercent
	}
	failures := "UNAVAILABLE, INTERNAL, DATA_LOSS (default; not UNKNOWN, a handler's plain error, which a caller's request can provoke)"
	if len(p.FailureStatusCodes) > 0 {
		failures = rescodes.Of(p.FailureStatusCodes...).String()
	}
	lines = append(lines,
		"  ejects an endpoint after "+strings.Join(conds, " or ")+"; failures are answers with "+failures+
			", and attempts the Client's perAttemptRecvTimeout cut; RESOURCE_EXHAUSTED and pushback are busy, not failures; "+
			"an attempt that sent nothing, the caller's cancellation or deadline, and other codes count for nothing")
	switch local := p.ConsecutiveLocalOriginFailures; {
	case local == -1:
		lines = append(lines, "  local-origin failures (connection refused or reset before a response): counted apart, never eject (consecutiveLocalOriginFailures −1)")
	default:
		lines = append(lines, "  local-origin failures (connection refused or reset before a response): counted apart; "+
			def(itoa(orInt(local, serviceconfig.DefaultEndpointConsecutiveLocalOriginFailures)), local == 0)+
			" in a row eject, until the endpoint is READY on a new connection")
	}
	bound := "at most " + def(itoa(pct), p.MaxEjectionPercent == nil) + "% of the endpoints out at once (strictly: with 3 endpoints, " +
		itoa(pct*3/100) + " at most), checked against the endpoints listed now: when they shrink, the longest-ejected return first"
	if pct == 0 {
		bound = "maxEjectionPercent 0: nothing is ever ejected (gRFC A50)"
	}
	lines = append(lines,
		"  the k-th ejection in a row lasts min(k × "+def(fmtDur(base), p.BaseEjectionTime == 0)+", "+
			def(fmtDur(max(maxT, base)), p.MaxEjectionTime == 0)+"); "+bound,
		"  an ejected endpoint still serves when no other is READY, and returns at once when it answers")
	if interval {
		warnings = append(warnings, "loadBalancingConfig: "+serviceconfig.EndpointPolicyName+
			".interval is ignored: the policy computes ejections on each outcome, with no sweep")
	}
	if pct > 0 && pct*3/100 == 0 && pct < 100 {
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
