package serviceconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	rescodes "github.com/grpc-resilience/resilience/codes"
)

// Parse reads a service-config JSON document (gRFC A6, with this module's
// extension blocks) and returns the validated Config, or an *Error naming
// the JSON path of the first problem and the rule it breaks. Parse accepts
// and rejects what grpc-go v1.85 does, except for the gRFC A6 corrections
// and our own schema's strictness that the package documentation lists: an
// unknown key in our blocks is an error naming the closest known key, and
// one in A6's objects a warning ([Config.Warnings]), unless it changes
// which methods a policy covers, such as an unknown key in a name: that is
// an error too, unless [Lenient] asks for grpc-go's verdict. It never
// panics.
func Parse(data []byte, opts ...ParseOption) (*Config, error) {
	o := defaultParseOptions()
	for _, opt := range opts {
		opt.apply(&o)
	}
	if len(data) == 0 {
		// grpc-go: "no JSON service config provided".
		return nil, &Error{Err: errors.New("no JSON service config provided")}
	}
	// Decoding with encoding/json into structs shaped like grpc-go's (same
	// field names, same pointer and value fields, same leaf types) gives the
	// same verdict on every quirk: keys matched case-insensitively, unknown
	// keys ignored, duplicate keys merged, null handled per field, trailing
	// data rejected. Leaves keep their decoding error instead of failing the
	// decode, so that the error can name the leaf's path.
	var w wireConfig
	if err := json.Unmarshal(data, &w); err != nil {
		return nil, decodeError(data, err)
	}
	// Unknown keys: an error in our blocks, a warning in gRFC A6's objects
	// (see keys.go).
	kerr, unknown := checkKeys(data, reflect.TypeFor[wireConfig](), false)
	if kerr != nil {
		return nil, kerr
	}
	c, err := w.config(o)
	if err != nil {
		return nil, hint(err, unknown)
	}
	// A typo that changes which methods a policy covers: an error unless
	// Lenient (see coverage.go).
	c.warnings = warningsOf(&w, unknown)
	if !o.lenient {
		if err := firstCoverage(c.warnings); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// The wire types mirror grpc-go's jsonSC, jsonMC, jsonRetryPolicy, jsonName,
// retryThrottlingPolicy and healthCheckConfig field for field, plus the
// fields grpc-go ignores: hedgingPolicy and our extension blocks.

type wireConfig struct {
	LoadBalancingPolicy leaf[*string]
	LoadBalancingConfig leaf[*json.RawMessage]
	MethodConfig        *[]wireMethod
	RetryThrottling     *wireThrottling
	HealthCheckConfig   *wireHealthCheck
	RetryBudget         *wireBudget `sc:"ours"`
}

type wireMethod struct {
	Name                    *[]wireName
	WaitForReady            leaf[*bool]
	Timeout                 leaf[*duration]
	MaxRequestMessageBytes  leaf[*int64]
	MaxResponseMessageBytes leaf[*int64]
	RetryPolicy             *wireRetry
	HedgingPolicy           *wireHedging
	CircuitBreaker          *wireBreaker         `sc:"ours"`
	Bulkhead                *wireBulkhead        `sc:"ours"`
	RateLimit               *wireClientRateLimit `sc:"ours"`
}

type wireName struct {
	Service leaf[string]
	Method  leaf[string]
}

type wireRetry struct {
	MaxAttempts           leaf[int]
	InitialBackoff        leaf[duration] // a value: null is an error, as in grpc-go
	MaxBackoff            leaf[duration]
	BackoffMultiplier     leaf[float64]
	RetryableStatusCodes  leaf[[]code]
	PerAttemptRecvTimeout leaf[*duration] `sc:"ours"`
	Jitter                leaf[string]    `sc:"ours"`
}

type wireHedging struct {
	MaxAttempts         leaf[int]
	HedgingDelay        leaf[*duration]
	NonFatalStatusCodes leaf[[]code]
	// The adaptive delay: extension fields, ignored by grpc-go; null
	// means absent.
	HedgingDelayQuantile   leaf[*float64]  `sc:"ours"`
	HedgingDelayFloor      leaf[*duration] `sc:"ours"`
	HedgingDelayMinSamples leaf[*int]      `sc:"ours"`
}

type wireThrottling struct {
	MaxTokens  leaf[float64]
	TokenRatio leaf[decimal]
}

type wireHealthCheck struct {
	ServiceName leaf[string]
}

type wireBudget struct {
	Ratio               leaf[float64]
	MinRetriesPerSecond leaf[float64]
	TTL                 leaf[*duration]
}

type wireBreaker struct {
	Mode                  leaf[string]
	K                     leaf[float64]
	ConsecutiveFailures   leaf[int]
	FailureRateThreshold  leaf[float64]
	SlowCallDuration      leaf[*duration]
	SlowCallRateThreshold leaf[float64]
	MinimumCalls          leaf[int]
	Window                leaf[*duration]
	OpenDuration          leaf[*duration]
	MaxOpenDuration       leaf[*duration]
	HalfOpenProbes        leaf[int]
	FailureStatusCodes    leaf[[]code]
}

type wireBulkhead struct {
	MaxConcurrent leaf[int]
	MaxQueue      leaf[int]
	MaxQueueWait  leaf[*duration]
}

// leaf is one JSON value decoded into T by encoding/json, as grpc-go decodes
// the field of type T. Because leaf implements json.Unmarshaler, encoding/json
// hands it every value of its key, null included, and json.Unmarshal into v
// then does what it would have done in place: null leaves a value type
// alone and sets a pointer to nil; a repeated key decodes into the same v.
//
// A decoding error is kept, not returned, so the caller can report it with
// the leaf's path. It sticks: grpc-go rejects a document in which any
// occurrence of a key fails to decode, even when a later one would succeed.
type leaf[T any] struct {
	v    T
	set  bool   // the key appeared, possibly as null
	null bool   // the key appeared as null
	err  error  // the first decoding error
	bad  []byte // the value that failed, for error details
}

// written reports whether the key appeared with a value other than null.
func (l *leaf[T]) written() bool { return l.set && !l.null }

func (l *leaf[T]) UnmarshalJSON(b []byte) error {
	l.set = true
	l.null = string(bytes.TrimSpace(b)) == "null"
	if err := json.Unmarshal(b, &l.v); err != nil && l.err == nil {
		l.err, l.bad = err, bytes.Clone(b)
	}
	return nil
}

// check returns the leaf's decoding error, if any, as an *Error at path.
func (l *leaf[T]) check(path string) error {
	if l.err == nil {
		return nil
	}
	if _, ok := any(l.v).([]code); ok {
		return codeListError(path, l.bad, l.err)
	}
	return &Error{Path: path, Err: describe(l.err)}
}

// checker is a leaf of any type.
type checker interface{ check(path string) error }

// field pairs a JSON key with its leaf.
type field struct {
	key  string
	leaf checker
}

// checkAll returns the first decoding error among fields, with paths under p.
func checkAll(p string, fields ...field) error {
	for _, f := range fields {
		if err := f.leaf.check(join(p, f.key)); err != nil {
			return err
		}
	}
	return nil
}

// join returns the path of key under p.
func join(p, key string) string {
	if p == "" {
		return key
	}
	return p + "." + key
}

// index returns the path of element i of the array at p.
func index(p string, i int) string { return p + "[" + itoa(i) + "]" }

// code is one element of a status-code list. Its UnmarshalJSON follows
// grpc-go's codes.Code.UnmarshalJSON but matches names case-insensitively,
// as gRFC A6 requires: a JSON number 0 to 16, or a JSON string holding a
// code name with no escape sequence. null is a no-op, so a null element
// reads as OK (0), as in grpc-go.
type code uint32

func (c *code) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "null" {
		return nil
	}
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		if n > 16 {
			return errors.New("status code " + s + " is out of range: numbers must be 0 to 16")
		}
		*c = code(n)
		return nil
	}
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return errors.New(`must be a status code name such as "UNAVAILABLE" or a number 0 to 16, not ` + jsonKind(b))
	}
	name := s[1 : len(s)-1]
	switch {
	case strings.ContainsRune(name, '\\'):
		return errors.New("status code " + s + ": names may not hold escape sequences")
	case name != "" && name[0] >= '0' && name[0] <= '9':
		return errors.New("status code " + s + " is a string: write a number without quotes")
	}
	cc, err := rescodes.Parse(name)
	if err != nil {
		return errors.New("unknown status code " + s)
	}
	*c = code(cc)
	return nil
}

// codeListError returns an *Error for a status-code list that failed to
// decode: the path of the first bad element, or of the list.
func codeListError(path string, b []byte, err error) error {
	var elems []json.RawMessage
	if json.Unmarshal(b, &elems) != nil {
		return &Error{Path: path, Err: errors.New("must be an array of status codes, not " + jsonKind(b))}
	}
	for i, e := range elems {
		var c code
		if err := c.UnmarshalJSON(e); err != nil {
			return &Error{Path: index(path, i), Err: err}
		}
	}
	return &Error{Path: path, Err: describe(err)}
}

// codeList returns the codes of list sorted, each once, or nil when list
// is empty, so that a parsed Config has one form for one set of codes.
func codeList(list []code) []codes.Code {
	if len(list) == 0 {
		return nil
	}
	var s rescodes.Set
	for _, c := range list {
		s = s.With(codes.Code(c))
	}
	return s.Codes()
}

// decimal is a JSON number kept with its text, so that tokenRatio can be cut
// to three decimals exactly as written. It decodes as a float64 does (null is
// a no-op; anything but a number in float64 range is an error).
type decimal struct {
	f    float64
	text string
}

func (d *decimal) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if err := json.Unmarshal(b, &d.f); err != nil {
		return err
	}
	d.text = string(b)
	return nil
}

// truncMilli returns the number written as text (a JSON number whose value is
// f) with the digits past the third decimal dropped, toward zero, as gRFC A6
// says of tokenRatio ("up to 3 decimal places are supported"). The cut is
// done on the decimal digits, so "1.005" gives 1.005, not 1.004. Values of
// 10^12 or more have no digits to drop at float64 precision and come back as
// ratioMilli is truncMilli for tokenRatio, with the cut kept positive: a
// ratio in (0, 0.001), which A6 allows (it asks only for a positive value)
// and grpc-go accepts, is raised to 0.001, the smallest ratio three decimals
// hold, rather than cut to 0, which would leave a bucket that never refills.
func ratioMilli(text string, f float64) float64 {
	r := truncMilli(text, f)
	if r == 0 && f > 0 {
		return minTokenRatio
	}
	return r
}

// f.
func truncMilli(text string, f float64) float64 {
	if math.Abs(f) >= 1e12 {
		return f
	}
	neg := strings.HasPrefix(text, "-")
	text = strings.TrimPrefix(text, "-")
	mant, exp := text, 0
	if i := strings.IndexAny(text, "eE"); i >= 0 {
		e, err := strconv.Atoi(text[i+1:])
		if err != nil { // an exponent too large to matter either way
			return f
		}
		mant, exp = text[:i], e
	}
	digits := mant
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		digits = mant[:i] + mant[i+1:]
		exp -= len(mant) - i - 1
	}
	// value = digits × 10^exp; keep digits × 10^(exp+3), truncated.
	shift := exp + 3
	if shift >= 0 {
		return f // no digit past the third decimal
	}
	keep := len(digits) + shift
	if keep <= 0 {
		return math.Copysign(0, f)
	}
	digits = strings.TrimLeft(digits[:keep], "0")
	if digits == "" {
		return math.Copysign(0, f)
	}
	if len(digits) > 15 { // cannot happen below 10^12; be safe
		return f
	}
	m, _ := strconv.ParseInt(digits, 10, 64)
	if neg {
		m = -m
	}
	return float64(m) / 1000
}

// config converts and validates the decoded document.
func (w *wireConfig) config(o parseOptions) (*Config, error) {
	c := &Config{maxAttemptsCap: o.maxAttemptsCap}
	if w.MethodConfig != nil {
		seen := make(map[string]string)
		for i := range *w.MethodConfig {
			mc, keep, err := (*w.MethodConfig)[i].method(o, seen, i)
			if err != nil {
				return nil, prefix(index("methodConfig", i), err)
			}
			if keep {
				c.MethodConfig = append(c.MethodConfig, mc)
			}
		}
	}
	if t := w.RetryThrottling; t != nil {
		if err := checkAll("retryThrottling",
			field{"maxTokens", &t.MaxTokens},
			field{"tokenRatio", &t.TokenRatio},
		); err != nil {
			return nil, err
		}
		c.RetryThrottling = &RetryThrottling{
			MaxTokens:  t.MaxTokens.v,
			TokenRatio: ratioMilli(t.TokenRatio.v.text, t.TokenRatio.v.f),
		}
		// gRFC A6 correction: grpc-go checks retryThrottling only when
		// methodConfig is present.
		if err := c.RetryThrottling.Validate(); err != nil {
			return nil, prefix("retryThrottling", err)
		}
	}
	if b := w.RetryBudget; b != nil {
		if err := checkAll("retryBudget",
			field{"ratio", &b.Ratio},
			field{"minRetriesPerSecond", &b.MinRetriesPerSecond},
			field{"ttl", &b.TTL},
		); err != nil {
			return nil, err
		}
		c.RetryBudget = &RetryBudget{
			Ratio:               b.Ratio.v,
			MinRetriesPerSecond: b.MinRetriesPerSecond.v,
			TTL:                 optDuration(b.TTL.v),
		}
		ratioZero := b.Ratio.written() && b.Ratio.v == 0
		minZero := b.MinRetriesPerSecond.written() && b.MinRetriesPerSecond.v == 0
		switch {
		case ratioZero && minZero:
			c.RetryBudget.Zero = true // the kill switch: no retry at all
		case ratioZero:
			return nil, &Error{Path: "retryBudget.ratio", Err: errors.New("0 written out alone: a budget has no zero share of requests beside a reserve; " +
				"write minRetriesPerSecond: 0 too for a budget that pays for no retry (the kill switch), or leave ratio out for its default, 0.2")}
		case minZero:
			return nil, &Error{Path: "retryBudget.minRetriesPerSecond", Err: errors.New("0 written out alone: a budget has no zero reserve beside a share of requests; " +
				"write ratio: 0 too for a budget that pays for no retry (the kill switch), or leave minRetriesPerSecond out for its default, 10")}
		}
		if err := c.RetryBudget.Validate(); err != nil {
			return nil, prefix("retryBudget", err)
		}
	}
	if err := checkAll("",
		field{"loadBalancingPolicy", &w.LoadBalancingPolicy},
		field{"loadBalancingConfig", &w.LoadBalancingConfig},
	); err != nil {
		return nil, err
	}
	if p := w.LoadBalancingPolicy.v; p != nil {
		c.LoadBalancingPolicy = *p
	}
	if raw := w.LoadBalancingConfig.v; raw != nil {
		if err := checkLoadBalancingConfig(*raw); err != nil {
			return nil, err
		}
		// Keep it as json.Marshal writes it, so that it survives a round trip.
		var compact, escaped bytes.Buffer
		if err := json.Compact(&compact, *raw); err != nil { // cannot fail: raw is valid JSON
			return nil, &Error{Path: "loadBalancingConfig", Err: err}
		}
		json.HTMLEscape(&escaped, compact.Bytes())
		c.LoadBalancingConfig = escaped.Bytes()
	}
	if h := w.HealthCheckConfig; h != nil {
		if err := h.ServiceName.check("healthCheckConfig.serviceName"); err != nil {
			return nil, err
		}
		c.HealthCheckConfig = &HealthCheckConfig{ServiceName: h.ServiceName.v}
	}
	return c, nil
}

// method converts entry i of methodConfig. keep is false for an entry whose
// name is absent or null: grpc-go skips it after decoding, without checking
// its policies, and so does Parse. Errors have paths relative to the entry.
func (m *wireMethod) method(o parseOptions, seen map[string]string, i int) (mc MethodConfig, keep bool, err error) {
	if m.Name != nil {
		for j := range *m.Name {
			n := &(*m.Name)[j]
			if err := checkAll(index("name", j),
				field{"service", &n.Service},
				field{"method", &n.Method},
			); err != nil {
				return mc, false, err
			}
		}
	}
	if err := checkAll("",
		field{"waitForReady", &m.WaitForReady},
		field{"timeout", &m.Timeout},
		field{"maxRequestMessageBytes", &m.MaxRequestMessageBytes},
		field{"maxResponseMessageBytes", &m.MaxResponseMessageBytes},
	); err != nil {
		return mc, false, err
	}
	if r := m.RetryPolicy; r != nil {
		if err := checkAll("retryPolicy",
			field{"maxAttempts", &r.MaxAttempts},
			field{"initialBackoff", &r.InitialBackoff},
			field{"maxBackoff", &r.MaxBackoff},
			field{"backoffMultiplier", &r.BackoffMultiplier},
			field{"retryableStatusCodes", &r.RetryableStatusCodes},
			field{"perAttemptRecvTimeout", &r.PerAttemptRecvTimeout},
			field{"jitter", &r.Jitter},
		); err != nil {
			return mc, false, err
		}
	}
	if h := m.HedgingPolicy; h != nil {
		if err := checkAll("hedgingPolicy",
			field{"maxAttempts", &h.MaxAttempts},
			field{"hedgingDelay", &h.HedgingDelay},
			field{"nonFatalStatusCodes", &h.NonFatalStatusCodes},
			field{"hedgingDelayQuantile", &h.HedgingDelayQuantile},
			field{"hedgingDelayFloor", &h.HedgingDelayFloor},
			field{"hedgingDelayMinSamples", &h.HedgingDelayMinSamples},
		); err != nil {
			return mc, false, err
		}
	}
	if b := m.CircuitBreaker; b != nil {
		if err := checkAll("circuitBreaker",
			field{"mode", &b.Mode},
			field{"k", &b.K},
			field{"consecutiveFailures", &b.ConsecutiveFailures},
			field{"failureRateThreshold", &b.FailureRateThreshold},
			field{"slowCallDuration", &b.SlowCallDuration},
			field{"slowCallRateThreshold", &b.SlowCallRateThreshold},
			field{"minimumCalls", &b.MinimumCalls},
			field{"window", &b.Window},
			field{"openDuration", &b.OpenDuration},
			field{"maxOpenDuration", &b.MaxOpenDuration},
			field{"halfOpenProbes", &b.HalfOpenProbes},
			field{"failureStatusCodes", &b.FailureStatusCodes},
		); err != nil {
			return mc, false, err
		}
	}
	if b := m.Bulkhead; b != nil {
		if err := checkAll("bulkhead",
			field{"maxConcurrent", &b.MaxConcurrent},
			field{"maxQueue", &b.MaxQueue},
			field{"maxQueueWait", &b.MaxQueueWait},
		); err != nil {
			return mc, false, err
		}
	}
	if r := m.RateLimit; r != nil {
		if err := r.check("rateLimit"); err != nil {
			return mc, false, err
		}
	}
	if m.Name == nil {
		return mc, false, nil
	}

	mc.Name = make([]Name, 0, len(*m.Name))
	for _, n := range *m.Name {
		mc.Name = append(mc.Name, Name{Service: n.Service.v, Method: n.Method.v})
	}
	mc.WaitForReady = m.WaitForReady.v
	// grpc-go ignores a negative timeout. "0s" is a deadline that has
	// passed when the call starts, which grpc-go fails at once with
	// DEADLINE_EXCEEDED: it is kept as 1ns, the shortest timeout, as a zero
	// Timeout means none.
	if t := m.Timeout.v; t != nil && *t >= 0 {
		mc.Timeout = max(time.Duration(*t), time.Nanosecond)
	}
	mc.MaxRequestMessageBytes = m.MaxRequestMessageBytes.v
	mc.MaxResponseMessageBytes = m.MaxResponseMessageBytes.v
	if r := m.RetryPolicy; r != nil {
		if mc.RetryPolicy, err = r.policy(o); err != nil {
			return mc, false, prefix("retryPolicy", err)
		}
	}
	if h := m.HedgingPolicy; h != nil {
		if mc.HedgingPolicy, err = h.policy(o); err != nil {
			return mc, false, prefix("hedgingPolicy", err)
		}
	}
	if b := m.CircuitBreaker; b != nil {
		mc.CircuitBreaker = &CircuitBreaker{
			Mode:                  b.Mode.v,
			K:                     b.K.v,
			ConsecutiveFailures:   b.ConsecutiveFailures.v,
			FailureRateThreshold:  b.FailureRateThreshold.v,
			SlowCallDuration:      optDuration(b.SlowCallDuration.v),
			SlowCallRateThreshold: b.SlowCallRateThreshold.v,
			MinimumCalls:          b.MinimumCalls.v,
			Window:                optDuration(b.Window.v),
			OpenDuration:          optDuration(b.OpenDuration.v),
			MaxOpenDuration:       optDuration(b.MaxOpenDuration.v),
			HalfOpenProbes:        b.HalfOpenProbes.v,
			FailureStatusCodes:    codeList(b.FailureStatusCodes.v),
		}
	}
	if b := m.Bulkhead; b != nil {
		mc.Bulkhead = &Bulkhead{
			MaxConcurrent: b.MaxConcurrent.v,
			MaxQueue:      b.MaxQueue.v,
			MaxQueueWait:  optDuration(b.MaxQueueWait.v),
		}
	}
	if r := m.RateLimit; r != nil {
		if mc.RateLimit, err = r.limit(); err != nil {
			return mc, false, prefix("rateLimit", err)
		}
	}
	if err := mc.validate(seen, i); err != nil {
		return mc, false, err
	}
	return mc, true, nil
}

// policy checks the fields gRFC A6 requires of a retryPolicy, as grpc-go
// does, and returns the policy with MaxAttempts capped.
func (r *wireRetry) policy(o parseOptions) (*RetryPolicy, error) {
	switch {
	case r.MaxAttempts.v <= 1:
		return nil, required("maxAttempts", r.MaxAttempts.set, "must be greater than 1")
	case r.InitialBackoff.v <= 0:
		return nil, required("initialBackoff", r.InitialBackoff.set, "must be greater than 0")
	case r.MaxBackoff.v <= 0:
		return nil, required("maxBackoff", r.MaxBackoff.set, "must be greater than 0")
	case !(r.BackoffMultiplier.v > 0):
		return nil, required("backoffMultiplier", r.BackoffMultiplier.set, "must be greater than 0")
	case len(r.RetryableStatusCodes.v) == 0:
		return nil, required("retryableStatusCodes", r.RetryableStatusCodes.set, "must not be empty")
	}
	return &RetryPolicy{
		MaxAttempts:           min(r.MaxAttempts.v, o.maxAttemptsCap),
		InitialBackoff:        time.Duration(r.InitialBackoff.v),
		MaxBackoff:            time.Duration(r.MaxBackoff.v),
		BackoffMultiplier:     r.BackoffMultiplier.v,
		RetryableStatusCodes:  codeList(r.RetryableStatusCodes.v),
		PerAttemptRecvTimeout: optDuration(r.PerAttemptRecvTimeout.v),
		Jitter:                Jitter(r.Jitter.v),
	}, nil
}

// policy checks the fields gRFC A6 requires of a hedgingPolicy and returns
// the policy with MaxAttempts capped.
func (h *wireHedging) policy(o parseOptions) (*HedgingPolicy, error) {
	if h.MaxAttempts.v <= 1 {
		return nil, required("maxAttempts", h.MaxAttempts.set, "must be greater than 1")
	}
	p := &HedgingPolicy{
		MaxAttempts:         min(h.MaxAttempts.v, o.maxAttemptsCap),
		HedgingDelay:        optDuration(h.HedgingDelay.v),
		NonFatalStatusCodes: codeList(h.NonFatalStatusCodes.v),
		HedgingDelayFloor:   optDuration(h.HedgingDelayFloor.v),
	}
	switch q := h.HedgingDelayQuantile.v; {
	case q != nil:
		// A quantile written as 0 is not "off": the document asks for one.
		if !(*q > 0 && *q < 1) {
			return nil, newError("hedgingDelayQuantile", "must be between 0 and 1, exclusive")
		}
		p.HedgingDelayQuantile = *q
		if n := h.HedgingDelayMinSamples.v; n != nil {
			p.HedgingDelayMinSamples = *n // 0, the default: warned (warningsOf)
		}
	// The fields that need a quantile need it even when written as 0.
	case h.HedgingDelayFloor.v != nil:
		return nil, newError("hedgingDelayFloor", "needs hedgingDelayQuantile")
	case h.HedgingDelayMinSamples.v != nil:
		return nil, newError("hedgingDelayMinSamples", "needs hedgingDelayQuantile")
	}
	return p, nil
}

// required returns an *Error at path with msg, saying the field is required
// when the document did not have it.
func required(path string, set bool, msg string) error {
	if !set {
		msg = "is required and " + msg
	}
	return newError(path, msg)
}

func optDuration(d *duration) time.Duration {
	if d == nil {
		return 0
	}
	return time.Duration(*d)
}

// checkLoadBalancingConfig checks the shape of loadBalancingConfig as
// grpc-go's gracefulswitch.ParseConfig does: an array of objects with exactly
// one key, the policy name, read in order up to the first policy grpc-go
// supports. grpc-go knows its supported policies from the balancer registry
// of the running program; a pure data package cannot, so only the two that
// package grpc always registers are recognised: pick_first (whose config is
// checked as pick_first checks it) and round_robin. A list with neither is
// accepted here; grpc-go accepts it only if the program registered one of
// its policies.
func checkLoadBalancingConfig(raw json.RawMessage) error {
	const path = "loadBalancingConfig"
	var list []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return &Error{Path: path, Err: errors.New(`must be an array of objects such as {"round_robin": {}}`)}
	}
	if len(list) == 0 {
		return newError(path, "must name at least one policy")
	}
	for i, e := range list {
		if len(e) != 1 {
			return newError(index(path, i), "must hold exactly one policy, not "+itoa(len(e)))
		}
		for name, cfg := range e {
			switch name {
			case "pick_first":
				var pf struct {
					ShuffleAddressList bool `json:"shuffleAddressList"`
				}
				if err := json.Unmarshal(cfg, &pf); err != nil {
					return &Error{Path: join(index(path, i), name), Err: describe(err)}
				}
				return nil
			case "round_robin":
				return nil
			case EndpointPolicyName:
				if _, err := ParseEndpointPolicy(cfg); err != nil {
					return prefix(join(index(path, i), name), err)
				}
				return nil
			}
		}
	}
	return nil
}

// decodeError turns an error of json.Unmarshal on the whole document into an
// *Error with the path of the value at fault.
func decodeError(data []byte, err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		line, col := lineCol(data, se.Offset)
		msg := "invalid JSON at line " + itoa(line) + ", column " + itoa(col) + ": " + se.Error()
		return &Error{Path: pathAt(data, se.Offset-1), Err: errors.New(msg)}
	case errors.As(err, &te):
		return &Error{Path: pathAt(data, te.Offset-1), Err: describe(te)}
	}
	return &Error{Err: err}
}

// lineCol returns the 1-based line and column of the byte encoding/json
// complained about when it reported an error after reading off bytes.
func lineCol(data []byte, off int64) (line, col int) {
	pos := int(max(0, min(off-1, int64(len(data)))))
	before := data[:pos]
	return 1 + bytes.Count(before, []byte{'\n'}), pos - bytes.LastIndexByte(before, '\n')
}

// describe rewords a decoding error as the rule it breaks.
func describe(err error) error {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return err
	}
	want := kindName(te.Type)
	if lit, ok := strings.CutPrefix(te.Value, "number "); ok {
		if !strings.ContainsAny(lit, ".eE") || want == "a number" {
			return errors.New(lit + " is out of range")
		}
		return errors.New("must be " + want + ", not " + lit)
	}
	got := te.Value
	switch got {
	case "object", "array":
		got = "an " + got
	case "bool":
		got = "true or false"
	default:
		got = "a " + got
	}
	return errors.New("must be " + want + ", not " + got)
}

// kindName names the JSON value that decodes into t.
func kindName(t reflect.Type) string {
	if t == nil {
		return "a different value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}

// jsonKind names the kind of the JSON value b, for error messages.
func jsonKind(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return "nothing"
	}
	switch b[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "true or false"
	case 'n':
		return "null"
	}
	return "a number"
}
