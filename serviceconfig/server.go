package serviceconfig

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"time"
)

// ConcurrencyLimit is a server's adaptive concurrency limit (see
// server.Limits in package interceptor/server): how many requests may run at once,
// learned from their latencies within [MinLimit, MaxLimit]. The zero value
// is the Vegas limit with its defaults.
type ConcurrencyLimit struct {
	// Algorithm is "vegas" (the default, also for "") or "aimd".
	Algorithm string
	// InitialLimit is the limit before any request completed; 0 means 20
	// (clamped into [MinLimit, MaxLimit]).
	InitialLimit int
	// MinLimit is the least the limit falls to; 0 means 1.
	MinLimit int
	// MaxLimit is the most the limit grows to; 0 means 1000.
	MaxLimit int
	// BaseWindow is the period over which the base RTT (the service time
	// without queueing) is the least latency seen; the base RTT is the
	// minimum of the last two periods (with Vegas, a probe every few
	// round trips also resets it to the latest latency, so a lasting
	// slowdown is learned in seconds). 0 means 30s.
	BaseWindow time.Duration
	// MaxQueue is how many calls over the limit may wait for a slot, at
	// most MaxQueueWait each (less when their deadline is nearer); 0: none,
	// calls over the limit are shed at once. Both or neither are set.
	MaxQueue     int
	MaxQueueWait time.Duration
}

// Validate reports the first field of c that is out of range.
func (c *ConcurrencyLimit) Validate() error {
	switch {
	case c.Algorithm != "" && c.Algorithm != "vegas" && c.Algorithm != "aimd":
		return newError("algorithm", `must be "vegas" or "aimd"`)
	case c.InitialLimit < 0:
		return newError("initialLimit", "must not be negative")
	case c.MinLimit < 0:
		return newError("minLimit", "must not be negative")
	case c.MaxLimit < 0:
		return newError("maxLimit", "must not be negative")
	case c.MaxLimit > 0 && c.MinLimit > c.MaxLimit:
		return newError("minLimit", "must not exceed maxLimit")
	case c.InitialLimit > 0 && c.MaxLimit > 0 && c.InitialLimit > c.MaxLimit:
		return newError("initialLimit", "must not exceed maxLimit")
	case c.InitialLimit > 0 && c.InitialLimit < c.MinLimit:
		return newError("initialLimit", "must not be less than minLimit")
	case c.MaxLimit == 0 && c.MinLimit > 1000:
		return newError("minLimit", "must not exceed maxLimit (default 1000)")
	case c.MaxLimit == 0 && c.InitialLimit > 1000:
		return newError("initialLimit", "must not exceed maxLimit (default 1000)")
	case c.MaxQueue < 0:
		return newError("maxQueue", "must not be negative")
	case c.MaxQueueWait < 0:
		return newError("maxQueueWait", "must not be negative")
	case c.MaxQueue > 0 && c.MaxQueueWait == 0:
		return newError("maxQueueWait", "must be set when maxQueue is")
	case c.MaxQueue == 0 && c.MaxQueueWait > 0:
		return newError("maxQueue", "must be set when maxQueueWait is")
	}
	return checkDuration("baseWindow", c.BaseWindow)
}

// TenantFairness gives each tenant of a server a fair share of its
// concurrency limits (see server.Limits in package interceptor/server): under pressure
// each active tenant may use its share of a limit (and of its queue), and
// a tenant over its share is shed before any tenant under it.
type TenantFairness struct {
	// MetadataKey names the incoming metadata key whose first value names
	// a call's tenant; a call without it belongs to the default tenant. A
	// caller can send any value: use a key that an authenticating proxy
	// sets, or give server.Limits a Tenant function of the
	// verified identity. Required in a document.
	MetadataKey string
	// MaxTenants bounds the tenants each limit remembers at once; the names
	// beyond share one tenant. 0 means 1024.
	MaxTenants int
	// IdleTimeout is how long a tenant with no call in flight is
	// remembered after its last call; then it is forgotten. (A fair share
	// is over the tenants with calls in flight or queued only.) 0 means
	// 5s.
	IdleTimeout time.Duration
}

// Validate reports the first field of f out of range, with its JSON path.
func (f *TenantFairness) Validate() error {
	switch {
	case f.MetadataKey != "" && !validMetadataKey(f.MetadataKey):
		return newError("metadataKey", "must be a lower-case metadata key (a-z, 0-9, '-', '_', '.'), not a binary one (-bin)")
	case f.MaxTenants < 0:
		return newError("maxTenants", "must not be negative")
	}
	return checkDuration("idleTimeout", f.IdleTimeout)
}

// validMetadataKey reports whether k is a non-binary metadata key as gRPC
// defines them: lower-case letters, digits, '-', '_' and '.', not ending
// in "-bin" and not starting with "grpc-".
func validMetadataKey(k string) bool {
	if strings.HasSuffix(k, "-bin") || strings.HasPrefix(k, "grpc-") {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// ServerConfig is the server side's document: the concurrency limits and
// rate limits of server.New in package interceptor/server
// (server.Limits.Config). Its JSON form:
//
//	{
//	  "concurrencyLimit": {"algorithm": "vegas", "initialLimit": 20,
//	                       "minLimit": 1, "maxLimit": 1000, "baseWindow": "30s",
//	                       "maxQueue": 16, "maxQueueWait": "0.02s"},
//	  "rateLimits": [{"name": "server", "rate": 5000, "burst": 500, "key": "shared"}],
//	  "methodConfig": [{
//	    "name": [{"service": "shop.Orders", "method": "Report"}],
//	    "concurrencyLimit": {"algorithm": "aimd", "maxLimit": 8},
//	    "rateLimits": [{"name": "report-per-tenant", "rate": 10, "burst": 5, "key": "tenant"}]
//	  }],
//	  "tenantFairness": {"metadataKey": "x-tenant-id", "maxTenants": 1024,
//	                     "idleTimeout": "5s"}
//	}
//
// The top-level concurrency limit covers every method no entry names; each
// name of an entry (a full method, or a service when the method is left
// out) gets a concurrency limit of its own with the entry's settings.
// Rate limits add up instead: a call must pass every rate limit of its
// method's entry, of its service's entry and of the top level (see
// LookupRateLimits), and a limit's buckets are shared by every method in
// its scope (the server, the service, the method). Names follow the
// service config's rules, except that the empty name (the default entry)
// is not allowed: the top-level blocks are the default. An entry has a
// concurrencyLimit, rateLimits or both. tenantFairness applies to every
// concurrency limit, and names the tenants of the rate limits keyed by
// tenant; without it, all callers are one tenant.
type ServerConfig struct {
	// ConcurrencyLimit is the server's limit; nil: none.
	ConcurrencyLimit *ConcurrencyLimit
	// RateLimits apply to every call of the server (the server exempts
	// health checks and reflection unless an entry names them).
	RateLimits []RateLimit
	// MethodConfig gives methods and services limits of their own.
	MethodConfig []ServerMethodConfig
	// TenantFairness shares each limit fairly among tenants; nil: one
	// tenant.
	TenantFairness *TenantFairness
}

// ServerMethodConfig is one entry of ServerConfig.MethodConfig: a
// concurrency limit, rate limits, or both.
type ServerMethodConfig struct {
	Name             []Name
	ConcurrencyLimit *ConcurrencyLimit
	RateLimits       []RateLimit
}

// Validate reports the first problem of c, with its JSON path.
func (c *ServerConfig) Validate() error {
	if l := c.ConcurrencyLimit; l != nil {
		if err := l.Validate(); err != nil {
			return prefix("concurrencyLimit", err)
		}
	}
	if f := c.TenantFairness; f != nil {
		if f.MetadataKey == "" {
			return newError("tenantFairness.metadataKey", "is required")
		}
		if err := f.Validate(); err != nil {
			return prefix("tenantFairness", err)
		}
	}
	names := map[string]string{}
	if err := validateRateLimits("rateLimits", c.RateLimits, names); err != nil {
		return err
	}
	seen := map[Name]int{}
	for i, mc := range c.MethodConfig {
		p := index("methodConfig", i)
		if len(mc.Name) == 0 {
			return newError(join(p, "name"), "must name at least one service")
		}
		for j, n := range mc.Name {
			np := index(join(p, "name"), j)
			if n.Service == "" {
				return newError(join(np, "service"), "must not be empty: the top-level concurrencyLimit is the default")
			}
			if err := n.Validate(); err != nil {
				return prefix(np, err)
			}
			if k, dup := seen[n]; dup {
				return newError(np, "duplicates methodConfig["+itoa(k)+"]")
			}
			seen[n] = i
		}
		if mc.ConcurrencyLimit == nil && len(mc.RateLimits) == 0 {
			return newError(p, "needs a concurrencyLimit or rateLimits")
		}
		if mc.ConcurrencyLimit != nil {
			if err := mc.ConcurrencyLimit.Validate(); err != nil {
				return prefix(join(p, "concurrencyLimit"), err)
			}
		}
		if err := validateRateLimits(join(p, "rateLimits"), mc.RateLimits, names); err != nil {
			return err
		}
	}
	return nil
}

type wireServer struct {
	ConcurrencyLimit *wireLimit
	RateLimits       *[]wireRateLimit
	MethodConfig     *[]wireServerMethod
	TenantFairness   *wireFairness
}

type wireFairness struct {
	MetadataKey leaf[string]
	MaxTenants  leaf[int]
	IdleTimeout leaf[*duration]
}

// fairness checks the leaves of w under path and returns its value.
func (w *wireFairness) fairness(path string) (*TenantFairness, error) {
	if err := checkAll(path,
		field{"metadataKey", &w.MetadataKey},
		field{"maxTenants", &w.MaxTenants},
		field{"idleTimeout", &w.IdleTimeout},
	); err != nil {
		return nil, err
	}
	return &TenantFairness{MetadataKey: w.MetadataKey.v, MaxTenants: w.MaxTenants.v, IdleTimeout: optDuration(w.IdleTimeout.v)}, nil
}

type wireServerMethod struct {
	Name             *[]wireName
	ConcurrencyLimit *wireLimit
	RateLimits       *[]wireRateLimit
}

type wireLimit struct {
	Algorithm    leaf[string]
	InitialLimit leaf[int]
	MinLimit     leaf[int]
	MaxLimit     leaf[int]
	BaseWindow   leaf[*duration]
	MaxQueue     leaf[int]
	MaxQueueWait leaf[*duration]
}

// limit checks the leaves of w under path and returns its value.
func (w *wireLimit) limit(path string) (*ConcurrencyLimit, error) {
	if err := checkAll(path,
		field{"algorithm", &w.Algorithm},
		field{"initialLimit", &w.InitialLimit},
		field{"minLimit", &w.MinLimit},
		field{"maxLimit", &w.MaxLimit},
		field{"baseWindow", &w.BaseWindow},
		field{"maxQueue", &w.MaxQueue},
		field{"maxQueueWait", &w.MaxQueueWait},
	); err != nil {
		return nil, err
	}
	return &ConcurrencyLimit{
		Algorithm: w.Algorithm.v, InitialLimit: w.InitialLimit.v, MinLimit: w.MinLimit.v,
		MaxLimit: w.MaxLimit.v, BaseWindow: optDuration(w.BaseWindow.v),
		MaxQueue: w.MaxQueue.v, MaxQueueWait: optDuration(w.MaxQueueWait.v),
	}, nil
}

// ParseServer reads a ServerConfig document and returns it validated, or an
// *Error naming the JSON path of the first problem. Keys match without
// regard to case, as in Parse; the whole document is this module's schema,
// so an unknown key is an error that names the closest known key.
func ParseServer(data []byte) (*ServerConfig, error) {
	if len(data) == 0 {
		return nil, &Error{Err: errors.New("no JSON server config provided")}
	}
	var w wireServer
	if err := json.Unmarshal(data, &w); err != nil {
		return nil, decodeError(data, err)
	}
	// The whole document is ours: an unknown key anywhere is an error.
	if kerr, _ := checkKeys(data, reflect.TypeFor[wireServer](), true); kerr != nil {
		return nil, kerr
	}
	c := &ServerConfig{}
	if w.ConcurrencyLimit != nil {
		l, err := w.ConcurrencyLimit.limit("concurrencyLimit")
		if err != nil {
			return nil, err
		}
		c.ConcurrencyLimit = l
	}
	if w.RateLimits != nil {
		rl, err := rateLimits("rateLimits", *w.RateLimits)
		if err != nil {
			return nil, err
		}
		c.RateLimits = rl
	}
	if w.TenantFairness != nil {
		f, err := w.TenantFairness.fairness("tenantFairness")
		if err != nil {
			return nil, err
		}
		c.TenantFairness = f
	}
	if w.MethodConfig != nil {
		for i, m := range *w.MethodConfig {
			p := index("methodConfig", i)
			mc := ServerMethodConfig{}
			if m.Name != nil {
				for j, n := range *m.Name {
					np := index(join(p, "name"), j)
					if err := checkAll(np, field{"service", &n.Service}, field{"method", &n.Method}); err != nil {
						return nil, err
					}
					mc.Name = append(mc.Name, Name{Service: n.Service.v, Method: n.Method.v})
				}
			}
			if m.ConcurrencyLimit != nil {
				l, err := m.ConcurrencyLimit.limit(join(p, "concurrencyLimit"))
				if err != nil {
					return nil, err
				}
				mc.ConcurrencyLimit = l
			}
			if m.RateLimits != nil {
				rl, err := rateLimits(join(p, "rateLimits"), *m.RateLimits)
				if err != nil {
					return nil, err
				}
				mc.RateLimits = rl
			}
			c.MethodConfig = append(c.MethodConfig, mc)
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Lookup returns the concurrency limit that applies to fullMethod
// ("/pkg.Service/Method") and the name it was found under: the method's
// entry, else its service's, else the top-level block (name ""); ok is
// false when none applies. An entry of rate limits only has no concurrency
// limit to give: the search goes on past it.
func (c *ServerConfig) Lookup(fullMethod string) (l *ConcurrencyLimit, name string, ok bool) {
	service, method := SplitMethod(fullMethod)
	var svc *ConcurrencyLimit
	for _, mc := range c.MethodConfig {
		if mc.ConcurrencyLimit == nil {
			continue
		}
		for _, n := range mc.Name {
			switch {
			case n.Service == service && n.Method == method && method != "":
				return mc.ConcurrencyLimit, "/" + service + "/" + method, true
			case n.Service == service && n.Method == "" && svc == nil:
				svc = mc.ConcurrencyLimit
			}
		}
	}
	if svc != nil {
		return svc, service, true
	}
	return c.ConcurrencyLimit, "", c.ConcurrencyLimit != nil
}
