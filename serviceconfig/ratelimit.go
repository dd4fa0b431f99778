package serviceconfig

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// RateLimitKey is what a RateLimit counts calls by: each key has a bucket
// of its own.
type RateLimitKey string

// The keys of a RateLimit.
const (
	// KeyTenant counts by the call's tenant, as the server names it for
	// tenant fairness (server.Limits.Tenant, or the metadata key of
	// tenantFairness); calls that name none share one bucket.
	KeyTenant RateLimitKey = "tenant"
	// KeyPeer counts by the caller's IP address (without its port). Behind
	// a proxy every caller has the proxy's: prefer KeyTenant there.
	KeyPeer RateLimitKey = "peer"
	// KeyIdempotencyScope counts by the scope of server.Idempotency (the
	// caller the server authenticated), with the scope the server gives
	// calls that carry no idempotency key.
	KeyIdempotencyScope RateLimitKey = "idempotencyScope"
	// KeyShared counts every call in one bucket.
	KeyShared RateLimitKey = "shared"
)

var rateLimitKeys = []RateLimitKey{KeyTenant, KeyPeer, KeyIdempotencyScope, KeyShared}

// RateLimitFallback is what a distributed RateLimit does while its store
// (Redis) cannot be reached.
type RateLimitFallback string

// The fallbacks of a distributed RateLimit.
const (
	// FallbackLocalShare (the default, also for "") limits each replica
	// to the rate divided by the replicas that shared the limit recently,
	// so the replicas together keep about the rate.
	FallbackLocalShare RateLimitFallback = "localShare"
	// FallbackOpen admits every call while the store is unreachable: no
	// limit at all.
	FallbackOpen RateLimitFallback = "open"
	// FallbackClosed refuses every call the replica's leased tokens do not
	// cover while the store is unreachable.
	FallbackClosed RateLimitFallback = "closed"
)

// MaxRateLimitName is the longest RateLimit.Name, in bytes.
const MaxRateLimitName = 64

// RateLimit is one rate limit of a server: at most Rate calls per Per for
// each key, with bursts of up to Burst (GCRA, a token bucket of Burst
// tokens that refills at the rate). Its JSON form:
//
//	{"name": "orders-per-tenant", "rate": 100, "per": "1s", "burst": 20,
//	 "key": "tenant", "maxKeys": 10000,
//	 "distributed": true, "fallback": "localShare"}
//
// A call over it fails with RESOURCE_EXHAUSTED, a google.rpc.QuotaFailure
// naming the limit and a google.rpc.RetryInfo with the time until it would
// be admitted.
type RateLimit struct {
	// Name names the limit in answers (QuotaFailure), metrics and logs:
	// 1 to MaxRateLimitName letters, digits, '_', '-' or '.', unique in
	// the document. Required.
	Name string
	// Rate is the number of calls admitted per Per for each key,
	// sustained; > 0 and not necessarily whole (0.5 per second is a call
	// every 2 s).
	Rate float64
	// Per is the period of Rate; 0 means one second.
	Per time.Duration
	// Burst is the number of calls admitted at once after a quiet period;
	// at least 1. Size it to cover the gaps between calls: tokens that
	// would come while the bucket is full are lost.
	Burst int
	// Key is what the limit counts by; required.
	Key RateLimitKey
	// MaxKeys bounds the keys remembered at once; the keys beyond share
	// one bucket. 0 means 10,000. Not for a shared limit, which has one.
	MaxKeys int
	// Distributed shares the limit among every replica of the server
	// through the server's quota store (Redis): the rate is the total of
	// all replicas. False: each replica limits on its own.
	Distributed bool
	// Fallback is what a distributed limit does while its store cannot be
	// reached; "" is FallbackLocalShare. Only with Distributed.
	Fallback RateLimitFallback
}

// Validate reports the first field of r that is out of range, with its
// JSON path. It does not check that the name is unique (ServerConfig's
// Validate does).
func (r *RateLimit) Validate() error {
	switch {
	case r.Name == "":
		return newError("name", "is required: it names the limit in the answer to a refused call, in metrics and in logs")
	case !validLimitName(r.Name):
		return newError("name", "must be 1 to "+itoa(MaxRateLimitName)+" letters, digits, '_', '-' or '.', not "+strconv.Quote(r.Name))
	case !finite(r.Rate) || r.Rate <= 0:
		return newError("rate", "must be a positive number of calls per period")
	case r.Per < 0:
		return newError("per", "must not be negative")
	case r.Burst < 1:
		return newError("burst", "must be at least 1 (the calls admitted at once; 1 spaces calls evenly)")
	case r.Key == "":
		return newError("key", "is required: one of "+keyList())
	case !validKey(r.Key):
		return newError("key", strconv.Quote(string(r.Key))+" is not a key: want one of "+keyList()+closestKey(r.Key))
	case r.MaxKeys < 0:
		return newError("maxKeys", "must not be negative")
	case r.MaxKeys > 0 && r.Key == KeyShared:
		return newError("maxKeys", `does nothing with key "shared", which has one bucket`)
	case r.Fallback != "" && !r.Distributed:
		return newError("fallback", "applies only to a distributed limit (distributed: true)")
	case r.Fallback != "" && r.Fallback != FallbackLocalShare && r.Fallback != FallbackOpen && r.Fallback != FallbackClosed:
		return newError("fallback", strconv.Quote(string(r.Fallback))+` is not a fallback: want "localShare", "open" or "closed"`)
	}
	per := r.Per
	if per == 0 {
		per = time.Second
	}
	t := float64(per) / r.Rate
	switch {
	case t < 1:
		return newError("rate", "more than one call per nanosecond")
	case t*float64(r.Burst) > 1<<61:
		return newError("burst", "burst × per/rate is over 73 years")
	}
	return nil
}

// Interval is the time between two tokens of r, Per/Rate.
func (r *RateLimit) Interval() time.Duration {
	per := r.Per
	if per == 0 {
		per = time.Second
	}
	return time.Duration(math.Round(float64(per) / r.Rate))
}

func validLimitName(s string) bool {
	if len(s) == 0 || len(s) > MaxRateLimitName {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

func validKey(k RateLimitKey) bool {
	for _, v := range rateLimitKeys {
		if k == v {
			return true
		}
	}
	return false
}

func keyList() string {
	q := make([]string, len(rateLimitKeys))
	for i, k := range rateLimitKeys {
		q[i] = strconv.Quote(string(k))
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}

// closestKey suggests the key k was likely meant to be: the one within
// two edits, or the one it matches without regard to case or separators.
func closestKey(k RateLimitKey) string {
	norm := func(s string) string {
		return strings.NewReplacer("_", "", "-", "", " ", "").Replace(strings.ToLower(s))
	}
	best, bestD := "", 3
	for _, v := range rateLimitKeys {
		if norm(string(k)) == norm(string(v)) {
			return " (did you mean " + strconv.Quote(string(v)) + "?)"
		}
		if d := editDistance(string(k), string(v)); d < bestD {
			best, bestD = string(v), d
		}
	}
	if best == "" {
		return ""
	}
	return " (did you mean " + strconv.Quote(best) + "?)"
}

// validateRateLimits checks each limit of list, at path p, and that its
// name is not in names (the names seen so far, with their paths), which it
// extends.
func validateRateLimits(p string, list []RateLimit, names map[string]string) error {
	for i := range list {
		lp := index(p, i)
		if err := list[i].Validate(); err != nil {
			return prefix(lp, err)
		}
		if first, dup := names[list[i].Name]; dup {
			return newError(join(lp, "name"), strconv.Quote(list[i].Name)+" is the name of "+first+" too: each limit needs its own")
		}
		names[list[i].Name] = lp
	}
	return nil
}

type wireRateLimit struct {
	Name        leaf[string]
	Rate        leaf[float64]
	Per         leaf[*duration]
	Burst       leaf[int]
	Key         leaf[string]
	MaxKeys     leaf[int]
	Distributed leaf[bool]
	Fallback    leaf[string]
}

// rateLimits checks the leaves of list under path p and returns their
// values.
func rateLimits(p string, list []wireRateLimit) ([]RateLimit, error) {
	out := make([]RateLimit, 0, len(list))
	for i := range list {
		w := &list[i]
		if err := checkAll(index(p, i),
			field{"name", &w.Name},
			field{"rate", &w.Rate},
			field{"per", &w.Per},
			field{"burst", &w.Burst},
			field{"key", &w.Key},
			field{"maxKeys", &w.MaxKeys},
			field{"distributed", &w.Distributed},
			field{"fallback", &w.Fallback},
		); err != nil {
			return nil, err
		}
		out = append(out, RateLimit{
			Name: w.Name.v, Rate: w.Rate.v, Per: optDuration(w.Per.v), Burst: w.Burst.v,
			Key: RateLimitKey(w.Key.v), MaxKeys: w.MaxKeys.v, Distributed: w.Distributed.v,
			Fallback: RateLimitFallback(w.Fallback.v),
		})
	}
	return out, nil
}

// AppliedRateLimit is a RateLimit with the scope it applies in: its
// buckets are shared by every method of the scope.
type AppliedRateLimit struct {
	Limit *RateLimit
	// Scope is "" for a top-level limit (every method of the server), a
	// service ("pkg.Service") or a full method ("/pkg.Service/Method").
	Scope string
}

// LookupRateLimits returns every rate limit that applies to fullMethod
// ("/pkg.Service/Method"), the most specific first: those of the method's
// entry, of its service's entry, then the top-level ones. A call must be
// admitted by each. A server exempts health checks and reflection from the
// top-level limits unless an entry names them; LookupRateLimits does not
// know the server's exemptions.
func (c *ServerConfig) LookupRateLimits(fullMethod string) []AppliedRateLimit {
	service, method := SplitMethod(fullMethod)
	var out []AppliedRateLimit
	add := func(list []RateLimit, scope string) {
		for i := range list {
			out = append(out, AppliedRateLimit{Limit: &list[i], Scope: scope})
		}
	}
	if method != "" {
		for _, mc := range c.MethodConfig {
			for _, n := range mc.Name {
				if n.Service == service && n.Method == method {
					add(mc.RateLimits, "/"+service+"/"+method)
				}
			}
		}
	}
	for _, mc := range c.MethodConfig {
		for _, n := range mc.Name {
			if n.Service == service && n.Method == "" {
				add(mc.RateLimits, service)
			}
		}
	}
	add(c.RateLimits, "")
	return out
}
