package serviceconfig_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

func TestParseServer(t *testing.T) {
	doc := `{
	  "concurrencyLimit": {"algorithm": "vegas", "initialLimit": 20, "minLimit": 2, "maxLimit": 500, "baseWindow": "10s", "maxQueue": 4, "maxQueueWait": "0.02s"},
	  "methodConfig": [
	    {"name": [{"service": "shop.Orders", "method": "Report"}], "concurrencyLimit": {"algorithm": "aimd", "maxLimit": 8}},
	    {"name": [{"service": "shop.Admin"}], "concurrencyLimit": {}}
	  ]
	}`
	c, err := serviceconfig.ParseServer([]byte(doc))
	if err != nil {
		t.Fatalf("ParseServer: %v", err)
	}
	want := serviceconfig.ConcurrencyLimit{Algorithm: "vegas", InitialLimit: 20, MinLimit: 2, MaxLimit: 500, BaseWindow: 10 * time.Second,
		MaxQueue: 4, MaxQueueWait: 20 * time.Millisecond}
	if *c.ConcurrencyLimit != want {
		t.Errorf("ConcurrencyLimit = %+v, want %+v", *c.ConcurrencyLimit, want)
	}
	tests := []struct {
		method, name string
		alg          string
	}{
		{"/shop.Orders/Report", "/shop.Orders/Report", "aimd"},
		{"/shop.Orders/Get", "", "vegas"},
		{"/shop.Admin/Any", "shop.Admin", ""},
	}
	for _, tt := range tests {
		l, name, ok := c.Lookup(tt.method)
		if !ok || name != tt.name || l.Algorithm != tt.alg {
			t.Errorf("Lookup(%q) = %+v, %q, %v, want algorithm %q under %q", tt.method, l, name, ok, tt.alg, tt.name)
		}
	}
	if _, _, ok := (&serviceconfig.ServerConfig{}).Lookup("/a.B/C"); ok {
		t.Errorf("empty config: Lookup found a limit")
	}
}

func TestParseServerErrors(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"empty", ``, "no JSON server config provided"},
		{"syntax", `{"concurrencyLimit": }`, "invalid JSON at line 1"},
		{"algorithm", `{"concurrencyLimit": {"algorithm": "gradient2"}}`, `serviceconfig: concurrencyLimit.algorithm: must be "vegas" or "aimd"`},
		{"type", `{"concurrencyLimit": {"maxLimit": "8"}}`, "serviceconfig: concurrencyLimit.maxLimit: must be an integer, not a string"},
		{"window", `{"concurrencyLimit": {"baseWindow": "10"}}`, `serviceconfig: concurrencyLimit.baseWindow: "10" is not a duration`},
		{"min over max", `{"methodConfig": [{"name": [{"service": "a.B"}], "concurrencyLimit": {"minLimit": 9, "maxLimit": 8}}]}`,
			"serviceconfig: methodConfig[0].concurrencyLimit.minLimit: must not exceed maxLimit"},
		{"queue without wait", `{"concurrencyLimit": {"maxQueue": 4}}`, "serviceconfig: concurrencyLimit.maxQueueWait: must be set when maxQueue is"},
		{"wait without queue", `{"concurrencyLimit": {"maxQueueWait": "1s"}}`, "serviceconfig: concurrencyLimit.maxQueue: must be set when maxQueueWait is"},
		{"negative queue", `{"concurrencyLimit": {"maxQueue": -1}}`, "serviceconfig: concurrencyLimit.maxQueue: must not be negative"},
		{"negative initial", `{"concurrencyLimit": {"initialLimit": -1}}`, "serviceconfig: concurrencyLimit.initialLimit: must not be negative"},
		{"negative min", `{"concurrencyLimit": {"minLimit": -1}}`, "serviceconfig: concurrencyLimit.minLimit: must not be negative"},
		{"negative max", `{"concurrencyLimit": {"maxLimit": -1}}`, "serviceconfig: concurrencyLimit.maxLimit: must not be negative"},
		{"initial over max", `{"concurrencyLimit": {"initialLimit": 9, "maxLimit": 8}}`, "serviceconfig: concurrencyLimit.initialLimit: must not exceed maxLimit"},
		{"initial under min", `{"concurrencyLimit": {"initialLimit": 2, "minLimit": 3}}`, "serviceconfig: concurrencyLimit.initialLimit: must not be less than minLimit"},
		{"min over default max", `{"concurrencyLimit": {"minLimit": 1001}}`, "serviceconfig: concurrencyLimit.minLimit: must not exceed maxLimit (default 1000)"},
		{"initial over default max", `{"concurrencyLimit": {"initialLimit": 1001}}`, "serviceconfig: concurrencyLimit.initialLimit: must not exceed maxLimit (default 1000)"},
		{"negative queue wait", `{"concurrencyLimit": {"maxQueueWait": "-1s"}}`, "serviceconfig: concurrencyLimit.maxQueueWait: must not be negative"},
		{"negative base window", `{"concurrencyLimit": {"baseWindow": "-1s"}}`, "serviceconfig: concurrencyLimit.baseWindow: must not be negative"},
		{"algorithm type", `{"methodConfig": [{"name": [{"service": "a.B"}], "concurrencyLimit": {"algorithm": 1}}]}`,
			"serviceconfig: methodConfig[0].concurrencyLimit.algorithm: must be a string, not a number"},
		{"method type", `{"methodConfig": [{"name": [{"service": "a.B", "method": true}]}]}`, "serviceconfig: methodConfig[0].name[0].method: must be a string, not true or false"},
		{"method slash", `{"methodConfig": [{"name": [{"service": "a.B", "method": "C/D"}], "concurrencyLimit": {}}]}`, `serviceconfig: methodConfig[0].name[0]: method "C/D" holds a slash: a method is its bare name, such as "D"`},
		{"no name", `{"methodConfig": [{"concurrencyLimit": {}}]}`, "serviceconfig: methodConfig[0].name: must name at least one service"},
		{"empty service", `{"methodConfig": [{"name": [{}], "concurrencyLimit": {}}]}`, "serviceconfig: methodConfig[0].name[0].service: must not be empty"},
		{"duplicate", `{"methodConfig": [{"name": [{"service": "a.B"}], "concurrencyLimit": {}}, {"name": [{"service": "a.B"}], "concurrencyLimit": {}}]}`,
			"serviceconfig: methodConfig[1].name[0]: duplicates methodConfig[0]"},
		{"no limit", `{"methodConfig": [{"name": [{"service": "a.B"}]}]}`, "serviceconfig: methodConfig[0]: needs a concurrencyLimit or rateLimits"},
		{"name type", `{"methodConfig": [{"name": [{"service": 1}]}]}`, "serviceconfig: methodConfig[0].name[0].service: must be a string, not a number"},
		{"slash", `{"methodConfig": [{"name": [{"service": "a/B"}], "concurrencyLimit": {}}]}`, `serviceconfig: methodConfig[0].name[0]: service "a/B" holds a slash: for one method write {"service": "a", "method": "B"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := serviceconfig.ParseServer([]byte(tt.doc))
			var e *serviceconfig.Error
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.As(err, &e) || c != nil {
				t.Errorf("ParseServer(%q) = %v, %v, want an *Error containing %q", tt.doc, c, err, tt.want)
			}
		})
	}
}

func FuzzParseServer(f *testing.F) {
	f.Add([]byte(`{"concurrencyLimit": {"algorithm": "aimd", "maxLimit": 8}, "methodConfig": [{"name": [{"service": "a.B", "method": "C"}], "concurrencyLimit": {}}]}`))
	f.Add([]byte(`{"methodConfig": [{"name": [{"service": 1}]}]}`))
	f.Add([]byte(rateDoc))
	f.Add([]byte(`{"rateLimits": [{"name": "a", "rate": 1e-3, "per": "3600s", "burst": 1, "key": "peer", "maxKeys": 3}]}`))
	f.Add([]byte(`{"methodConfig": [{"name": [{"service": "a.B", "method": "C"}], "rateLimits": [{"name": "x", "rate": 1, "burst": 1, "key": "shared", "distributed": true, "fallback": "open"}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := serviceconfig.ParseServer(data)
		if err != nil {
			var e *serviceconfig.Error
			if !errors.As(err, &e) || c != nil {
				t.Fatalf("ParseServer(%q) = %v, %T", data, c, err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("ParseServer(%q) gave a config that does not validate: %v", data, err)
		}
		for _, m := range []string{"/shop.Orders/Create", "/a.B/C", "/a/b", "/", ""} {
			c.Lookup(m)
			for _, a := range c.LookupRateLimits(m) {
				if a.Limit.Interval() < 1 {
					t.Fatalf("ParseServer(%q): limit %q has an interval below 1ns", data, a.Limit.Name)
				}
			}
		}
	})
}
