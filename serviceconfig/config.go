package serviceconfig

import (
	"encoding/json"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
)

// DefaultMaxAttemptsCap is the largest MaxAttempts a retry or hedging policy
// may have unless the cap is raised explicitly, as in grpc-go and gRFC A6.
const DefaultMaxAttemptsCap = 5

// Config is a parsed service config: the gRFC A6 fields grpc-go understands,
// plus this module's extension blocks. The zero value is a valid, empty
// config under which no method has a policy.
type Config struct {
	// MethodConfig lists the per-method entries in document order.
	MethodConfig []MethodConfig

	// RetryThrottling, when set, is gRFC A6's client-wide token bucket.
	RetryThrottling *RetryThrottling

	// RetryBudget, when set, caps retries to a share of requests over a
	// sliding window, for all methods of a client. An extension block.
	RetryBudget *RetryBudget

	// LoadBalancingPolicy, LoadBalancingConfig and HealthCheckConfig are
	// carried for fidelity, so that a marshalled Config is the document grpc
	// read; grpc itself applies them. LoadBalancingPolicy is "" when absent.
	// LoadBalancingConfig is the loadBalancingConfig list as compact JSON, nil
	// when absent.
	LoadBalancingPolicy string
	LoadBalancingConfig json.RawMessage
	HealthCheckConfig   *HealthCheckConfig

	// maxAttemptsCap is the cap Parse lowered MaxAttempts to; 0 for a
	// Config built in Go.
	maxAttemptsCap int

	// warnings are Parse's warnings about the document: its unknown keys
	// in document order, then its entries that select no method.
	warnings []*Warning
}

// Warnings returns what Parse found questionable in the document that it
// still accepted, each a *Warning naming a JSON path, or nil for a Config
// built in Go. Unknown keys in gRFC A6's own objects come first, in
// document order: grpc-go ignores them, and so does Parse (a key that is
// one of this module's own misspelt or misplaced is an error instead),
// each with the known key it most likely misspells. Those are of kind
// [WarningIgnoredKey], and so is a negative timeout, which grpc-go
// ignores (the methods get no timeout). Then, only in a Config parsed with
// [Lenient], the
// problems that change which methods a policy covers, of kind
// [WarningCoverage], which Parse otherwise refuses. svcconfig check prints
// the warnings, and fails on them with -strict; a Client logs them once.
func (c *Config) Warnings() []*Warning { return c.warnings }

// Warning is one of Parse's warnings about a document it accepted: where
// (Path, a JSON path), what (Err), and what it does to the config (Kind).
// Its Error text has the form of an *Error's.
type Warning struct {
	Kind WarningKind
	Path string
	Err  error
}

// Error returns "serviceconfig: <path>: <err>", as Error.Error does.
func (w *Warning) Error() string { return (&Error{Path: w.Path, Err: w.Err}).Error() }

// Unwrap returns Err.
func (w *Warning) Unwrap() error { return w.Err }

// WarningKind says what the problem a Warning reports does to the config.
type WarningKind uint8

const (
	// WarningIgnoredKey is an unknown key in gRFC A6's objects, ignored as
	// grpc-go ignores it, or a value grpc-go ignores (a negative timeout).
	// The field keeps its default, but which methods each policy covers
	// does not change.
	WarningIgnoredKey WarningKind = iota + 1
	// WarningCoverage changes which methods a policy covers: a typo that
	// widens an entry to every method (a name holding an unknown key, or
	// null, or a key given twice), or
	// leaves a policy applying to no method (an entry without a name, a
	// misspelt methodConfig). Parse refuses these unless given [Lenient].
	WarningCoverage
)

// String returns "ignored key" or "coverage".
func (k WarningKind) String() string {
	switch k {
	case WarningIgnoredKey:
		return "ignored key"
	case WarningCoverage:
		return "coverage"
	}
	return "WarningKind(" + itoa(int(k)) + ")"
}

// MaxAttemptsCap returns the cap on MaxAttempts that Parse applied to c (5
// unless WithMaxAttemptsCap changed it), or 0 when c was built in Go. A
// client runs a parsed config's MaxAttempts as they are, even above its own
// cap, so that a document parsed with a raised cap is never clamped a
// second time; it caps only what Go code and call options ask for.
func (c *Config) MaxAttemptsCap() int { return c.maxAttemptsCap }

// HealthCheckConfig is the service config's healthCheckConfig: the service
// name grpc's client-side health checking asks about.
type HealthCheckConfig struct {
	ServiceName string
}

// Name selects the methods a MethodConfig applies to. Service and Method are
// both set for one method; Service alone selects every method of a service;
// both empty is the default for every method. Method without Service is
// invalid, and so is a name that no well-formed call carries (see Validate):
// grpc's full method "/shop.Orders/Pay" is {Service: "shop.Orders",
// Method: "Pay"}.
type Name struct {
	// Service is the fully qualified service name, such as "shop.Orders".
	Service string `json:"service,omitempty"`
	// Method is the method name within the service, such as "Create".
	Method string `json:"method,omitempty"`
}

// MethodConfig is one entry of methodConfig: the policies for the methods its
// Name list selects. Nil pointers mean the policy is absent.
type MethodConfig struct {
	// Name lists the methods this entry applies to. An entry with no names
	// applies to no method.
	Name []Name

	// WaitForReady, when set, overrides the channel's wait-for-ready
	// behaviour for these methods.
	WaitForReady *bool

	// Timeout, when positive, is a deadline over all attempts of a call; it
	// never extends the caller's own deadline. Zero means no timeout. A
	// document's "timeout": "0s" parses to 1ns, the shortest timeout (gRFC
	// A6 leaves zero undefined; grpc-go fails such calls at once with
	// DEADLINE_EXCEEDED, and so does a Client: a timeout of 1ns has passed
	// when the call starts).
	Timeout time.Duration

	// MaxRequestMessageBytes and MaxResponseMessageBytes are carried for
	// fidelity with gRFC A6; grpc itself applies them.
	MaxRequestMessageBytes  *int64
	MaxResponseMessageBytes *int64

	// RetryPolicy retries failed attempts. At most one of RetryPolicy and
	// HedgingPolicy is set.
	RetryPolicy *RetryPolicy

	// HedgingPolicy sends several attempts without waiting for failures.
	HedgingPolicy *HedgingPolicy

	// CircuitBreaker, an extension block, fails calls fast while the method
	// is unhealthy. Each selected method gets a breaker of its own.
	CircuitBreaker *CircuitBreaker

	// Bulkhead, an extension block, bounds the attempts of each selected
	// method in flight and queued.
	Bulkhead *Bulkhead

	// RateLimit, an extension block, paces each selected method while its
	// server pushes back, and limits the attempts the client sends when
	// its Rate is set.
	RateLimit *ClientRateLimit
}

// Lookup returns the entry that applies to fullMethod ("/pkg.Service/Method",
// as grpc gives it): the entry naming that exact method, else the entry naming
// its service, else the default entry (a Name with neither field set).
// Entries at different levels are not merged. Lookup reports false when no
// entry applies. A name without the leading slash is accepted.
//
// Names match as grpc-go matches them, by the key "/service/method" (or
// "/service/" for a whole service). When c was not validated, a name whose
// parts hold a slash matches what grpc-go's would, and when two entries
// hold the same name, the first wins; Validate refuses both.
//
// Lookup scans the entries and does not allocate; resolve a method once and
// keep the result rather than calling Lookup on every call.
func (c *Config) Lookup(fullMethod string) (MethodConfig, bool) {
	if i := c.LookupIndex(fullMethod); i >= 0 {
		return c.MethodConfig[i], true
	}
	return MethodConfig{}, false
}

// LookupIndex returns the index in c.MethodConfig of the entry that Lookup
// returns for fullMethod, or -1 when no entry applies. It does not
// allocate.
func (c *Config) LookupIndex(fullMethod string) int {
	if c == nil {
		return -1
	}
	// s is fullMethod without its slash; grpc-go looks up "/"+s exactly,
	// then "/"+s up to and including its last slash (the service key).
	s := strings.TrimPrefix(fullMethod, "/")
	svc, slash := s, false
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		svc, slash = s[:i], true
	}
	service, def := -1, -1
	for i := range c.MethodConfig {
		for _, n := range c.MethodConfig[i].Name {
			switch {
			case n.Service == "":
				if n.Method == "" && def < 0 {
					def = i
				}
			case slash && keyIs(n, s, false):
				return i
			case service < 0 && keyIs(n, svc, true):
				service = i
			}
		}
	}
	if service >= 0 {
		return service
	}
	return def
}

// keyIs reports whether n.key() is "/" + s, followed by "/" when slash is
// set, without building either string. n.Service is not empty.
func keyIs(n Name, s string, slash bool) bool {
	// n.key() without its leading slash is n.Service + "/" + n.Method.
	if slash {
		// Compare n.Service+"/"+n.Method with s+"/": n.Method is empty and
		// n.Service is s, or n.Method ends in "/" and the rest lines up.
		if n.Method == "" {
			return n.Service == s
		}
		if !strings.HasSuffix(n.Method, "/") {
			return false
		}
		return keyIs(Name{Service: n.Service, Method: n.Method[:len(n.Method)-1]}, s, false)
	}
	return len(s) == len(n.Service)+1+len(n.Method) &&
		s[len(n.Service)] == '/' &&
		strings.HasPrefix(s, n.Service) &&
		strings.HasSuffix(s, n.Method)
}

// SplitMethod splits a full method name "/pkg.Service/Method" into its
// service and method. A name without the leading slash is accepted; a name
// without a second slash is all service.
func SplitMethod(fullMethod string) (service, method string) {
	s := strings.TrimPrefix(fullMethod, "/")
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		return s[:i], s[i+1:]
	}
	return s, ""
}

// Jitter names how a retry delay is randomized. The zero value is [JitterA6].
type Jitter string

// The jitters. With d the exponential delay min(InitialBackoff ×
// BackoffMultiplier^n, MaxBackoff) and r uniform in [0, 1):
const (
	// JitterA6 is gRFC A6's: d × (0.8 + 0.4r), within ±20% of d. The default.
	JitterA6 Jitter = "a6"
	// JitterFull is random in [0, d]: d × r.
	JitterFull Jitter = "full"
	// JitterEqual keeps half of d: d/2 + d/2 × r.
	JitterEqual Jitter = "equal"
	// JitterDecorrelated is min(MaxBackoff, InitialBackoff + r ×
	// (3 × previous − InitialBackoff)), where previous is the delay before
	// (InitialBackoff at first); it ignores BackoffMultiplier.
	JitterDecorrelated Jitter = "decorrelated"
	// JitterNone is d exactly.
	JitterNone Jitter = "none"
)

func (j Jitter) valid() bool {
	switch j {
	case "", JitterA6, JitterFull, JitterEqual, JitterDecorrelated, JitterNone:
		return true
	}
	return false
}

// RetryPolicy is gRFC A6's retryPolicy with two extension fields
// (PerAttemptRecvTimeout, Jitter). Field names are A6's.
//
// The zero values of the fields written in Go code mean the documented
// defaults; a policy parsed from JSON always carries A6's required fields.
type RetryPolicy struct {
	// MaxAttempts counts every attempt, the first call included: 3 means one
	// call and up to two retries. Parse lowers values above its cap (5
	// unless WithMaxAttemptsCap raises it), and a client runs a parsed
	// value as it is; a policy built in Go with a value above the client's
	// cap (5 unless interceptor.WithMaxAttemptsCap raises it) is refused.
	// 0 means 3; 1 means no retry.
	MaxAttempts int

	// InitialBackoff is the delay before the first retry, before jitter.
	// 0 means 100ms.
	InitialBackoff time.Duration

	// MaxBackoff caps the exponential delay, before jitter. 0 means 5s.
	MaxBackoff time.Duration

	// BackoffMultiplier grows the delay after each retry. 0 means 2.
	BackoffMultiplier float64

	// RetryableStatusCodes, when non-empty, is the exact set of codes to
	// retry, such as []codes.Code{codes.Unavailable} (grpc's codes; order
	// and repeats do not matter, and Parse gives them sorted, each once).
	// Empty means the default rules: UNAVAILABLE, RESOURCE_EXHAUSTED,
	// DEADLINE_EXCEEDED of an attempt's own timeout, and ABORTED for
	// idempotent methods. A client turns the list into a bitmask once, when
	// it resolves the method's policy, so a call never scans it.
	RetryableStatusCodes []codes.Code

	// PerAttemptRecvTimeout, when positive, bounds each attempt until it
	// commits (for unary calls, the whole attempt) within the caller's
	// deadline; an attempt that runs out is retryable as DEADLINE_EXCEEDED.
	PerAttemptRecvTimeout time.Duration

	// Jitter randomizes each delay. The zero value is [JitterA6].
	Jitter Jitter
}

// The defaults a RetryPolicy written in Go code gets for zero fields.
const (
	DefaultMaxAttempts       = 3
	DefaultInitialBackoff    = 100 * time.Millisecond
	DefaultMaxBackoff        = 5 * time.Second
	DefaultBackoffMultiplier = 2.0
)

// HedgingPolicy is gRFC A6's hedgingPolicy: up to MaxAttempts copies of a
// call, the next sent HedgingDelay after the previous unless a fatal status
// arrives first.
type HedgingPolicy struct {
	// MaxAttempts counts every copy, the first included; capped as for
	// RetryPolicy.
	MaxAttempts int
	// HedgingDelay is the wait before each further copy. 0 sends all copies
	// at once. With HedgingDelayQuantile set, it is the wait only until
	// HedgingDelayMinSamples were observed, and 0 then means that, until
	// then, further copies go out only after non-fatal failures. A client
	// with a retry budget raises the delay, fixed or adaptive, to the
	// latency that the share of calls its budget pays for outlasts, once
	// HedgingDelayMinSamples copies were observed (a fixed delay:
	// FixedHedgingDelayMinSamples), so that the budget's hedges go to the
	// slowest calls (see package interceptor, What a hedge may spend).
	HedgingDelay time.Duration
	// NonFatalStatusCodes are the codes after which hedging goes on; any
	// other code ends the call. A list, as RetryableStatusCodes.
	NonFatalStatusCodes []codes.Code

	// HedgingDelayQuantile, in (0, 1), makes the delay adaptive (an
	// extension field): each call waits the method's observed attempt
	// latency at this quantile, so that about a share 1 − quantile of calls
	// is hedged whatever the latencies are, and stays so as they drift. The
	// latency is the lower quantile over the method's last few hundred
	// attempts, rounded up by at most 12.5 %; a copy cut off by a sibling's
	// answer counts as at least as long as it ran. From 0.75, where the
	// quantile falls in a gap before a cluster of slow calls, the delay is
	// the gap's fast edge (at most 1.25× the quantile with twice the tail
	// share), so the cluster is hedged whole. A client's retry budget may
	// raise the delay further (see HedgingDelay). 0 keeps HedgingDelay
	// fixed.
	HedgingDelayQuantile float64
	// HedgingDelayFloor is the least adaptive delay, ≥ 0 (an extension
	// field): hedges never go out sooner, however fast the method. Needs
	// HedgingDelayQuantile.
	HedgingDelayFloor time.Duration
	// HedgingDelayMinSamples is how many attempts of the method must be
	// observed before the adaptive delay is used, ≥ 0 (an extension field);
	// until then HedgingDelay applies. 0 means
	// DefaultHedgingDelayMinSamples. Needs HedgingDelayQuantile.
	HedgingDelayMinSamples int
}

// DefaultHedgingDelayMinSamples is the HedgingDelayMinSamples of a zero
// field: 100 observed attempts.
const DefaultHedgingDelayMinSamples = 100

// FixedHedgingDelayMinSamples is how many attempts of a method a client
// with a retry budget observes before it may raise a fixed HedgingDelay
// (one without HedgingDelayQuantile, where HedgingDelayMinSamples does not
// apply): fewer than an adaptive delay needs to place its quantile, since
// until then the delay, as configured, may hedge more calls than the
// budget pays for.
const FixedHedgingDelayMinSamples = 32

// RetryThrottling is gRFC A6's retryThrottling: a token bucket per client
// that starts full at MaxTokens. Each attempt that fails with a retryable code
// takes one token, each success adds TokenRatio; retries stop while tokens ≤
// MaxTokens/2.
type RetryThrottling struct {
	// MaxTokens is in (0, 1000].
	MaxTokens float64
	// TokenRatio is > 0; digits past the third decimal are ignored, and a
	// ratio under 0.001 runs as 0.001 (so that every success adds
	// something, as in grpc-go, where it would add the ratio whole).
	TokenRatio float64
}

// RetryBudget caps retries to a share of requests, shared by all methods of a
// client, as Finagle and Linkerd do: a retry is allowed while retries ≤ Ratio
// × requests over the last TTL, plus MinRetriesPerSecond. A retry that
// succeeds earns back what it cost. An extension block.
type RetryBudget struct {
	// Ratio is the share of requests that may be retries, in [0, 1000].
	// 0 means 0.2.
	Ratio float64
	// MinRetriesPerSecond lets a quiet client retry; 0 means 10.
	MinRetriesPerSecond float64
	// TTL is the sliding window; 0 means 10s.
	TTL time.Duration
	// Zero makes a budget that pays for nothing: no call is retried and no
	// hedged copy is sent after the first, an incident's kill switch. Ratio
	// and MinRetriesPerSecond must then be 0. In JSON it is written with
	// both written out as 0: "retryBudget": {"ratio": 0,
	// "minRetriesPerSecond": 0}; a 0 written out for one of them alone is
	// an error (it cannot mean "none of this part": left out, a field takes
	// its default).
	Zero bool
}

// CircuitBreaker trips a method's breaker on consecutive failures, on a
// failure rate, or on a slow-call rate over a rolling window, fails calls fast
// while open, and probes for recovery. An extension block.
//
// When neither ConsecutiveFailures nor FailureRateThreshold is set, both take
// their defaults; when one is set, the other zero is off.
//
// With Mode "adaptive" the block is the client-side adaptive throttling of
// the SRE book ("Handling Overload") instead: no open or closed states, but
// each attempt is rejected locally with a probability p that settles where
// the client sends K times what the backend accepts. Each answer of the
// backend moves p: a refusal (RESOURCE_EXHAUSTED or UNAVAILABLE from the
// backend) up by 0.02/K, an acceptance (every other outcome) down by
// 0.02·(1 − 1/K); the client's own rejections, the caller's cancellations,
// a CANCELLED (a call cut on the client side, its connection closed)
// and attempts that never reached the backend (the method's bulkhead full,
// its deadline spent) move nothing, and an attempt counts once its outcome
// is known (attempts in flight do not look refused). So p rises to its cap
// of 0.9 within about 90 refusals in an outage (a backend that refuses
// everything still receives a tenth of the attempts) and falls back within
// about 90 acceptances after it, whatever small error rate remains; it
// halves every Window/4 without an answer (Window: 0 means 60s in this
// mode, over which MethodStatus counts requests and accepts). See package
// internal/adaptive of the module for the derivation. Only K and Window
// apply in this mode.
type CircuitBreaker struct {
	// Mode is "" for the breaker with states, or "adaptive".
	Mode string
	// K is the adaptive mode's multiplier, in [1, 100]; 0 means 2. The
	// client sends about K times what the backend accepts. Only in mode
	// "adaptive".
	K float64
	// ConsecutiveFailures trips the breaker after that many failures in a
	// row. 0 is off (or 5, see above).
	ConsecutiveFailures int
	// FailureRateThreshold trips the breaker when failures/calls over Window
	// reach it, once MinimumCalls were seen; in (0, 1]. 0 is off (or 0.5).
	FailureRateThreshold float64
	// SlowCallDuration marks a call as slow; 0 turns slow-call tripping off.
	SlowCallDuration time.Duration
	// SlowCallRateThreshold trips the breaker when slow/calls over Window
	// reach it, in (0, 1]; 0 means 1 when SlowCallDuration is set.
	SlowCallRateThreshold float64
	// MinimumCalls is the number of calls in Window before a rate can trip
	// the breaker. 0 means 20.
	MinimumCalls int
	// Window is the rolling window of the rates. 0 means 10s (in mode
	// "adaptive": 60s, the window of the counts MethodStatus reports, four
	// times the half-life of the probability without an answer).
	Window time.Duration
	// OpenDuration is how long the breaker stays open after its first trip.
	// 0 means 5s.
	OpenDuration time.Duration
	// MaxOpenDuration caps the open time, which doubles on each trip from
	// half-open. 0 means OpenDuration (no growth).
	MaxOpenDuration time.Duration
	// HalfOpenProbes is how many attempts half-open lets through at once;
	// that many successes close the breaker, one failure opens it. 0 means 1.
	HalfOpenProbes int
	// FailureStatusCodes, when non-empty, lists the codes that count as
	// failures, as RetryableStatusCodes lists its codes; empty means the
	// default set, DefaultBreakerFailures of this module's package codes.
	FailureStatusCodes []codes.Code
}

// Bulkhead bounds how much of a client one method may occupy. An extension
// block.
type Bulkhead struct {
	// MaxConcurrent is the number of attempts in flight at once; > 0.
	MaxConcurrent int
	// MaxQueue is the number of attempts that may wait for a slot; 0 means
	// none wait.
	MaxQueue int
	// MaxQueueWait bounds each wait (and never past the caller's deadline).
	// 0 with MaxQueue > 0 means the wait is bounded by the deadline alone.
	MaxQueueWait time.Duration
}
