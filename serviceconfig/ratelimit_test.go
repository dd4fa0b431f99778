package serviceconfig_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

const rateDoc = `{
  "rateLimits": [{"name": "server", "rate": 5000, "burst": 500, "key": "shared"}],
  "methodConfig": [
    {"name": [{"service": "shop.Orders", "method": "Create"}],
     "rateLimits": [
       {"name": "create-per-tenant", "rate": 100, "per": "60s", "burst": 20, "key": "tenant", "maxKeys": 500,
        "distributed": true, "fallback": "closed"},
       {"name": "create-per-peer", "rate": 0.5, "burst": 1, "key": "peer"}
     ]},
    {"name": [{"service": "shop.Orders"}], "concurrencyLimit": {},
     "rateLimits": [{"name": "orders-per-scope", "rate": 50, "burst": 10, "key": "idempotencyScope", "distributed": true}]}
  ],
  "tenantFairness": {"metadataKey": "x-tenant"}
}`

// TestParseServerRateLimits: the JSON and the Go structs are one model:
// the parsed document equals the struct a Go user would write.
func TestParseServerRateLimits(t *testing.T) {
	c, err := serviceconfig.ParseServer([]byte(rateDoc))
	if err != nil {
		t.Fatalf("ParseServer: %v", err)
	}
	want := &serviceconfig.ServerConfig{
		RateLimits: []serviceconfig.RateLimit{{Name: "server", Rate: 5000, Burst: 500, Key: serviceconfig.KeyShared}},
		MethodConfig: []serviceconfig.ServerMethodConfig{
			{Name: []serviceconfig.Name{{Service: "shop.Orders", Method: "Create"}}, RateLimits: []serviceconfig.RateLimit{
				{Name: "create-per-tenant", Rate: 100, Per: time.Minute, Burst: 20, Key: serviceconfig.KeyTenant, MaxKeys: 500,
					Distributed: true, Fallback: serviceconfig.FallbackClosed},
				{Name: "create-per-peer", Rate: 0.5, Burst: 1, Key: serviceconfig.KeyPeer},
			}},
			{Name: []serviceconfig.Name{{Service: "shop.Orders"}}, ConcurrencyLimit: &serviceconfig.ConcurrencyLimit{},
				RateLimits: []serviceconfig.RateLimit{{Name: "orders-per-scope", Rate: 50, Burst: 10,
					Key: serviceconfig.KeyIdempotencyScope, Distributed: true}}},
		},
		TenantFairness: &serviceconfig.TenantFairness{MetadataKey: "x-tenant"},
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("ParseServer =\n%+v\nwant\n%+v", c, want)
	}
	if err := want.Validate(); err != nil {
		t.Fatalf("the Go form: Validate() = %v", err)
	}
	if got := c.MethodConfig[0].RateLimits[0].Interval(); got != 600*time.Millisecond {
		t.Errorf("Interval of 100 per 60s = %v, want 600ms", got)
	}
}

// TestLookupRateLimitsAddUp: a call passes its method's limits, its
// service's and the top-level ones, most specific first, each with the
// scope that shares its buckets; and the concurrency Lookup passes over an
// entry of rate limits only.
func TestLookupRateLimitsAddUp(t *testing.T) {
	c, err := serviceconfig.ParseServer([]byte(rateDoc))
	if err != nil {
		t.Fatal(err)
	}
	names := func(m string) string {
		var s []string
		for _, a := range c.LookupRateLimits(m) {
			s = append(s, a.Limit.Name+"@"+a.Scope)
		}
		return strings.Join(s, " ")
	}
	tests := []struct{ method, want string }{
		{"/shop.Orders/Create", "create-per-tenant@/shop.Orders/Create create-per-peer@/shop.Orders/Create orders-per-scope@shop.Orders server@"},
		{"/shop.Orders/Get", "orders-per-scope@shop.Orders server@"},
		{"/other.S/M", "server@"},
	}
	for _, tt := range tests {
		if got := names(tt.method); got != tt.want {
			t.Errorf("LookupRateLimits(%q) = %q, want %q", tt.method, got, tt.want)
		}
	}
	if _, name, ok := c.Lookup("/shop.Orders/Create"); !ok || name != "shop.Orders" {
		t.Errorf("Lookup(/shop.Orders/Create) under %q, %v; want the service's concurrency limit: the method's entry has rate limits only", name, ok)
	}
}

// TestRateLimitErrors pins each bad limit's message and JSON path, in
// JSON and, where Go can say it, as Validate of the Go struct.
func TestRateLimitErrors(t *testing.T) {
	tests := []struct {
		name, limit, want string
	}{
		{"zero rate", `{"name": "a", "rate": 0, "burst": 1, "key": "shared"}`, "rateLimits[0].rate: must be a positive number of calls per period"},
		{"negative rate", `{"name": "a", "rate": -5, "burst": 1, "key": "shared"}`, "rateLimits[0].rate: must be a positive number"},
		{"no rate", `{"name": "a", "burst": 1, "key": "shared"}`, "rateLimits[0].rate: must be a positive number"},
		{"rate too high", `{"name": "a", "rate": 2e9, "per": "0.5s", "burst": 1, "key": "shared"}`, "rateLimits[0].rate: more than one call per nanosecond"},
		{"zero burst", `{"name": "a", "rate": 1, "burst": 0, "key": "shared"}`, "rateLimits[0].burst: must be at least 1"},
		{"no burst", `{"name": "a", "rate": 1, "key": "shared"}`, "rateLimits[0].burst: must be at least 1"},
		{"negative burst", `{"name": "a", "rate": 1, "burst": -3, "key": "shared"}`, "rateLimits[0].burst: must be at least 1"},
		{"burst too long", `{"name": "a", "rate": 1, "per": "100000000s", "burst": 1000000000, "key": "shared"}`, "rateLimits[0].burst: burst × per/rate is over 73 years"},
		{"negative per", `{"name": "a", "rate": 1, "per": "-1s", "burst": 1, "key": "shared"}`, "rateLimits[0].per: must not be negative"},
		{"no key", `{"name": "a", "rate": 1, "burst": 1}`, `rateLimits[0].key: is required: one of "tenant", "peer", "idempotencyScope" or "shared"`},
		{"unknown key kind", `{"name": "a", "rate": 1, "burst": 1, "key": "user"}`, `rateLimits[0].key: "user" is not a key: want one of "tenant", "peer", "idempotencyScope" or "shared"`},
		{"misspelt key kind", `{"name": "a", "rate": 1, "burst": 1, "key": "tennant"}`, `(did you mean "tenant"?)`},
		{"key kind in another case", `{"name": "a", "rate": 1, "burst": 1, "key": "idempotency_scope"}`, `(did you mean "idempotencyScope"?)`},
		{"no name", `{"rate": 1, "burst": 1, "key": "shared"}`, "rateLimits[0].name: is required"},
		{"bad name", `{"name": "a b", "rate": 1, "burst": 1, "key": "shared"}`, `rateLimits[0].name: must be 1 to 64 letters, digits, '_', '-' or '.', not "a b"`},
		{"maxKeys on shared", `{"name": "a", "rate": 1, "burst": 1, "key": "shared", "maxKeys": 5}`, `rateLimits[0].maxKeys: does nothing with key "shared"`},
		{"negative maxKeys", `{"name": "a", "rate": 1, "burst": 1, "key": "peer", "maxKeys": -1}`, "rateLimits[0].maxKeys: must not be negative"},
		{"fallback of a local limit", `{"name": "a", "rate": 1, "burst": 1, "key": "peer", "fallback": "open"}`, "rateLimits[0].fallback: applies only to a distributed limit"},
		{"unknown fallback", `{"name": "a", "rate": 1, "burst": 1, "key": "peer", "distributed": true, "fallback": "local"}`, `rateLimits[0].fallback: "local" is not a fallback`},
		// misspelt and misplaced JSON keys: the server document is ours, so
		// each is an error naming the closest key
		{"misspelt burst", `{"name": "a", "rate": 1, "brust": 1, "key": "peer"}`, `rateLimits[0].brust: unknown key: did you mean "burst"?`},
		{"misspelt rate", `{"name": "a", "rte": 1, "burst": 1, "key": "peer"}`, `rateLimits[0].rte: unknown key: did you mean "rate"?`},
		{"period for per", `{"name": "a", "rate": 1, "period": "1s", "burst": 1, "key": "peer"}`, "rateLimits[0].period: unknown key"},
		{"wrong type", `{"name": "a", "rate": "100", "burst": 1, "key": "peer"}`, "rateLimits[0].rate: must be a number, not a string"},
		{"per without s", `{"name": "a", "rate": 1, "per": "60", "burst": 1, "key": "peer"}`, `rateLimits[0].per: "60" is not a duration`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := `{"rateLimits": [` + tt.limit + `]}`
			_, err := serviceconfig.ParseServer([]byte(doc))
			var e *serviceconfig.Error
			if !errors.As(err, &e) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseServer(%s) = %v, want an *Error containing %q", doc, err, tt.want)
			}
		})
	}
}

func TestRateLimitErrorsInEntries(t *testing.T) {
	tests := []struct{ name, doc, want string }{
		{"in a method entry",
			`{"methodConfig": [{"name": [{"service": "a.B"}], "rateLimits": [{"name": "x", "rate": 1, "burst": 0, "key": "peer"}]}]}`,
			"serviceconfig: methodConfig[0].rateLimits[0].burst: must be at least 1"},
		{"duplicate names across the document",
			`{"rateLimits": [{"name": "x", "rate": 1, "burst": 1, "key": "peer"}],
			  "methodConfig": [{"name": [{"service": "a.B"}], "rateLimits": [{"name": "y", "rate": 1, "burst": 1, "key": "peer"},
			                                                                  {"name": "x", "rate": 2, "burst": 1, "key": "shared"}]}]}`,
			`serviceconfig: methodConfig[0].rateLimits[1].name: "x" is the name of rateLimits[0] too`},
		{"an empty entry",
			`{"methodConfig": [{"name": [{"service": "a.B"}], "rateLimits": []}]}`,
			"serviceconfig: methodConfig[0]: needs a concurrencyLimit or rateLimits"},
		{"rateLimit for rateLimits",
			`{"rateLimit": [{"name": "x", "rate": 1, "burst": 1, "key": "peer"}]}`,
			`serviceconfig: rateLimit: unknown key: did you mean "rateLimits"?`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := serviceconfig.ParseServer([]byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseServer = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestRateLimitValidateGo: the Go form is checked by the same rules, with
// the paths of the JSON form (relative to the limit for RateLimit.Validate).
func TestRateLimitValidateGo(t *testing.T) {
	tests := []struct {
		r    serviceconfig.RateLimit
		want string
	}{
		{serviceconfig.RateLimit{Name: "a", Rate: -1, Burst: 1, Key: serviceconfig.KeyShared}, "serviceconfig: rate: must be a positive number"},
		{serviceconfig.RateLimit{Name: "a", Rate: 1, Key: serviceconfig.KeyShared}, "serviceconfig: burst: must be at least 1"},
		{serviceconfig.RateLimit{Name: "a", Rate: 1, Burst: 1, Key: "Tenant"}, `serviceconfig: key: "Tenant" is not a key`},
		{serviceconfig.RateLimit{Name: "a", Rate: 1, Burst: 1, Key: serviceconfig.KeyPeer, Fallback: serviceconfig.FallbackOpen}, "serviceconfig: fallback: applies only to a distributed limit"},
	}
	for _, tt := range tests {
		if err := tt.r.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v.Validate() = %v, want %q", tt.r, err, tt.want)
		}
	}
	c := serviceconfig.ServerConfig{MethodConfig: []serviceconfig.ServerMethodConfig{{
		Name:       []serviceconfig.Name{{Service: "a.B"}},
		RateLimits: []serviceconfig.RateLimit{{Name: "a", Rate: 1, Burst: 1, Key: serviceconfig.KeyPeer, MaxKeys: -2}},
	}}}
	if err := c.Validate(); err == nil || err.Error() != "serviceconfig: methodConfig[0].rateLimits[0].maxKeys: must not be negative" {
		t.Errorf("ServerConfig.Validate() = %v", err)
	}
}
