package serviceconfig

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"

	"google.golang.org/grpc/codes"
)

// Error is a configuration error: what is wrong (Err) and where (Path, the
// JSON path of the offending value, such as
// "methodConfig[1].retryPolicy.maxAttempts"). Errors of Validate name paths
// relative to the policy they check.
type Error struct {
	Path string
	Err  error
}

// Error returns "serviceconfig: <path>: <err>".
func (e *Error) Error() string {
	if e.Path == "" {
		return "serviceconfig: " + e.Err.Error()
	}
	return "serviceconfig: " + e.Path + ": " + e.Err.Error()
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// newError returns an *Error at path with the message msg.
func newError(path, msg string) *Error {
	return &Error{Path: path, Err: errors.New(msg)}
}

// prefix returns err with p joined in front of its path when err is an
// *Error, and err unchanged otherwise.
func prefix(p string, err error) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	path := p
	switch {
	case e.Path == "":
	case e.Path[0] == '[':
		path += e.Path
	default:
		path += "." + e.Path
	}
	return &Error{Path: path, Err: e.Err}
}

func checkDuration(path string, d time.Duration) error {
	if d < 0 {
		return newError(path, "must not be negative")
	}
	return nil
}

// checkCodes reports the first code of list outside 0 to 16.
func checkCodes(path string, list []codes.Code) error {
	for i, c := range list {
		if c > codes.Unauthenticated {
			return newError(index(path, i), "code "+strconv.FormatUint(uint64(c), 10)+" is not a gRPC status code (0 to 16)")
		}
	}
	return nil
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// Validate reports the first field of p that is out of range. Zero fields are
// valid: they mean the documented defaults.
func (p *RetryPolicy) Validate() error {
	switch {
	case p.MaxAttempts < 0:
		return newError("maxAttempts", "must not be negative")
	case p.BackoffMultiplier < 0 || !finite(p.BackoffMultiplier):
		return newError("backoffMultiplier", "must be a finite number greater than 0")
	case !p.Jitter.valid():
		return newError("jitter", `must be one of "a6", "full", "equal", "decorrelated", "none"`)
	}
	if err := checkDuration("initialBackoff", p.InitialBackoff); err != nil {
		return err
	}
	if err := checkDuration("maxBackoff", p.MaxBackoff); err != nil {
		return err
	}
	if err := checkDuration("perAttemptRecvTimeout", p.PerAttemptRecvTimeout); err != nil {
		return err
	}
	return checkCodes("retryableStatusCodes", p.RetryableStatusCodes)
}

// Validate reports the first field of p that is out of range.
func (p *HedgingPolicy) Validate() error {
	if p.MaxAttempts < 2 {
		return newError("maxAttempts", "must be greater than 1")
	}
	if err := checkDuration("hedgingDelay", p.HedgingDelay); err != nil {
		return err
	}
	if err := checkCodes("nonFatalStatusCodes", p.NonFatalStatusCodes); err != nil {
		return err
	}
	return p.validateAdaptive()
}

// validateAdaptive checks the adaptive-delay extension fields of p.
func (p *HedgingPolicy) validateAdaptive() error {
	switch q := p.HedgingDelayQuantile; {
	case q != 0 && !(q > 0 && q < 1):
		return newError("hedgingDelayQuantile", "must be between 0 and 1, exclusive")
	case p.HedgingDelayFloor < 0:
		return newError("hedgingDelayFloor", "must not be negative")
	case p.HedgingDelayMinSamples < 0:
		return newError("hedgingDelayMinSamples", "must not be negative")
	case q == 0 && p.HedgingDelayFloor != 0:
		return newError("hedgingDelayFloor", "needs hedgingDelayQuantile")
	case q == 0 && p.HedgingDelayMinSamples != 0:
		return newError("hedgingDelayMinSamples", "needs hedgingDelayQuantile")
	}
	return nil
}

// minTokenRatio is the smallest TokenRatio three decimals hold; a positive
// ratio below it runs as it.
const minTokenRatio = 0.001

// Validate reports the first field of t that is out of range, as gRFC A6
// sets them: MaxTokens must be in (0, 1000] and TokenRatio greater than 0.
func (t *RetryThrottling) Validate() error {
	if !(t.MaxTokens > 0 && t.MaxTokens <= 1000) {
		return newError("maxTokens", "must be greater than 0 and at most 1000")
	}
	if !(t.TokenRatio > 0) || !finite(t.TokenRatio) {
		return newError("tokenRatio", "must be greater than 0")
	}
	return nil
}

// Validate reports the first field of b that is out of range.
func (b *RetryBudget) Validate() error {
	if b.Zero && (b.Ratio != 0 || b.MinRetriesPerSecond != 0) {
		return newError("ratio", "must be 0, with minRetriesPerSecond, in a zero budget (Zero)")
	}
	if !(b.Ratio >= 0 && b.Ratio <= 1000) {
		return newError("ratio", "must be between 0 and 1000")
	}
	if !(b.MinRetriesPerSecond >= 0) || !finite(b.MinRetriesPerSecond) {
		return newError("minRetriesPerSecond", "must not be negative")
	}
	return checkDuration("ttl", b.TTL)
}

// Validate reports the first field of c that is out of range.
func (c *CircuitBreaker) Validate() error {
	switch c.Mode {
	case "":
		if c.K != 0 {
			return newError("k", `is used only in mode "adaptive"`)
		}
	case ModeAdaptive:
		return c.validateAdaptive()
	default:
		return newError("mode", `must be "adaptive" or absent`)
	}
	switch {
	case c.ConsecutiveFailures < 0:
		return newError("consecutiveFailures", "must not be negative")
	case !(c.FailureRateThreshold >= 0 && c.FailureRateThreshold <= 1):
		return newError("failureRateThreshold", "must be between 0 and 1")
	case !(c.SlowCallRateThreshold >= 0 && c.SlowCallRateThreshold <= 1):
		return newError("slowCallRateThreshold", "must be between 0 and 1")
	case c.SlowCallRateThreshold > 0 && c.SlowCallDuration == 0:
		return newError("slowCallDuration", "must be set when slowCallRateThreshold is")
	case c.MinimumCalls < 0:
		return newError("minimumCalls", "must not be negative")
	case c.HalfOpenProbes < 0:
		return newError("halfOpenProbes", "must not be negative")
	case c.MaxOpenDuration > 0 && c.MaxOpenDuration < c.OpenDuration:
		return newError("maxOpenDuration", "must not be less than openDuration")
	}
	for _, d := range []struct {
		path string
		d    time.Duration
	}{
		{"slowCallDuration", c.SlowCallDuration},
		{"window", c.Window},
		{"openDuration", c.OpenDuration},
		{"maxOpenDuration", c.MaxOpenDuration},
	} {
		if err := checkDuration(d.path, d.d); err != nil {
			return err
		}
	}
	return checkCodes("failureStatusCodes", c.FailureStatusCodes)
}

// Validate reports the first field of b that is out of range.
func (b *Bulkhead) Validate() error {
	switch {
	case b.MaxConcurrent <= 0:
		return newError("maxConcurrent", "must be greater than 0")
	case b.MaxQueue < 0:
		return newError("maxQueue", "must not be negative")
	}
	return checkDuration("maxQueueWait", b.MaxQueueWait)
}

// Validate checks every entry and block of c, as Parse does for a document,
// and returns the first error with its JSON path: an invalid policy, a Name
// with a method but no service, a name that appears twice, an entry with
// both a retry and a hedging policy, or a loadBalancingConfig of the wrong
// shape.
//
// Validate checks ranges, not the fields gRFC A6 requires in a document:
// zero fields of a policy written in Go mean the documented defaults.
func (c *Config) Validate() error {
	seen := make(map[string]string)
	for i := range c.MethodConfig {
		if err := c.MethodConfig[i].validate(seen, i); err != nil {
			return prefix(index("methodConfig", i), err)
		}
	}
	if c.RetryThrottling != nil {
		if err := c.RetryThrottling.Validate(); err != nil {
			return prefix("retryThrottling", err)
		}
	}
	if c.RetryBudget != nil {
		if err := c.RetryBudget.Validate(); err != nil {
			return prefix("retryBudget", err)
		}
	}
	if c.LoadBalancingConfig != nil {
		if !json.Valid(c.LoadBalancingConfig) {
			return newError("loadBalancingConfig", "is not valid JSON")
		}
		if err := checkLoadBalancingConfig(c.LoadBalancingConfig); err != nil {
			return err
		}
	}
	return nil
}

// key returns the key grpc-go files a name under: "/service/method",
// "/service/" for a whole service, "" for the default. Two names are the same
// name when their keys are equal, so {"a/b", "c"} and {"a", "b/c"} collide in
// grpc-go, and here too.
func (n Name) key() string {
	if n.Service == "" {
		return ""
	}
	return "/" + n.Service + "/" + n.Method
}

// Validate reports a name that no well-formed call carries, quoting the part
// at fault: a method without a service; a service or method holding a
// slash (grpc's full method "/package.Service/Method" is written as
// {Service: "package.Service", Method: "Method"}), a space or a control
// character; a service with an empty dotted part, such as protoc's
// ".package.Service". The empty Name, the default, is valid.
func (n Name) Validate() error {
	switch {
	case n.Service == "" && n.Method != "":
		return &Error{Err: errors.New("method " + strconv.Quote(n.Method) + " set without service")}
	case strings.Contains(n.Service, "/"):
		return &Error{Err: errors.New(slashedService(n))}
	case strings.Contains(n.Method, "/"):
		return &Error{Err: errors.New("method " + strconv.Quote(n.Method) +
			` holds a slash: a method is its bare name, such as "` + lastPart(n.Method) + `"`)}
	}
	for _, part := range []struct{ what, s string }{{"service", n.Service}, {"method", n.Method}} {
		if i := strings.IndexFunc(part.s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }); i >= 0 {
			return &Error{Err: errors.New(part.what + " " + strconv.Quote(part.s) + " holds a space or control character")}
		}
	}
	if s := n.Service; s != "" && (strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") || strings.Contains(s, "..")) {
		return &Error{Err: errors.New("service " + strconv.Quote(s) + ` has an empty part: write it as "` +
			strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == '.' }), ".") + `", package and service`)}
	}
	return nil
}

// slashedService explains a Service holding a slash and says what to write.
func slashedService(n Name) string {
	msg := "service " + strconv.Quote(n.Service) + " holds a slash"
	svc, method, ok := strings.Cut(strings.Trim(n.Service, "/"), "/")
	switch {
	case svc == "":
	case ok && n.Method == "" && method != "" && !strings.Contains(method, "/"):
		msg += `: for one method write {"service": "` + svc + `", "method": "` + method + `"}`
	case !ok:
		msg += `: write "` + svc + `"`
	}
	return msg
}

// lastPart returns what follows the last slash of s.
func lastPart(s string) string {
	return s[strings.LastIndexByte(s, '/')+1:]
}

// validate checks mc, entry i of methodConfig; seen maps the key of every
// name met so far to its path, and gets mc's names. Paths are relative to
// the entry.
func (mc *MethodConfig) validate(seen map[string]string, entry int) error {
	for j, n := range mc.Name {
		path := index("name", j)
		if err := n.Validate(); err != nil {
			return prefix(path, err)
		}
		k := n.key()
		if first, dup := seen[k]; dup {
			return newError(path, "duplicates the name at "+first)
		}
		seen[k] = index("methodConfig", entry) + "." + path
	}
	if mc.Timeout < 0 {
		return newError("timeout", "must not be negative")
	}
	if mc.RetryPolicy != nil && mc.HedgingPolicy != nil {
		return newError("hedgingPolicy", "cannot be set together with retryPolicy")
	}
	checks := []struct {
		path string
		ok   bool
		v    interface{ Validate() error }
	}{
		{"retryPolicy", mc.RetryPolicy != nil, mc.RetryPolicy},
		{"hedgingPolicy", mc.HedgingPolicy != nil, mc.HedgingPolicy},
		{"circuitBreaker", mc.CircuitBreaker != nil, mc.CircuitBreaker},
		{"bulkhead", mc.Bulkhead != nil, mc.Bulkhead},
		{"rateLimit", mc.RateLimit != nil, mc.RateLimit},
	}
	for _, c := range checks {
		if !c.ok {
			continue
		}
		if err := c.v.Validate(); err != nil {
			return prefix(c.path, err)
		}
	}
	return nil
}

func itoa(i int) string { return strconv.Itoa(i) }

// ModeAdaptive is the CircuitBreaker mode of client-side adaptive
// throttling.
const ModeAdaptive = "adaptive"

// validateAdaptive checks a block in mode "adaptive": K and Window only.
func (c *CircuitBreaker) validateAdaptive() error {
	if !(c.K == 0 || c.K >= 1 && c.K <= 100) {
		return newError("k", "must be between 1 and 100")
	}
	for _, f := range []struct {
		path string
		set  bool
	}{
		{"consecutiveFailures", c.ConsecutiveFailures != 0},
		{"failureRateThreshold", c.FailureRateThreshold != 0},
		{"slowCallDuration", c.SlowCallDuration != 0},
		{"slowCallRateThreshold", c.SlowCallRateThreshold != 0},
		{"minimumCalls", c.MinimumCalls != 0},
		{"openDuration", c.OpenDuration != 0},
		{"maxOpenDuration", c.MaxOpenDuration != 0},
		{"halfOpenProbes", c.HalfOpenProbes != 0},
		{"failureStatusCodes", len(c.FailureStatusCodes) > 0},
	} {
		if f.set {
			return newError(f.path, `is not used in mode "adaptive"`)
		}
	}
	return checkDuration("window", c.Window)
}
