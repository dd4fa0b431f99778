package serviceconfig

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
)

// EndpointPolicyName is the name of the endpoint load-balancing policy in a
// service config's loadBalancingConfig, registered with grpc by importing
// the module's package interceptor/endpoint:
//
//	{"loadBalancingConfig": [{"resilience_endpoint": {"childPolicy": [{"round_robin": {}}]}}]}
const EndpointPolicyName = "resilience_endpoint"

// The defaults of a zero EndpointPolicy field.
const (
	DefaultEndpointConsecutiveFailures = 5
	// DefaultEndpointConsecutiveLocalOriginFailures is Envoy's
	// consecutive_local_origin_failure default.
	DefaultEndpointConsecutiveLocalOriginFailures = 5
	// DefaultPeakEWMADecayTime is the peak_ewma child's decay time:
	// Finagle's and Linkerd's (see EndpointPolicy.DecayTime).
	DefaultPeakEWMADecayTime = 10 * time.Second
	// minPeakEWMADecayTime is the shortest decay time accepted.
	minPeakEWMADecayTime = 100 * time.Millisecond
	// DefaultPeakEWMAEndpointConcurrency is the peak_ewma child's endpoint
	// concurrency: an attempt outstanding on an endpoint costs a quarter of
	// its latency (see EndpointPolicy.EndpointConcurrency).
	DefaultPeakEWMAEndpointConcurrency = 4
	// maxPeakEWMAEndpointConcurrency is the largest endpoint concurrency
	// accepted.
	maxPeakEWMAEndpointConcurrency    = 16
	DefaultEndpointBaseEjectionTime   = 30 * time.Second
	DefaultEndpointMaxEjectionTime    = 300 * time.Second
	DefaultEndpointMaxEjectionPercent = 50
	DefaultFailurePercentageVolume    = 20
	DefaultFailurePercentageWindow    = 10 * time.Second
	// minFailurePercentageWindow is the shortest failure-rate window
	// accepted (the window is 10 buckets of a tenth each).
	minFailurePercentageWindow = 100 * time.Millisecond
)

// EndpointPolicy configures the endpoint load-balancing policy: the object
// under EndpointPolicyName in loadBalancingConfig. Its JSON keeps gRFC A50's
// names and shape where they fit (baseEjectionTime, maxEjectionTime,
// maxEjectionPercent, failurePercentageEjection, childPolicy); the policy is
// passive, so A50's interval has no use and is accepted and ignored, and
// successRateEjection is not supported (an error).
//
// A zero field means its default. Ejection needs at least one condition:
// with neither ConsecutiveFailures nor FailurePercentage set, consecutive
// failures eject after DefaultEndpointConsecutiveFailures (5), as in the
// circuit breaker's block; set ConsecutiveFailures to −1 to eject only by
// the failure percentage.
type EndpointPolicy struct {
	// ChildPolicy chooses the order of picks among the endpoints:
	// "round_robin" (the default, "") rotates, "pick_first" sends every
	// call to the first usable endpoint in the resolver's order, and
	// "peak_ewma" picks the better of two random endpoints by their
	// latency (a peak-sensitive moving average, weighted by the requests
	// outstanding). Every endpoint gets its own connection (see the
	// package interceptor/endpoint's documentation). The child's own
	// settings are refused (pick_first's shuffleAddressList, except false),
	// not dropped; peak_ewma takes decayTime and endpointConcurrency.
	ChildPolicy string
	// DecayTime is peak_ewma's decay time τ ({"peak_ewma": {"decayTime":
	// "10s"}}): how long a latency counts. 0 means 10s (Finagle's and
	// Linkerd's), else at least 100ms. Only with ChildPolicy "peak_ewma".
	//
	// The estimate takes a slower latency at once and decays toward zero
	// between samples, so τ sets two things. A persistently slow endpoint
	// is tried again about once per τ·ln(its latency / the others'): a 10×
	// slower one got 4% of the calls at one call a second, 0.5% at ten (20%
	// and 4% at 1s). And one slow answer (a pause) keeps a healthy endpoint
	// from every pick for about τ·ln(the pause / a busy endpoint's cost):
	// 16 callers over three 5ms endpoints, one 50ms answer, 9s at 10s, 1s at
	// 1s (endpointConcurrency 4, on fake time; in real time, bench/'s
	// endpoint-pause, a quarter of the calls again after about 10s at 10s,
	// 2s at 1s). Shorten it only for channels with hundreds of calls a
	// second and methods far faster than τ: an endpoint with calls in
	// flight and no answer within τ is priced as never measured.
	DecayTime time.Duration
	// EndpointConcurrency is peak_ewma's count of attempts an endpoint
	// serves at once before they slow one another ({"peak_ewma":
	// {"endpointConcurrency": 4}}): the cost of an endpoint is its latency
	// × (1 + outstanding / EndpointConcurrency). 0 means 4; 1 is Finagle's
	// and Linkerd's cost, latency × (outstanding + 1), which prices each
	// attempt in flight as a whole latency, as if the endpoint served one
	// at a time; at most 16. Only with ChildPolicy "peak_ewma". A client
	// older than v0.5.0 refuses the key: set it in a service config that
	// older clients read only once they are upgraded.
	//
	// A gRPC server serves calls concurrently, and its latency estimate
	// already rises when load slows it. At 1, 16 callers over three
	// endpoints, one of them 10× slower, keep about 8 attempts on each fast
	// endpoint, which then looks about as dear as the idle slow one, and
	// the slow one got 1.22–1.58% of the calls: the p99 was its latency
	// (5.5–5.9× the all-healthy p99). At 4 it gets 0.17–0.45% and the p99
	// is 1.02–1.18×; with every endpoint healthy the most loaded of three
	// takes 35.0–35.5% of the calls (34.5–34.8% at 1). The price: one slow
	// answer keeps an endpoint from every pick until its estimate decays
	// below a busy endpoint's cost (about 9s at the default decay time, see
	// DecayTime), where at 1 a busy endpoint soon costs as much and the
	// paused one gets calls again at once, though fewer (in real time an
	// eighth of them at once, a quarter after about 9s). At 16 the attempts
	// in flight hardly count and latency noise decides: 43% on one of three
	// in one run. Lower it toward 1 for endpoints that serve one call at a
	// time.
	EndpointConcurrency int
	// ConsecutiveFailures ejects an endpoint after that many failures in a
	// row; 0 means 5 unless FailurePercentage is set; −1 is off.
	ConsecutiveFailures int
	// ConsecutiveLocalOriginFailures ejects an endpoint after that many
	// local-origin failures in a row (its connection refused or reset
	// before any response; Envoy's consecutive_local_origin_failure). They
	// count apart from the endpoint's own failures, and an ejection they
	// cause ends as soon as the endpoint is READY on a new connection. 0
	// means 5; −1 is off.
	ConsecutiveLocalOriginFailures int
	// FailurePercentage ejects an endpoint by its failure percentage over
	// a rolling window; nil is off.
	FailurePercentage *FailurePercentageEjection
	// FailureStatusCodes lists the codes that count as an endpoint's
	// failure when it answers with them; empty means UNAVAILABLE, INTERNAL
	// and DATA_LOSS. UNKNOWN is not among them by default: it is what a
	// handler's plain (non-status) error becomes, so usually an
	// application's answer that a caller's request can provoke, and one
	// caller must not eject healthy endpoints; list it to count it.
	// RESOURCE_EXHAUSTED, and any status with a server pushback, is
	// "busy" and never a failure; DEADLINE_EXCEEDED and CANCELLED are the
	// caller's and are not allowed here (an attempt cut by the Client's
	// per-attempt timeout counts as a failure without being listed).
	FailureStatusCodes []codes.Code
	// BaseEjectionTime is the first ejection's length; the k-th in a row
	// lasts k times it. 0 means 30s.
	BaseEjectionTime time.Duration
	// MaxEjectionTime caps an ejection. 0 means 300s; below
	// BaseEjectionTime it means BaseEjectionTime.
	MaxEjectionTime time.Duration
	// MaxEjectionPercent bounds the share of endpoints out of rotation at
	// once, strictly: an ejection that would pass it is refused, and when
	// the endpoints shrink the longest-ejected return until it holds. In
	// [0, 100]; 0 ejects nothing (gRFC A50); nil means 50.
	MaxEjectionPercent *int
}

// FailurePercentageEjection is gRFC A50's failure-percentage detection,
// computed over a rolling window instead of a timer's interval.
type FailurePercentageEjection struct {
	// Threshold ejects an endpoint whose failures reach that percentage
	// of its outcomes in Window; in [1, 100].
	Threshold int
	// RequestVolume is the number of outcomes Window must hold first. 0
	// means 20.
	RequestVolume int
	// Window is the rolling window: 0 means 10s, else at least 100ms. An
	// extension of A50.
	Window time.Duration
}

// callerCodes are the codes a caller's own context produces, which say
// nothing of an endpoint's health.
var callerCodes = []codes.Code{codes.Canceled, codes.DeadlineExceeded}

// Validate reports the first field out of range, with its JSON path.
func (p *EndpointPolicy) Validate() error {
	switch p.ChildPolicy {
	case "", "round_robin", "pick_first", "peak_ewma":
	default:
		return newError("childPolicy", `"`+p.ChildPolicy+`" is not supported: use round_robin, pick_first or peak_ewma`)
	}
	switch {
	case p.DecayTime != 0 && p.ChildPolicy != "peak_ewma":
		return newError("childPolicy", "decayTime is peak_ewma's setting")
	case p.DecayTime < 0:
		return newError("childPolicy.peak_ewma.decayTime", "must not be negative")
	case p.DecayTime > 0 && p.DecayTime < minPeakEWMADecayTime:
		return newError("childPolicy.peak_ewma.decayTime", "must be at least "+minPeakEWMADecayTime.String()+
			" (or 0 for the default "+DefaultPeakEWMADecayTime.String()+"): a shorter one forgets a slow endpoint between two of its calls")
	case p.EndpointConcurrency != 0 && p.ChildPolicy != "peak_ewma":
		return newError("childPolicy", "endpointConcurrency is peak_ewma's setting")
	case p.EndpointConcurrency < 0 || p.EndpointConcurrency > maxPeakEWMAEndpointConcurrency:
		return newError("childPolicy.peak_ewma.endpointConcurrency", concurrencyRange)
	case p.ConsecutiveFailures < -1:
		return newError("consecutiveFailures", "must be −1 (off), 0 (the default) or positive")
	case p.ConsecutiveLocalOriginFailures < -1:
		return newError("consecutiveLocalOriginFailures", "must be −1 (off), 0 (the default) or positive")
	case p.BaseEjectionTime < 0:
		return newError("baseEjectionTime", "must not be negative")
	case p.MaxEjectionTime < 0:
		return newError("maxEjectionTime", "must not be negative")
	case p.MaxEjectionPercent != nil && (*p.MaxEjectionPercent < 0 || *p.MaxEjectionPercent > 100):
		return newError("maxEjectionPercent", "must be in [0, 100] (0 ejects nothing; absent: the default, 50)")
	case p.ConsecutiveFailures == -1 && p.FailurePercentage == nil:
		return newError("consecutiveFailures", "−1 turns off the only ejection condition: set failurePercentageEjection too")
	}
	for i, c := range p.FailureStatusCodes {
		if c == codes.OK || c > codes.Unauthenticated {
			return newError(index("failureStatusCodes", i), "must be a failure status code")
		}
		for _, cc := range callerCodes {
			if c == cc {
				return newError(index("failureStatusCodes", i), "is the caller's own end (its cancellation or deadline), not the endpoint's failure")
			}
		}
		if c == codes.ResourceExhausted {
			return newError(index("failureStatusCodes", i), "RESOURCE_EXHAUSTED is busy, not broken: it never ejects")
		}
	}
	if f := p.FailurePercentage; f != nil {
		switch {
		case f.Threshold < 1 || f.Threshold > 100:
			return newError("failurePercentageEjection.threshold", "must be in [1, 100]")
		case f.RequestVolume < 0:
			return newError("failurePercentageEjection.requestVolume", "must not be negative")
		case f.Window < 0:
			return newError("failurePercentageEjection.window", "must not be negative")
		case f.Window > 0 && f.Window < minFailurePercentageWindow:
			return newError("failurePercentageEjection.window", "must be at least "+minFailurePercentageWindow.String()+
				" (or 0 for the default "+DefaultFailurePercentageWindow.String()+"): a shorter window holds too few outcomes to judge a rate, and the ejection by rate is silently off")
		}
	}
	return nil
}

type wireEndpoint struct {
	ChildPolicy         leaf[[]map[string]json.RawMessage]
	ConsecutiveFailures leaf[int]
	// ConsecutiveLocalOriginFailures is ours (Envoy's
	// consecutive_local_origin_failure).
	ConsecutiveLocalOriginFailures leaf[int]
	FailurePercentageEjection      *wireFailurePercentage
	FailureStatusCodes             leaf[[]code]
	BaseEjectionTime               leaf[*duration]
	MaxEjectionTime                leaf[*duration]
	MaxEjectionPercent             leaf[*int]      // nil: absent (or null), the default; 0 ejects nothing
	Interval                       leaf[*duration] // gRFC A50's sweep: accepted, ignored
	SuccessRateEjection            leaf[json.RawMessage]
}

type wireFailurePercentage struct {
	Threshold     leaf[int]
	RequestVolume leaf[int]
	Window        leaf[*duration]
	// gRFC A50's: accepted when 100 and 0 (what this policy does), else
	// an error.
	EnforcementPercentage leaf[*int]
	MinimumHosts          leaf[*int]
}

// ParseEndpointPolicy reads the JSON object under EndpointPolicyName in a
// loadBalancingConfig and returns the validated policy, or an *Error whose
// path is relative to that object. An unknown key is an error naming the
// closest known one.
func ParseEndpointPolicy(data []byte) (*EndpointPolicy, error) {
	var w wireEndpoint
	if err := json.Unmarshal(data, &w); err != nil {
		return nil, decodeError(data, err)
	}
	if kerr, _ := checkKeys(data, reflect.TypeFor[wireEndpoint](), true); kerr != nil {
		return nil, kerr
	}
	if err := checkAll("",
		field{"childPolicy", &w.ChildPolicy},
		field{"consecutiveFailures", &w.ConsecutiveFailures},
		field{"consecutiveLocalOriginFailures", &w.ConsecutiveLocalOriginFailures},
		field{"failureStatusCodes", &w.FailureStatusCodes},
		field{"baseEjectionTime", &w.BaseEjectionTime},
		field{"maxEjectionTime", &w.MaxEjectionTime},
		field{"maxEjectionPercent", &w.MaxEjectionPercent},
		field{"interval", &w.Interval},
	); err != nil {
		return nil, err
	}
	if w.SuccessRateEjection.set {
		return nil, newError("successRateEjection", "is not supported: use failurePercentageEjection or consecutiveFailures")
	}
	p := &EndpointPolicy{
		ConsecutiveFailures:            w.ConsecutiveFailures.v,
		ConsecutiveLocalOriginFailures: w.ConsecutiveLocalOriginFailures.v,
		FailureStatusCodes:             codeList(w.FailureStatusCodes.v),
		BaseEjectionTime:               optDuration(w.BaseEjectionTime.v),
		MaxEjectionTime:                optDuration(w.MaxEjectionTime.v),
		MaxEjectionPercent:             w.MaxEjectionPercent.v,
	}
	child, ewma, err := childPolicy(w.ChildPolicy.v, w.ChildPolicy.set)
	if err != nil {
		return nil, err
	}
	p.ChildPolicy, p.DecayTime, p.EndpointConcurrency = child, ewma.decay, ewma.concurrency
	if f := w.FailurePercentageEjection; f != nil {
		if p.FailurePercentage, err = f.policy(); err != nil {
			return nil, err
		}
	}
	// The codes are checked as the document lists them, so that the path
	// names the element at fault.
	raw := &EndpointPolicy{ConsecutiveFailures: 1}
	for _, c := range w.FailureStatusCodes.v {
		raw.FailureStatusCodes = append(raw.FailureStatusCodes, codes.Code(c))
	}
	if err := raw.Validate(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

func (f *wireFailurePercentage) policy() (*FailurePercentageEjection, error) {
	const path = "failurePercentageEjection"
	if err := checkAll(path,
		field{"threshold", &f.Threshold},
		field{"requestVolume", &f.RequestVolume},
		field{"window", &f.Window},
		field{"enforcementPercentage", &f.EnforcementPercentage},
		field{"minimumHosts", &f.MinimumHosts},
	); err != nil {
		return nil, err
	}
	if v := f.EnforcementPercentage.v; v != nil && *v != 100 {
		return nil, newError(join(path, "enforcementPercentage"), "only 100 is supported: every detection is enforced")
	}
	if v := f.MinimumHosts.v; v != nil && *v != 0 {
		return nil, newError(join(path, "minimumHosts"), "is not supported (maxEjectionPercent bounds ejections)")
	}
	return &FailurePercentageEjection{Threshold: f.Threshold.v, RequestVolume: f.RequestVolume.v, Window: optDuration(f.Window.v)}, nil
}

// childPolicy returns the first policy of list this policy supports, as
// grpc takes the first registered one of a loadBalancingConfig, and
// peak_ewma's settings.
func childPolicy(list []map[string]json.RawMessage, set bool) (string, peakEWMA, error) {
	if !set {
		return "", peakEWMA{}, nil
	}
	if len(list) == 0 {
		return "", peakEWMA{}, newError("childPolicy", `must name a policy such as {"round_robin": {}}`)
	}
	for i, e := range list {
		if len(e) != 1 {
			return "", peakEWMA{}, newError(index("childPolicy", i), "must hold exactly one policy, not "+itoa(len(e)))
		}
		for name, settings := range e {
			switch name {
			case "round_robin", "pick_first":
				return name, peakEWMA{}, childSettings(join(index("childPolicy", i), name), name, settings)
			case "peak_ewma":
				s, err := peakEWMASettings(join(index("childPolicy", i), name), settings)
				return name, s, err
			}
		}
	}
	return "", peakEWMA{}, newError("childPolicy", "names no supported policy: use round_robin, pick_first or peak_ewma")
}

// peakEWMA is peak_ewma's settings, 0 where absent.
type peakEWMA struct {
	decay       time.Duration
	concurrency int
}

type wirePeakEWMA struct {
	DecayTime           leaf[*duration]
	EndpointConcurrency leaf[int]
}

const concurrencyRange = "must be in [1, 16] (or 0 for the default 4): the attempts an endpoint serves at once; above 16 the attempts in flight hardly count, and calls herd onto the endpoint whose latency reads lowest"

// peakEWMASettings reads peak_ewma's settings: {"decayTime": "10s",
// "endpointConcurrency": 4}, either, or none.
func peakEWMASettings(path string, settings json.RawMessage) (peakEWMA, error) {
	var w wirePeakEWMA
	if err := json.Unmarshal(settings, &w); err != nil {
		return peakEWMA{}, newError(path, "must be an object")
	}
	if kerr, _ := checkKeys(settings, reflect.TypeFor[wirePeakEWMA](), true); kerr != nil {
		return peakEWMA{}, prefix(path, kerr)
	}
	if err := checkAll(path,
		field{"decayTime", &w.DecayTime},
		field{"endpointConcurrency", &w.EndpointConcurrency},
	); err != nil {
		return peakEWMA{}, err
	}
	s := peakEWMA{decay: optDuration(w.DecayTime.v), concurrency: w.EndpointConcurrency.v}
	switch {
	case s.decay < 0:
		return peakEWMA{}, newError(join(path, "decayTime"), "must not be negative")
	case s.decay > 0 && s.decay < minPeakEWMADecayTime:
		return peakEWMA{}, newError(join(path, "decayTime"), "must be at least "+minPeakEWMADecayTime.String()+
			" (or 0 for the default "+DefaultPeakEWMADecayTime.String()+"): a shorter one forgets a slow endpoint between two of its calls")
	case s.concurrency < 0 || s.concurrency > maxPeakEWMAEndpointConcurrency:
		return peakEWMA{}, newError(join(path, "endpointConcurrency"), concurrencyRange)
	}
	return s, nil
}

// childSettings checks the child policy's own settings, which the endpoint
// policy does not apply: refused, not dropped, when they would change what
// the child does (pick_first's shuffleAddressList: true spreads clients
// over the endpoints; dropped, every client would send to the first).
func childSettings(path, name string, settings json.RawMessage) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(settings, &m); err != nil {
		return newError(path, "must be an object")
	}
	for _, k := range slices.Sorted(maps.Keys(m)) { // the first in order, always
		v := m[k]
		if name == "pick_first" && k == "shuffleAddressList" {
			if string(v) != "false" {
				return newError(path, "shuffleAddressList is not supported: the endpoint policy keeps the resolver's order (use round_robin to spread the calls)")
			}
			continue
		}
		return newError(path, name+" takes no settings here, not "+strconv.Quote(k))
	}
	return nil
}
