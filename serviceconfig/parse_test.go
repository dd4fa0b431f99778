package serviceconfig_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// testMethod is the method the table looks up unless a case names another.
const testMethod = "/shop.Orders/Create"

// baseRetry is the retry policy retry() writes, as Parse returns it.
var baseRetryJSON = []string{
	`"maxAttempts": 4`,
	`"initialBackoff": "0.1s"`,
	`"maxBackoff": "1s"`,
	`"backoffMultiplier": 2`,
	`"retryableStatusCodes": ["UNAVAILABLE"]`,
}

// retry returns a retryPolicy object: baseRetryJSON with each override
// `"key": value` replacing the field of that key (or added after them), and
// each "-key" removing it.
func retry(overrides ...string) string {
	fields := append([]string(nil), baseRetryJSON...)
	for _, o := range overrides {
		if key, ok := strings.CutPrefix(o, "-"); ok {
			for i, f := range fields {
				if strings.HasPrefix(f, `"`+key+`"`) {
					fields = append(fields[:i], fields[i+1:]...)
					break
				}
			}
			continue
		}
		key := o[:strings.Index(o[1:], `"`)+2]
		replaced := false
		for i, f := range fields {
			if strings.HasPrefix(f, key) {
				fields[i], replaced = o, true
			}
		}
		if !replaced {
			fields = append(fields, o)
		}
	}
	return "{" + strings.Join(fields, ", ") + "}"
}

// orders returns a document with one entry for the service shop.Orders whose
// other fields are body.
func orders(body string) string {
	if body != "" {
		body = ", " + body
	}
	return `{"methodConfig": [{"name": [{"service": "shop.Orders"}]` + body + `}]}`
}

// ordersRetry returns orders with the retry policy retry(overrides...).
func ordersRetry(overrides ...string) string {
	return orders(`"retryPolicy": ` + retry(overrides...))
}

func baseRetry() *serviceconfig.RetryPolicy {
	return &serviceconfig.RetryPolicy{
		MaxAttempts:          4,
		InitialBackoff:       100 * time.Millisecond,
		MaxBackoff:           time.Second,
		BackoffMultiplier:    2,
		RetryableStatusCodes: []codes.Code{codes.Unavailable},
	}
}

// rp returns baseRetry changed by f.
func rp(f func(p *serviceconfig.RetryPolicy)) *serviceconfig.RetryPolicy {
	p := baseRetry()
	f(p)
	return p
}

var ordersName = []serviceconfig.Name{{Service: "shop.Orders"}}

// svc returns mc as the entry for shop.Orders.
func svc(mc serviceconfig.MethodConfig) *serviceconfig.MethodConfig {
	mc.Name = ordersName
	return &mc
}

func ptr[T any](v T) *T { return &v }

// parseCase is one document of the table.
type parseCase struct {
	name string
	doc  string
	cap  int    // WithMaxAttemptsCap(cap) when not 0
	meth string // the method looked up; testMethod when empty
	// lenient parses with Lenient: grpc-go's verdict on a document whose
	// typo or empty entry changes which methods a policy covers.
	lenient bool

	// For a valid document: what Lookup returns (nil: no entry applies) and
	// the top-level blocks.
	want           *serviceconfig.MethodConfig
	wantThrottling *serviceconfig.RetryThrottling
	wantBudget     *serviceconfig.RetryBudget

	// wantErr, when set, is a part of the error text the document must get.
	wantErr string

	// grpc, when set, says why grpc-go v1.85 gives the opposite verdict: the
	// gRFC A6 corrections, our extension blocks, and the balancer registry.
	grpc string
}

// Why grpc-go and Parse differ, for parseCase.grpc.
const (
	diffCodeCase  = "A6: status code names are case-insensitive; grpc-go wants upper case"
	diffHedging   = "A6: hedgingPolicy is parsed and validated; grpc-go ignores it"
	diffBoth      = "A6: retryPolicy and hedgingPolicy are exclusive; grpc-go ignores hedgingPolicy"
	diffThrottle  = "A6: retryThrottling is validated even without methodConfig"
	diffExtension = "extension block: grpc-go ignores it"
	diffRegistry  = "grpc-go needs a registered balancer; a pure package cannot see the registry"
	diffNames     = "a name that can never match a call is refused; grpc-go accepts it and applies it to nothing"
	diffCoverage  = "a typo or empty entry that changes which methods a policy covers is refused; grpc-go accepts it (as Parse does with Lenient)"
)

func parseCases() []parseCase {
	return []parseCase{
		// The document as a whole.
		{name: "empty document", doc: ``, wantErr: "serviceconfig: no JSON service config provided"},
		{name: "only spaces", doc: "  \n ", wantErr: "invalid JSON at line 2, column 1: unexpected end of JSON input"},
		{name: "null document", doc: `null`},
		{name: "empty object", doc: `{}`},
		{name: "array document", doc: `[]`, wantErr: "serviceconfig: must be an object, not an array"},
		{name: "string document", doc: `"{}"`, wantErr: "serviceconfig: must be an object, not a string"},
		{name: "number document", doc: `42`, wantErr: "must be an object, not a number"},
		{name: "trailing document", doc: `{} {}`, wantErr: "invalid character '{' after top-level value"},
		{name: "trailing garbage", doc: orders("") + `x`, wantErr: "after top-level value"},
		{name: "trailing comma", doc: `{"methodConfig": [{"name": [{"service": "shop.Orders"}], "timeout": "1s",}]}`,
			wantErr: "serviceconfig: methodConfig[0]: invalid JSON at line 1, column 74: invalid character '}'"},
		{name: "comment", doc: "{// retry\n}", wantErr: "invalid JSON at line 1, column 2"},
		{name: "byte order mark", doc: "\ufeff{}", wantErr: "invalid JSON at line 1, column 1"},
		{name: "unknown fields are ignored", lenient: true,
			doc:  `{"foo": [1, {}], "methodConfig": [{"name": [{"service": "shop.Orders", "x": 1}], "bar": null, "retryPolicy": ` + retry(`"extra": {}`) + `}]}`,
			want: svc(serviceconfig.MethodConfig{RetryPolicy: baseRetry()})},
		{name: "keys match in any case",
			doc:  `{"MethodConfig": [{"NAME": [{"Service": "shop.Orders"}], "retrypolicy": {"MAXATTEMPTS": 3, "InitialBackoff": "0.1s", "maxbackoff": "1s", "BackoffMultiplier": 2, "RetryableStatusCodes": ["UNAVAILABLE"]}}]}`,
			want: svc(serviceconfig.MethodConfig{RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) { p.MaxAttempts = 3 })})},
		{name: "methodConfig null", doc: `{"methodConfig": null}`},
		{name: "methodConfig empty", doc: `{"methodConfig": []}`},
		{name: "methodConfig null entry", doc: `{"methodConfig": [null]}`, lenient: true},
		{name: "methodConfig null entry refused", doc: `{"methodConfig": [null]}`, grpc: diffCoverage,
			wantErr: `serviceconfig: methodConfig[0]: has no "name", so it applies to no method (grpc-go skips it)`},
		{name: "methodConfig object", doc: `{"methodConfig": {}}`, wantErr: "serviceconfig: methodConfig: must be an array, not an object"},
		{name: "methodConfig entry number", doc: `{"methodConfig": [{"name": []}, 7]}`, wantErr: "serviceconfig: methodConfig[1]: must be an object, not a number"},

		// Names and lookup.
		{name: "exact method", doc: `{"methodConfig": [{"name": [{"service": "shop.Orders", "method": "Create"}], "timeout": "2s"}]}`,
			want: &serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: "shop.Orders", Method: "Create"}}, Timeout: 2 * time.Second}},
		{name: "exact method does not match another", meth: "/shop.Orders/Cancel",
			doc: `{"methodConfig": [{"name": [{"service": "shop.Orders", "method": "Create"}], "timeout": "2s"}]}`},
		{name: "whole service", doc: orders(`"timeout": "2s"`), meth: "/shop.Orders/Cancel",
			want: svc(serviceconfig.MethodConfig{Timeout: 2 * time.Second})},
		{name: "whole service by empty method", doc: `{"methodConfig": [{"name": [{"service": "shop.Orders", "method": ""}], "timeout": "2s"}]}`,
			want: svc(serviceconfig.MethodConfig{Timeout: 2 * time.Second})},
		{name: "other service", doc: orders(`"timeout": "2s"`), meth: "/shop.Carts/Create"},
		{name: "default name", doc: `{"methodConfig": [{"name": [{}], "timeout": "3s"}]}`, meth: "/any.Service/Any",
			want: &serviceconfig.MethodConfig{Name: []serviceconfig.Name{{}}, Timeout: 3 * time.Second}},
		{name: "null name element is the default name with Lenient", doc: `{"methodConfig": [{"name": [null], "timeout": "3s"}]}`, lenient: true,
			want: &serviceconfig.MethodConfig{Name: []serviceconfig.Name{{}}, Timeout: 3 * time.Second}},
		{name: "exact beats service and default", doc: precedence,
			want: &serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: "shop.Orders", Method: "Create"}}, Timeout: 1 * time.Second}},
		{name: "service beats default", doc: precedence, meth: "/shop.Orders/Cancel",
			want: &serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: "shop.Orders"}}, RetryPolicy: baseRetry()}},
		{name: "default for the rest", doc: precedence, meth: "/shop.Carts/Get",
			want: &serviceconfig.MethodConfig{Name: []serviceconfig.Name{{}}, WaitForReady: ptr(true)}},
		{name: "several names share an entry", meth: "/shop.Carts/Get",
			doc:  `{"methodConfig": [{"name": [{"service": "shop.Orders"}, {"service": "shop.Carts", "method": "Get"}], "timeout": "1s"}]}`,
			want: &serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: "shop.Orders"}, {Service: "shop.Carts", Method: "Get"}}, Timeout: time.Second}},
		{name: "method without service", doc: `{"methodConfig": [{"name": [{"method": "Create"}]}]}`,
			wantErr: `serviceconfig: methodConfig[0].name[0]: method "Create" set without service`},
		{name: "method with null service", doc: `{"methodConfig": [{"name": [{"service": null, "method": "Create"}]}]}`,
			wantErr: `methodConfig[0].name[0]: method "Create" set without service`},
		{name: "duplicate name across entries", doc: `{"methodConfig": [{"name": [{"service": "shop.Orders"}]}, {"name": [{"service": "shop.Orders"}]}]}`,
			wantErr: "serviceconfig: methodConfig[1].name[0]: duplicates the name at methodConfig[0].name[0]"},
		{name: "duplicate name in one entry", doc: `{"methodConfig": [{"name": [{"service": "a", "method": "M"}, {"service": "a", "method": "M"}]}]}`,
			wantErr: "methodConfig[0].name[1]: duplicates the name at methodConfig[0].name[0]"},
		{name: "duplicate default", doc: `{"methodConfig": [{"name": [{}]}, {"name": [null]}]}`,
			wantErr: "methodConfig[1].name[0]: duplicates the name at methodConfig[0].name[0]"},
		{name: "duplicate service with empty method", doc: `{"methodConfig": [{"name": [{"service": "a"}, {"service": "a", "method": ""}]}]}`,
			wantErr: "methodConfig[0].name[1]: duplicates"},
		{name: "service holding a full method", doc: `{"methodConfig": [{"name": [{"service": "/shop.Orders/Pay"}]}]}`, grpc: diffNames,
			wantErr: `methodConfig[0].name[0]: service "/shop.Orders/Pay" holds a slash: for one method write {"service": "shop.Orders", "method": "Pay"}`},
		{name: "service with a slash", doc: `{"methodConfig": [{"name": [{"service": "a/b", "method": "c"}]}]}`, grpc: diffNames,
			wantErr: `methodConfig[0].name[0]: service "a/b" holds a slash`},
		{name: "method with a slash", doc: `{"methodConfig": [{"name": [{"service": "a", "method": "b/c"}], "timeout": "1s"}]}`, grpc: diffNames,
			wantErr: `methodConfig[0].name[0]: method "b/c" holds a slash: a method is its bare name, such as "c"`},
		{name: "service with a space", doc: `{"methodConfig": [{"name": [{"service": "shop.Orders "}]}]}`, grpc: diffNames,
			wantErr: `methodConfig[0].name[0]: service "shop.Orders " holds a space or control character`},
		{name: "service in protoc's dotted form", doc: `{"methodConfig": [{"name": [{"service": ".shop.Orders"}]}]}`, grpc: diffNames,
			wantErr: `methodConfig[0].name[0]: service ".shop.Orders" has an empty part: write it as "shop.Orders", package and service`},
		// A typo that changes which methods a policy covers: refused, and
		// with Lenient read as grpc-go reads it.
		{name: "unknown key in a name is refused", grpc: diffCoverage,
			doc:     `{"methodConfig": [{"name": [{"services": "shop.Orders"}], "retryPolicy": ` + retry(`"maxAttempts": 10`) + `}]}`,
			wantErr: `serviceconfig: methodConfig[0].name[0].services: unknown key: did you mean "service"? grpc-go ignores it, which leaves the name {}, the default entry: its policies would apply to every method`},
		{name: "unknown key in a name makes the default entry with Lenient", lenient: true, meth: "/grpc.health.v1.Health/Check",
			doc:  `{"methodConfig": [{"name": [{"services": "shop.Orders"}], "retryPolicy": ` + retry(`"maxAttempts": 10`) + `}]}`,
			want: &serviceconfig.MethodConfig{Name: []serviceconfig.Name{{}}, RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) { p.MaxAttempts = 5 })}},
		{name: "misspelt method widens a name to its service", grpc: diffCoverage,
			doc:     `{"methodConfig": [{"name": [{"service": "shop.Orders", "methods": "Pay"}], "timeout": "1s"}]}`,
			wantErr: `serviceconfig: methodConfig[0].name[0].methods: unknown key: did you mean "method"? grpc-go ignores it, which leaves the name {"service": "shop.Orders"}: its policies would apply to every method of shop.Orders`},
		{name: "misspelt method widens a name with Lenient", lenient: true,
			doc:  `{"methodConfig": [{"name": [{"service": "shop.Orders", "methods": "Pay"}], "timeout": "1s"}]}`,
			want: svc(serviceconfig.MethodConfig{Timeout: time.Second})},
		{name: "any unknown key in a name is refused", grpc: diffCoverage,
			doc:     `{"methodConfig": [{"name": [{"service": "shop.Orders", "method": "Create", "comment": "x"}], "timeout": "1s"}]}`,
			wantErr: `serviceconfig: methodConfig[0].name[0].comment: unknown key (a name holds only "service" and "method"): grpc-go ignores it`},
		// null in a name, as a template whose variable is unset writes it,
		// and a key given twice where grpc-go merges the two into a name
		// neither wrote: refused, and with Lenient read as grpc-go reads it.
		{name: "null name element is refused", grpc: diffCoverage,
			doc:     `{"methodConfig": [{"name": [{"service": "shop.Carts"}, null], "retryPolicy": ` + retry() + `}]}`,
			wantErr: `serviceconfig: methodConfig[0].name[1]: null: grpc-go reads it as {}, the default entry: its policies would apply to every method (write {} if every method is meant)`},
		{name: "null service is refused", grpc: diffCoverage,
			doc:     `{"methodConfig": [{"name": [{"service": null}], "retryPolicy": ` + retry() + `}]}`,
			wantErr: `serviceconfig: methodConfig[0].name[0].service: null: grpc-go reads it as "", which leaves the name {}, the default entry: its policies would apply to every method (write {} if every method is meant)`},
		{name: "null service makes the default entry with Lenient", lenient: true, meth: "/grpc.health.v1.Health/Check",
			doc:  `{"methodConfig": [{"name": [{"service": null}], "retryPolicy": ` + retry() + `}]}`,
			want: &serviceconfig.MethodConfig{Name: []serviceconfig.Name{{}}, RetryPolicy: baseRetry()}},
		{name: "null method widening a name to its service is refused", grpc: diffCoverage,
			doc:     `{"methodConfig": [{"name": [{"service": "shop.Orders", "method": null}], "timeout": "1s"}]}`,
			wantErr: `serviceconfig: methodConfig[0].name[0].method: null: grpc-go reads it as "", which leaves the name {"service": "shop.Orders"}: its policies would apply to every method of shop.Orders (leave "method" out if the whole service is meant)`},
		{name: "null method widens a name to its service with Lenient", lenient: true,
			doc:  `{"methodConfig": [{"name": [{"service": "shop.Orders", "method": null}], "timeout": "1s"}]}`,
			want: svc(serviceconfig.MethodConfig{Timeout: time.Second})},
		{name: "key given twice in a name is refused", grpc: diffCoverage,
			doc:     `{"methodConfig": [{"name": [{"service": "shop.Carts", "Service": ""}], "retryPolicy": ` + retry() + `}]}`,
			wantErr: `serviceconfig: methodConfig[0].name[0].Service: given twice: grpc-go keeps the last value, which leaves the name {}, the default entry: its policies would apply to every method`},
		{name: "key given twice in a name makes the default entry with Lenient", lenient: true,
			doc:  `{"methodConfig": [{"name": [{"service": "shop.Carts", "Service": ""}], "retryPolicy": ` + retry() + `}]}`,
			want: &serviceconfig.MethodConfig{Name: []serviceconfig.Name{{}}, RetryPolicy: baseRetry()}},
		{name: "name given twice in an entry is refused", grpc: diffCoverage,
			doc: `{"methodConfig": [{"name": [{"service": "shop.Orders", "method": "Pay"}], "timeout": "1s", "name": [{"service": "shop.Carts"}]}]}`,
			wantErr: `serviceconfig: methodConfig[0].name: given twice: grpc-go decodes the second list into the first, element by element ` +
				`(their fields merge, and elements past the second list's end are dropped), so the methods selected are not those either list names`},
		{name: "name given twice merges the lists with Lenient", lenient: true, meth: "/shop.Carts/Pay",
			doc:  `{"methodConfig": [{"name": [{"service": "shop.Orders", "method": "Pay"}], "timeout": "1s", "name": [{"service": "shop.Carts"}]}]}`,
			want: &serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: "shop.Carts", Method: "Pay"}}, Timeout: time.Second}},
		{name: "methodConfig given twice is refused", grpc: diffCoverage,
			doc:     `{"methodConfig": [{"name": [{"service": "shop.Orders"}], "timeout": "1s"}, {"name": [{"service": "shop.Carts"}]}], "methodConfig": [{"waitForReady": true}]}`,
			wantErr: `serviceconfig: methodConfig: given twice: grpc-go decodes the second list into the first`},
		{name: "misspelt methodConfig is refused", grpc: diffCoverage,
			doc:     `{"methodConfigs": [{"name": [{"service": "shop.Orders"}], "timeout": "1s"}]}`,
			wantErr: `serviceconfig: methodConfigs: unknown key: did you mean "methodConfig"? grpc-go ignores it, so the entries it holds apply to no method`},
		{name: "misspelt methodConfig beside methodConfig is refused", grpc: diffCoverage,
			doc:     `{"methodConfig": [{"name": [{"service": "shop.Carts"}], "timeout": "1s"}], "methodconfig_": [{"name": [{"service": "shop.Orders"}], "timeout": "1s"}]}`,
			wantErr: `serviceconfig: methodconfig_: unknown key: did you mean "methodConfig"?`},
		{name: "misspelt methodConfig gives an empty config with Lenient", lenient: true,
			doc: `{"methodConfigs": [{"name": [{"service": "shop.Orders"}], "timeout": "1s"}]}`},
		{name: "unknown top-level key without methodConfig is refused", grpc: diffCoverage,
			doc:     `{"rules": [{"name": [{"service": "shop.Orders"}], "timeout": "1s"}], "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}`,
			wantErr: `serviceconfig: rules: unknown key, in a document without methodConfig: grpc-go ignores it, so if it holds the method config, no method gets a policy`},
		{name: "unknown top-level key beside methodConfig is a warning",
			doc:  `{"rules": 1, "methodConfig": [{"name": [{"service": "shop.Orders"}], "timeout": "1s"}]}`,
			want: svc(serviceconfig.MethodConfig{Timeout: time.Second})},
		{name: "misspelt top-level key without methodConfig is a warning",
			doc:            `{"retryThrotling": {"maxTokens": 10, "tokenRatio": 0.1}, "retryThrottling": {"maxTokens": 5, "tokenRatio": 0.5}}`,
			wantThrottling: &serviceconfig.RetryThrottling{MaxTokens: 5, TokenRatio: 0.5}},
		{name: "misspelt name is refused", grpc: diffCoverage,
			doc:     `{"methodConfig": [{"names": [{"service": "shop.Orders"}], "timeout": "1s"}]}`,
			wantErr: `serviceconfig: methodConfig[0].names: unknown key: did you mean "name"? grpc-go ignores it, which leaves the entry without a name: it applies to no method (grpc-go skips it)`},
		{name: "misspelt name beside name is refused", grpc: diffCoverage,
			doc:     `{"methodConfig": [{"name": [{"service": "shop.Carts"}], "nmae": [{"service": "shop.Orders"}], "timeout": "1s"}]}`,
			wantErr: `serviceconfig: methodConfig[0].nmae: unknown key: did you mean "name"? grpc-go ignores it, so the methods it lists get none of the entry's policies`},
		{name: "entry without name is refused", grpc: diffCoverage,
			doc:     `{"methodConfig": [{"name": [{"service": "shop.Carts"}]}, {"retryPolicy": ` + retry() + `}]}`,
			wantErr: `serviceconfig: methodConfig[1]: has no "name", so it applies to no method (grpc-go skips it): give it "name": [{"service": "package.Service"}], or [{}] for every method`},
		{name: "entry with null name is refused", grpc: diffCoverage,
			doc:     `{"methodConfig": [{"name": null, "timeout": "1s"}]}`,
			wantErr: `serviceconfig: methodConfig[0]: has no "name"`},
		{name: "entry with empty name list is refused", grpc: diffCoverage,
			doc:     `{"methodConfig": [{"name": [], "timeout": "1s"}]}`,
			wantErr: `serviceconfig: methodConfig[0].name: is empty, so the entry applies to no method: list its methods, or write [{}] for every method`},
		{name: "entry without name is skipped unchecked", lenient: true,
			doc: `{"methodConfig": [{"retryPolicy": {"maxAttempts": 1}, "timeout": "1s"}]}`},
		{name: "entry with null name is skipped unchecked", lenient: true,
			doc:  `{"methodConfig": [{"name": null, "retryPolicy": {}}, {"name": [{"service": "shop.Orders"}], "timeout": "1s"}]}`,
			want: svc(serviceconfig.MethodConfig{Timeout: time.Second})},
		{name: "entry without name must still decode", doc: `{"methodConfig": [{"timeout": "1"}]}`,
			wantErr: `serviceconfig: methodConfig[0].timeout: "1" is not a duration`},
		{name: "entry without name must still have known codes",
			doc:     `{"methodConfig": [{"retryPolicy": {"retryableStatusCodes": ["NOPE"]}}]}`,
			wantErr: `methodConfig[0].retryPolicy.retryableStatusCodes[0]: unknown status code "NOPE"`},
		{name: "entry with empty name list is checked", doc: `{"methodConfig": [{"name": [], "retryPolicy": {"maxAttempts": 1}}]}`,
			wantErr: "methodConfig[0].retryPolicy.maxAttempts: must be greater than 1"},
		{name: "entry with empty name list applies to nothing", doc: `{"methodConfig": [{"name": [], "timeout": "1s"}]}`, lenient: true},
		{name: "name not an array", doc: `{"methodConfig": [{"name": {"service": "shop.Orders"}}]}`,
			wantErr: "serviceconfig: methodConfig[0].name: must be an array, not an object"},
		{name: "service not a string", doc: `{"methodConfig": [{"name": [{"service": 7}]}]}`,
			wantErr: "serviceconfig: methodConfig[0].name[0].service: must be a string, not a number"},
		{name: "one bad entry spoils the document",
			doc:     `{"methodConfig": [{"name": [{"service": "shop.Orders"}], "timeout": "1s"}, {"name": [{"service": "shop.Carts"}], "retryPolicy": ` + retry(`"maxAttempts": 1`) + `}]}`,
			wantErr: "serviceconfig: methodConfig[1].retryPolicy.maxAttempts: must be greater than 1"},

		// timeout, waitForReady and message sizes.
		{name: "timeout", doc: orders(`"timeout": "1.5s"`), want: svc(serviceconfig.MethodConfig{Timeout: 1500 * time.Millisecond})},
		{name: "timeout null", doc: orders(`"timeout": null`), want: svc(serviceconfig.MethodConfig{})},
		{name: "timeout fraction only", doc: orders(`"timeout": ".05s"`), want: svc(serviceconfig.MethodConfig{Timeout: 50 * time.Millisecond})},
		{name: "timeout with empty fraction", doc: orders(`"timeout": "2.s"`), want: svc(serviceconfig.MethodConfig{Timeout: 2 * time.Second})},
		{name: "timeout zero fails calls at once", doc: orders(`"timeout": "0s"`), want: svc(serviceconfig.MethodConfig{Timeout: time.Nanosecond})},
		{name: "timeout nanoseconds", doc: orders(`"timeout": "0.000000001s"`), want: svc(serviceconfig.MethodConfig{Timeout: 1})},
		{name: "timeout with escaped s", doc: orders(`"timeout": "1\u0073"`), want: svc(serviceconfig.MethodConfig{Timeout: time.Second})},
		{name: "timeout without unit", doc: orders(`"timeout": "1"`), wantErr: `serviceconfig: methodConfig[0].timeout: "1" is not a duration: it needs its unit: write "1s" for seconds`},
		{name: "timeout in milliseconds", doc: orders(`"timeout": "100ms"`), wantErr: `methodConfig[0].timeout: "100ms" is not a duration: a service config takes seconds, so write "0.1s"`},
		{name: "timeout in minutes", doc: orders(`"timeout": "1m30s"`), wantErr: `methodConfig[0].timeout: "1m30s" is not a duration: a service config takes seconds, so write "90s"`},
		{name: "timeout as a JSON number", doc: orders(`"timeout": 0.25`), wantErr: `methodConfig[0].timeout: must be a duration string such as "0.5s", not a number: write "0.25s"`},
		{name: "timeout upper-case S", doc: orders(`"timeout": "1S"`), wantErr: `methodConfig[0].timeout: "1S" is not a duration`},
		{name: "timeout as number", doc: orders(`"timeout": 1`), wantErr: `methodConfig[0].timeout: must be a duration string such as "0.5s", not a number`},
		{name: "timeout ten fraction digits", doc: orders(`"timeout": "1.0000000001s"`), wantErr: "more than 9 digits after the dot"},
		{name: "timeout two dots", doc: orders(`"timeout": "1.2.3s"`), wantErr: "too many dots"},
		{name: "timeout no digits", doc: orders(`"timeout": ".s"`), wantErr: "no digits"},
		{name: "timeout exponent", doc: orders(`"timeout": "1e3s"`), wantErr: "bad seconds"},
		{name: "timeout leading space", doc: orders(`"timeout": " 1s"`), wantErr: "bad seconds"},
		{name: "timeout negative is ignored as grpc ignores it", doc: orders(`"timeout": "-1s"`), want: svc(serviceconfig.MethodConfig{})},
		{name: "timeout plus sign as grpc reads it", doc: orders(`"timeout": "+1s"`), want: svc(serviceconfig.MethodConfig{Timeout: time.Second})},
		{name: "timeout signed fraction as grpc reads it", doc: orders(`"timeout": "1.-5s"`), want: svc(serviceconfig.MethodConfig{Timeout: 950 * time.Millisecond})},
		{name: "timeout at the protobuf limit is clamped", doc: orders(`"timeout": "315576000000s"`), want: svc(serviceconfig.MethodConfig{Timeout: math.MaxInt64})},
		{name: "timeout past time.Duration is clamped", doc: orders(`"timeout": "9223372036.854775808s"`), want: svc(serviceconfig.MethodConfig{Timeout: math.MaxInt64})},
		{name: "timeout past the protobuf limit", doc: orders(`"timeout": "315576000001s"`), wantErr: `"315576000001s" is out of range`},
		{name: "waitForReady", doc: orders(`"waitForReady": true`), want: svc(serviceconfig.MethodConfig{WaitForReady: ptr(true)})},
		{name: "waitForReady false", doc: orders(`"waitForReady": false`), want: svc(serviceconfig.MethodConfig{WaitForReady: ptr(false)})},
		{name: "waitForReady null", doc: orders(`"waitForReady": null`), want: svc(serviceconfig.MethodConfig{})},
		{name: "waitForReady string", doc: orders(`"waitForReady": "true"`), wantErr: "methodConfig[0].waitForReady: must be true or false, not a string"},
		{name: "message sizes", doc: orders(`"maxRequestMessageBytes": 1024, "maxResponseMessageBytes": 9223372036854775807`),
			want: svc(serviceconfig.MethodConfig{MaxRequestMessageBytes: ptr[int64](1024), MaxResponseMessageBytes: ptr[int64](math.MaxInt64)})},
		{name: "message size negative as grpc keeps it", doc: orders(`"maxRequestMessageBytes": -1`),
			want: svc(serviceconfig.MethodConfig{MaxRequestMessageBytes: ptr[int64](-1)})},
		{name: "message size string", doc: orders(`"maxRequestMessageBytes": "1024"`), wantErr: "methodConfig[0].maxRequestMessageBytes: must be an integer, not a string"},
		{name: "message size fraction", doc: orders(`"maxResponseMessageBytes": 1.5`), wantErr: "methodConfig[0].maxResponseMessageBytes: must be an integer, not 1.5"},
		{name: "message size exponent", doc: orders(`"maxResponseMessageBytes": 1e3`), wantErr: "must be an integer, not 1e3"},
		{name: "message size overflow", doc: orders(`"maxRequestMessageBytes": 9223372036854775808`), wantErr: "9223372036854775808 is out of range"},

		// retryPolicy.
		{name: "retry policy", doc: ordersRetry(), want: svc(serviceconfig.MethodConfig{RetryPolicy: baseRetry()})},
		{name: "retry policy null", doc: orders(`"retryPolicy": null`), want: svc(serviceconfig.MethodConfig{})},
		{name: "retry policy empty", doc: orders(`"retryPolicy": {}`), wantErr: "methodConfig[0].retryPolicy.maxAttempts: is required and must be greater than 1"},
		{name: "retry policy array", doc: orders(`"retryPolicy": []`), wantErr: "methodConfig[0].retryPolicy: must be an object, not an array"},
		{name: "maxAttempts 1", doc: ordersRetry(`"maxAttempts": 1`), wantErr: "serviceconfig: methodConfig[0].retryPolicy.maxAttempts: must be greater than 1"},
		{name: "maxAttempts negative", doc: ordersRetry(`"maxAttempts": -3`), wantErr: "retryPolicy.maxAttempts: must be greater than 1"},
		{name: "maxAttempts absent", doc: ordersRetry(`-maxAttempts`), wantErr: "retryPolicy.maxAttempts: is required and must be greater than 1"},
		{name: "maxAttempts null", doc: ordersRetry(`"maxAttempts": null`), wantErr: "retryPolicy.maxAttempts: must be greater than 1"},
		{name: "maxAttempts 2.0", doc: ordersRetry(`"maxAttempts": 2.0`), wantErr: "retryPolicy.maxAttempts: must be an integer, not 2.0"},
		{name: "maxAttempts string", doc: ordersRetry(`"maxAttempts": "3"`), wantErr: "retryPolicy.maxAttempts: must be an integer, not a string"},
		{name: "maxAttempts 2", doc: ordersRetry(`"maxAttempts": 2`),
			want: svc(serviceconfig.MethodConfig{RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) { p.MaxAttempts = 2 })})},
		{name: "maxAttempts clamped to 5", doc: ordersRetry(`"maxAttempts": 10`),
			want: svc(serviceconfig.MethodConfig{RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) { p.MaxAttempts = 5 })})},
		{name: "maxAttempts clamped to a raised cap", doc: ordersRetry(`"maxAttempts": 10`), cap: 7,
			want: svc(serviceconfig.MethodConfig{RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) { p.MaxAttempts = 7 })})},
		{name: "maxAttempts under a raised cap", doc: ordersRetry(`"maxAttempts": 6`), cap: 100,
			want: svc(serviceconfig.MethodConfig{RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) { p.MaxAttempts = 6 })})},
		{name: "cap under 2 means 5", doc: ordersRetry(`"maxAttempts": 10`), cap: 1,
			want: svc(serviceconfig.MethodConfig{RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) { p.MaxAttempts = 5 })})},
		{name: "initialBackoff zero", doc: ordersRetry(`"initialBackoff": "0s"`), wantErr: "methodConfig[0].retryPolicy.initialBackoff: must be greater than 0"},
		{name: "initialBackoff absent", doc: ordersRetry(`-initialBackoff`), wantErr: "retryPolicy.initialBackoff: is required and must be greater than 0"},
		{name: "initialBackoff null", doc: ordersRetry(`"initialBackoff": null`), wantErr: `retryPolicy.initialBackoff: must be a duration string such as "0.5s", not null`},
		{name: "initialBackoff without unit", doc: ordersRetry(`"initialBackoff": "1"`), wantErr: `retryPolicy.initialBackoff: "1" is not a duration`},
		{name: "maxBackoff negative", doc: ordersRetry(`"maxBackoff": "-1s"`), wantErr: "retryPolicy.maxBackoff: must be greater than 0"},
		{name: "maxBackoff below initialBackoff is allowed", doc: ordersRetry(`"maxBackoff": "0.01s"`),
			want: svc(serviceconfig.MethodConfig{RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) { p.MaxBackoff = 10 * time.Millisecond })})},
		{name: "backoffMultiplier zero", doc: ordersRetry(`"backoffMultiplier": 0`), wantErr: "retryPolicy.backoffMultiplier: must be greater than 0"},
		{name: "backoffMultiplier negative", doc: ordersRetry(`"backoffMultiplier": -2`), wantErr: "retryPolicy.backoffMultiplier: must be greater than 0"},
		{name: "backoffMultiplier below 1", doc: ordersRetry(`"backoffMultiplier": 0.5`),
			want: svc(serviceconfig.MethodConfig{RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) { p.BackoffMultiplier = 0.5 })})},
		{name: "backoffMultiplier string", doc: ordersRetry(`"backoffMultiplier": "2"`), wantErr: "retryPolicy.backoffMultiplier: must be a number, not a string"},
		{name: "backoffMultiplier out of range", doc: ordersRetry(`"backoffMultiplier": 1e400`), wantErr: "retryPolicy.backoffMultiplier: 1e400 is out of range"},
		{name: "retryableStatusCodes empty", doc: ordersRetry(`"retryableStatusCodes": []`), wantErr: "retryPolicy.retryableStatusCodes: must not be empty"},
		{name: "retryableStatusCodes absent", doc: ordersRetry(`-retryableStatusCodes`), wantErr: "retryPolicy.retryableStatusCodes: is required and must not be empty"},
		{name: "retryableStatusCodes null", doc: ordersRetry(`"retryableStatusCodes": null`), wantErr: "retryPolicy.retryableStatusCodes: must not be empty"},
		{name: "retryableStatusCodes not an array", doc: ordersRetry(`"retryableStatusCodes": "UNAVAILABLE"`), wantErr: "retryPolicy.retryableStatusCodes: must be an array of status codes, not a string"},
		{name: "status codes as numbers", doc: ordersRetry(`"retryableStatusCodes": [14, 4, 0, 16]`),
			want: svc(serviceconfig.MethodConfig{RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) {
				p.RetryableStatusCodes = []codes.Code{codes.OK, codes.DeadlineExceeded, codes.Unavailable, codes.Unauthenticated}
			})})},
		{name: "status codes repeated", doc: ordersRetry(`"retryableStatusCodes": ["UNAVAILABLE", 14, "UNAVAILABLE"]`),
			want: svc(serviceconfig.MethodConfig{RetryPolicy: baseRetry()})},
		{name: "status codes in lower case", doc: ordersRetry(`"retryableStatusCodes": ["unavailable", "Resource_Exhausted"]`), grpc: diffCodeCase,
			want: svc(serviceconfig.MethodConfig{RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) {
				p.RetryableStatusCodes = []codes.Code{codes.ResourceExhausted, codes.Unavailable}
			})})},
		{name: "status code 17", doc: ordersRetry(`"retryableStatusCodes": [17]`), wantErr: "retryPolicy.retryableStatusCodes[0]: status code 17 is out of range"},
		{name: "status code negative", doc: ordersRetry(`"retryableStatusCodes": [14, -1]`), wantErr: "retryPolicy.retryableStatusCodes[1]: must be a status code name"},
		{name: "status code 14.0", doc: ordersRetry(`"retryableStatusCodes": [14.0]`), wantErr: "retryableStatusCodes[0]: must be a status code name"},
		{name: "status code number in a string", doc: ordersRetry(`"retryableStatusCodes": ["14"]`), wantErr: `retryableStatusCodes[0]: status code "14" is a string`},
		{name: "status code unknown", doc: ordersRetry(`"retryableStatusCodes": ["UNAVAILABLE", "TIMEOUT"]`), wantErr: `retryPolicy.retryableStatusCodes[1]: unknown status code "TIMEOUT"`},
		{name: "status code with escape", doc: ordersRetry(`"retryableStatusCodes": ["UNAVAILABL\u0045"]`), wantErr: "names may not hold escape sequences"},
		{name: "status code with Kelvin sign", doc: ordersRetry(`"retryableStatusCodes": ["O\u212a"]`), wantErr: "escape"},
		{name: "status code Kelvin sign unescaped", doc: ordersRetry(`"retryableStatusCodes": ["O` + "\u212a" + `"]`), wantErr: `unknown status code "O` + "\u212a" + `"`},
		{name: "status code null reads as OK", doc: ordersRetry(`"retryableStatusCodes": [null]`),
			want: svc(serviceconfig.MethodConfig{RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) { p.RetryableStatusCodes = []codes.Code{codes.OK} })})},
		{name: "status code object", doc: ordersRetry(`"retryableStatusCodes": [{}]`), wantErr: "retryableStatusCodes[0]: must be a status code name such as \"UNAVAILABLE\" or a number 0 to 16, not an object"},

		// Our retryPolicy fields.
		{name: "perAttemptRecvTimeout and jitter", doc: ordersRetry(`"perAttemptRecvTimeout": "0.5s"`, `"jitter": "full"`),
			want: svc(serviceconfig.MethodConfig{RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) {
				p.PerAttemptRecvTimeout = 500 * time.Millisecond
				p.Jitter = serviceconfig.JitterFull
			})})},
		{name: "jitter unknown", doc: ordersRetry(`"jitter": "FULL"`), grpc: diffExtension,
			wantErr: `methodConfig[0].retryPolicy.jitter: must be one of "a6", "full", "equal", "decorrelated", "none"`},
		{name: "jitter not a string", doc: ordersRetry(`"jitter": 1`), grpc: diffExtension, wantErr: "retryPolicy.jitter: must be a string, not a number"},
		{name: "perAttemptRecvTimeout without unit", doc: ordersRetry(`"perAttemptRecvTimeout": "1"`), grpc: diffExtension, wantErr: `retryPolicy.perAttemptRecvTimeout: "1" is not a duration`},
		{name: "perAttemptRecvTimeout negative", doc: ordersRetry(`"perAttemptRecvTimeout": "-1s"`), grpc: diffExtension, wantErr: "retryPolicy.perAttemptRecvTimeout: must not be negative"},

		// hedgingPolicy.
		{name: "hedging policy", doc: orders(`"hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.5s", "nonFatalStatusCodes": ["UNAVAILABLE", "internal"]}`),
			want: svc(serviceconfig.MethodConfig{HedgingPolicy: &serviceconfig.HedgingPolicy{
				MaxAttempts: 3, HedgingDelay: 500 * time.Millisecond, NonFatalStatusCodes: []codes.Code{codes.Internal, codes.Unavailable}}})},
		{name: "hedging policy minimal", doc: orders(`"hedgingPolicy": {"maxAttempts": 2}`),
			want: svc(serviceconfig.MethodConfig{HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2}})},
		{name: "hedging maxAttempts clamped", doc: orders(`"hedgingPolicy": {"maxAttempts": 9}`),
			want: svc(serviceconfig.MethodConfig{HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 5}})},
		{name: "hedging maxAttempts 1", doc: orders(`"hedgingPolicy": {"maxAttempts": 1}`), grpc: diffHedging,
			wantErr: "serviceconfig: methodConfig[0].hedgingPolicy.maxAttempts: must be greater than 1"},
		{name: "hedging maxAttempts absent", doc: orders(`"hedgingPolicy": {}`), grpc: diffHedging,
			wantErr: "methodConfig[0].hedgingPolicy.maxAttempts: is required and must be greater than 1"},
		{name: "hedging delay negative", doc: orders(`"hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "-1s"}`), grpc: diffHedging,
			wantErr: "methodConfig[0].hedgingPolicy.hedgingDelay: must not be negative"},
		{name: "hedging delay without unit", doc: orders(`"hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "500ms"}`), grpc: diffHedging,
			wantErr: `methodConfig[0].hedgingPolicy.hedgingDelay: "500ms" is not a duration`},
		{name: "hedging code unknown", doc: orders(`"hedgingPolicy": {"maxAttempts": 2, "nonFatalStatusCodes": ["NOPE"]}`), grpc: diffHedging,
			wantErr: `methodConfig[0].hedgingPolicy.nonFatalStatusCodes[0]: unknown status code "NOPE"`},
		{name: "hedging adaptive delay", doc: orders(`"hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.01s", "hedgingDelayQuantile": 0.95, "hedgingDelayFloor": "0.001s", "hedgingDelayMinSamples": 50}`),
			want: svc(serviceconfig.MethodConfig{HedgingPolicy: &serviceconfig.HedgingPolicy{
				MaxAttempts: 2, HedgingDelay: 10 * time.Millisecond,
				HedgingDelayQuantile: 0.95, HedgingDelayFloor: time.Millisecond, HedgingDelayMinSamples: 50}})},
		{name: "hedging adaptive delay alone", doc: orders(`"hedgingPolicy": {"maxAttempts": 2, "hedgingDelayQuantile": 0.9}`),
			want: svc(serviceconfig.MethodConfig{HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.9}})},
		{name: "hedging adaptive fields null", doc: orders(`"hedgingPolicy": {"maxAttempts": 2, "hedgingDelayQuantile": null, "hedgingDelayFloor": null, "hedgingDelayMinSamples": null}`),
			want: svc(serviceconfig.MethodConfig{HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2}})},
		{name: "hedging quantile 0", doc: orders(`"hedgingPolicy": {"maxAttempts": 2, "hedgingDelayQuantile": 0}`), grpc: diffHedging,
			wantErr: "serviceconfig: methodConfig[0].hedgingPolicy.hedgingDelayQuantile: must be between 0 and 1, exclusive"},
		{name: "hedging quantile 1", doc: orders(`"hedgingPolicy": {"maxAttempts": 2, "hedgingDelayQuantile": 1}`), grpc: diffHedging,
			wantErr: "serviceconfig: methodConfig[0].hedgingPolicy.hedgingDelayQuantile: must be between 0 and 1, exclusive"},
		{name: "hedging quantile a string", doc: orders(`"hedgingPolicy": {"maxAttempts": 2, "hedgingDelayQuantile": "0.9"}`), grpc: diffHedging,
			wantErr: "serviceconfig: methodConfig[0].hedgingPolicy.hedgingDelayQuantile: must be a number, not a string"},
		{name: "hedging floor negative", doc: orders(`"hedgingPolicy": {"maxAttempts": 2, "hedgingDelayQuantile": 0.9, "hedgingDelayFloor": "-1s"}`), grpc: diffHedging,
			wantErr: "serviceconfig: methodConfig[0].hedgingPolicy.hedgingDelayFloor: must not be negative"},
		{name: "hedging floor without quantile", doc: orders(`"hedgingPolicy": {"maxAttempts": 2, "hedgingDelayFloor": "0s"}`), grpc: diffHedging,
			wantErr: "serviceconfig: methodConfig[0].hedgingPolicy.hedgingDelayFloor: needs hedgingDelayQuantile"},
		{name: "hedging min samples negative", doc: orders(`"hedgingPolicy": {"maxAttempts": 2, "hedgingDelayQuantile": 0.9, "hedgingDelayMinSamples": -1}`), grpc: diffHedging,
			wantErr: "serviceconfig: methodConfig[0].hedgingPolicy.hedgingDelayMinSamples: must not be negative"},
		{name: "hedging min samples not an integer", doc: orders(`"hedgingPolicy": {"maxAttempts": 2, "hedgingDelayQuantile": 0.9, "hedgingDelayMinSamples": 1.5}`), grpc: diffHedging,
			wantErr: "serviceconfig: methodConfig[0].hedgingPolicy.hedgingDelayMinSamples: must be an integer, not 1.5"},
		{name: "hedging min samples without quantile", doc: orders(`"hedgingPolicy": {"maxAttempts": 2, "hedgingDelayMinSamples": 0}`), grpc: diffHedging,
			wantErr: "serviceconfig: methodConfig[0].hedgingPolicy.hedgingDelayMinSamples: needs hedgingDelayQuantile"},
		{name: "retry and hedging together", doc: orders(`"retryPolicy": ` + retry() + `, "hedgingPolicy": {"maxAttempts": 2}`), grpc: diffBoth,
			wantErr: "serviceconfig: methodConfig[0].hedgingPolicy: cannot be set together with retryPolicy"},
		{name: "retry and null hedging", doc: orders(`"retryPolicy": ` + retry() + `, "hedgingPolicy": null`),
			want: svc(serviceconfig.MethodConfig{RetryPolicy: baseRetry()})},

		// retryThrottling.
		{name: "throttling", doc: `{"methodConfig": [], "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}`,
			wantThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 0.1}},
		{name: "throttling at the limits", doc: `{"methodConfig": [], "retryThrottling": {"maxTokens": 1000, "tokenRatio": 0.001}}`,
			wantThrottling: &serviceconfig.RetryThrottling{MaxTokens: 1000, TokenRatio: 0.001}},
		{name: "throttling fractional tokens", doc: `{"methodConfig": [], "retryThrottling": {"maxTokens": 0.5, "tokenRatio": 2}}`,
			wantThrottling: &serviceconfig.RetryThrottling{MaxTokens: 0.5, TokenRatio: 2}},
		{name: "tokenRatio cut to three decimals", doc: `{"methodConfig": [], "retryThrottling": {"maxTokens": 10, "tokenRatio": 1.0059}}`,
			wantThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 1.005}},
		{name: "tokenRatio cut in decimal, not binary", doc: `{"methodConfig": [], "retryThrottling": {"maxTokens": 10, "tokenRatio": 1.005}}`,
			wantThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 1.005}},
		{name: "tokenRatio with exponent", doc: `{"methodConfig": [], "retryThrottling": {"maxTokens": 10, "tokenRatio": 12345e-4}}`,
			wantThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 1.234}},
		{name: "tokenRatio under 0.001 runs as 0.001", doc: `{"methodConfig": [], "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.0009}}`,
			wantThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 0.001}},
		{name: "tokenRatio tiny runs as 0.001", doc: `{"methodConfig": [], "retryThrottling": {"maxTokens": 10, "tokenRatio": 1e-9}}`,
			wantThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 0.001}},
		{name: "tokenRatio zero", doc: `{"methodConfig": [], "retryThrottling": {"maxTokens": 10, "tokenRatio": 0}}`, wantErr: "retryThrottling.tokenRatio: must be greater than 0"},
		{name: "tokenRatio negative", doc: `{"methodConfig": [], "retryThrottling": {"maxTokens": 10, "tokenRatio": -0.1}}`, wantErr: "retryThrottling.tokenRatio: must be greater than 0"},
		{name: "tokenRatio absent", doc: `{"methodConfig": [], "retryThrottling": {"maxTokens": 10}}`, wantErr: "retryThrottling.tokenRatio"},
		{name: "maxTokens zero", doc: `{"methodConfig": [], "retryThrottling": {"maxTokens": 0, "tokenRatio": 0.1}}`,
			wantErr: "serviceconfig: retryThrottling.maxTokens: must be greater than 0 and at most 1000"},
		{name: "maxTokens over 1000", doc: `{"methodConfig": [], "retryThrottling": {"maxTokens": 1000.5, "tokenRatio": 0.1}}`, wantErr: "retryThrottling.maxTokens: must be greater than 0 and at most 1000"},
		{name: "maxTokens string", doc: `{"methodConfig": [], "retryThrottling": {"maxTokens": "10", "tokenRatio": 0.1}}`, wantErr: "retryThrottling.maxTokens: must be a number, not a string"},
		{name: "throttling empty", doc: `{"methodConfig": [], "retryThrottling": {}}`, wantErr: "retryThrottling.maxTokens"},
		{name: "throttling null", doc: `{"methodConfig": [], "retryThrottling": null}`},
		{name: "throttling array", doc: `{"retryThrottling": []}`, wantErr: "serviceconfig: retryThrottling: must be an object, not an array"},
		{name: "bad throttling without methodConfig", doc: `{"retryThrottling": {"maxTokens": 0, "tokenRatio": 0.1}}`, grpc: diffThrottle,
			wantErr: "retryThrottling.maxTokens: must be greater than 0 and at most 1000"},
		{name: "bad throttling with null methodConfig", doc: `{"methodConfig": null, "retryThrottling": {"maxTokens": 10, "tokenRatio": -1}}`, grpc: diffThrottle,
			wantErr: "retryThrottling.tokenRatio: must be greater than 0"},
		{name: "throttling without methodConfig", doc: `{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}`,
			wantThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 0.1}},

		// Load balancing and health checking: carried, checked for shape.
		{name: "loadBalancingPolicy", doc: `{"loadBalancingPolicy": "round_robin"}`},
		{name: "loadBalancingPolicy unknown falls back", doc: `{"loadBalancingPolicy": "no_such_policy"}`},
		{name: "loadBalancingPolicy number", doc: `{"loadBalancingPolicy": 1}`, wantErr: "serviceconfig: loadBalancingPolicy: must be a string, not a number"},
		{name: "loadBalancingConfig", doc: `{"loadBalancingConfig": [{"round_robin": {}}]}`},
		{name: "loadBalancingConfig first supported wins", doc: `{"loadBalancingConfig": [{"no_such_policy": {"x": 1}}, {"pick_first": {"shuffleAddressList": true}}, {}]}`},
		{name: "loadBalancingConfig after a supported policy is unchecked", doc: `{"loadBalancingConfig": [{"round_robin": 5}, {}]}`},
		{name: "loadBalancingConfig null", doc: `{"loadBalancingConfig": null}`},
		{name: "loadBalancingConfig empty", doc: `{"loadBalancingConfig": []}`, wantErr: "serviceconfig: loadBalancingConfig: must name at least one policy"},
		{name: "loadBalancingConfig object", doc: `{"loadBalancingConfig": {"round_robin": {}}}`, wantErr: "serviceconfig: loadBalancingConfig: must be an array of objects"},
		{name: "loadBalancingConfig empty entry", doc: `{"loadBalancingConfig": [{}]}`, wantErr: "serviceconfig: loadBalancingConfig[0]: must hold exactly one policy, not 0"},
		{name: "loadBalancingConfig null entry", doc: `{"loadBalancingConfig": [null, {"pick_first": {}}]}`, wantErr: "loadBalancingConfig[0]: must hold exactly one policy"},
		{name: "loadBalancingConfig two policies in an entry", doc: `{"loadBalancingConfig": [{"pick_first": {}, "round_robin": {}}]}`, wantErr: "loadBalancingConfig[0]: must hold exactly one policy, not 2"},
		{name: "loadBalancingConfig bad pick_first config", doc: `{"loadBalancingConfig": [{"pick_first": {"shuffleAddressList": "yes"}}]}`,
			wantErr: "serviceconfig: loadBalancingConfig[0].pick_first: must be true or false, not a string"},
		{name: "loadBalancingConfig only unknown policies", doc: `{"loadBalancingConfig": [{"no_such_policy": {}}]}`, grpc: diffRegistry},
		{name: "loadBalancingConfig policy names are case-sensitive", doc: `{"loadBalancingConfig": [{"ROUND_ROBIN": {}}]}`, grpc: diffRegistry},
		{name: "healthCheckConfig", doc: `{"healthCheckConfig": {"serviceName": "shop.Orders"}}`},
		{name: "healthCheckConfig bad serviceName", doc: `{"healthCheckConfig": {"serviceName": 1}}`, wantErr: "serviceconfig: healthCheckConfig.serviceName: must be a string, not a number"},
		{name: "healthCheckConfig array", doc: `{"healthCheckConfig": []}`, wantErr: "serviceconfig: healthCheckConfig: must be an object, not an array"},

		// Repeated keys behave as in encoding/json, hence as in grpc-go.
		{name: "repeated key: last wins", doc: orders(`"timeout": "1s", "timeout": "2s"`), want: svc(serviceconfig.MethodConfig{Timeout: 2 * time.Second})},
		{name: "repeated key: a bad first value still fails", doc: orders(`"timeout": "1", "timeout": "2s"`), wantErr: `methodConfig[0].timeout: "1" is not a duration`},
		{name: "repeated key: null after a value resets a pointer", doc: orders(`"timeout": "1s", "timeout": null`), want: svc(serviceconfig.MethodConfig{})},
		{name: "repeated key: null after a value keeps a number", doc: orders(`"retryPolicy": ` + retry(`"maxAttempts": 3`, `"MaxAttempts": null`)),
			want: svc(serviceconfig.MethodConfig{RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) { p.MaxAttempts = 3 })})},
		{name: "repeated key: objects merge", doc: orders(`"retryPolicy": ` + retry(`"maxAttempts": 1`) + `, "retryPolicy": {"maxAttempts": 3}`),
			want: svc(serviceconfig.MethodConfig{RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) { p.MaxAttempts = 3 })})},
		{name: "repeated key: array elements merge with Lenient", lenient: true, doc: `{"methodConfig": [{"name": [{"service": "shop.Orders"}], "timeout": "1s"}], "methodConfig": [{"waitForReady": true}]}`,
			want: svc(serviceconfig.MethodConfig{Timeout: time.Second, WaitForReady: ptr(true)})},

		// Extension blocks.
		{name: "extension durations in Go form are rejected",
			doc: orders(`"circuitBreaker": {"consecutiveFailures": 5, "failureRateThreshold": 0.5, "slowCallDuration": "2s", "slowCallRateThreshold": 0.8,
				"minimumCalls": 20, "window": "10s", "openDuration": "5s", "maxOpenDuration": "1m0s", "halfOpenProbes": 2, "failureStatusCodes": ["unavailable", 13]},
				"bulkhead": {"maxConcurrent": 64, "maxQueue": 128, "maxQueueWait": "0.1s"}`),
			wantErr: `methodConfig[0].circuitBreaker.maxOpenDuration: "1m0s" is not a duration`, grpc: diffExtension},
		{name: "all extension blocks", doc: extensions,
			want: svc(serviceconfig.MethodConfig{
				Timeout: 2 * time.Second,
				RetryPolicy: rp(func(p *serviceconfig.RetryPolicy) {
					p.PerAttemptRecvTimeout = 500 * time.Millisecond
					p.Jitter = serviceconfig.JitterFull
				}),
				CircuitBreaker: &serviceconfig.CircuitBreaker{
					ConsecutiveFailures: 5, FailureRateThreshold: 0.5, SlowCallDuration: 2 * time.Second, SlowCallRateThreshold: 0.8,
					MinimumCalls: 20, Window: 10 * time.Second, OpenDuration: 5 * time.Second, MaxOpenDuration: time.Minute,
					HalfOpenProbes: 2, FailureStatusCodes: []codes.Code{codes.Internal, codes.Unavailable},
				},
				Bulkhead: &serviceconfig.Bulkhead{MaxConcurrent: 64, MaxQueue: 128, MaxQueueWait: 100 * time.Millisecond},
			}),
			wantThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 0.1},
			wantBudget:     &serviceconfig.RetryBudget{Ratio: 0.2, MinRetriesPerSecond: 10, TTL: 10 * time.Second}},
		{name: "circuit breaker adaptive", doc: orders(`"circuitBreaker": {"mode": "adaptive", "k": 2, "window": "60s"}`),
			want: svc(serviceconfig.MethodConfig{CircuitBreaker: &serviceconfig.CircuitBreaker{Mode: "adaptive", K: 2, Window: time.Minute}})},
		{name: "circuit breaker adaptive defaults", doc: orders(`"circuitBreaker": {"mode": "adaptive"}`),
			want: svc(serviceconfig.MethodConfig{CircuitBreaker: &serviceconfig.CircuitBreaker{Mode: "adaptive"}})},
		{name: "circuit breaker unknown mode", doc: orders(`"circuitBreaker": {"mode": "Adaptive"}`), grpc: diffExtension,
			wantErr: `serviceconfig: methodConfig[0].circuitBreaker.mode: must be "adaptive" or absent`},
		{name: "circuit breaker mode not a string", doc: orders(`"circuitBreaker": {"mode": 1}`), grpc: diffExtension,
			wantErr: "methodConfig[0].circuitBreaker.mode: must be a string, not a number"},
		{name: "circuit breaker adaptive k under 1", doc: orders(`"circuitBreaker": {"mode": "adaptive", "k": 0.5}`), grpc: diffExtension,
			wantErr: "serviceconfig: methodConfig[0].circuitBreaker.k: must be between 1 and 100"},
		{name: "circuit breaker adaptive with a classic field", doc: orders(`"circuitBreaker": {"mode": "adaptive", "consecutiveFailures": 5}`), grpc: diffExtension,
			wantErr: `serviceconfig: methodConfig[0].circuitBreaker.consecutiveFailures: is not used in mode "adaptive"`},
		{name: "circuit breaker adaptive k over 100", doc: orders(`"circuitBreaker": {"mode": "adaptive", "k": 101}`), grpc: diffExtension,
			wantErr: "serviceconfig: methodConfig[0].circuitBreaker.k: must be between 1 and 100"},
		{name: "circuit breaker adaptive k a string", doc: orders(`"circuitBreaker": {"mode": "adaptive", "k": "2"}`), grpc: diffExtension,
			wantErr: "serviceconfig: methodConfig[0].circuitBreaker.k: must be a number, not a string"},
		{name: "circuit breaker adaptive with failureRateThreshold", doc: orders(`"circuitBreaker": {"mode": "adaptive", "failureRateThreshold": 0.5}`), grpc: diffExtension,
			wantErr: `serviceconfig: methodConfig[0].circuitBreaker.failureRateThreshold: is not used in mode "adaptive"`},
		{name: "circuit breaker adaptive with slowCallDuration", doc: orders(`"circuitBreaker": {"mode": "adaptive", "slowCallDuration": "1s"}`), grpc: diffExtension,
			wantErr: `serviceconfig: methodConfig[0].circuitBreaker.slowCallDuration: is not used in mode "adaptive"`},
		{name: "circuit breaker adaptive with slowCallRateThreshold", doc: orders(`"circuitBreaker": {"mode": "adaptive", "slowCallRateThreshold": 0.5}`), grpc: diffExtension,
			wantErr: `serviceconfig: methodConfig[0].circuitBreaker.slowCallRateThreshold: is not used in mode "adaptive"`},
		{name: "circuit breaker adaptive with minimumCalls", doc: orders(`"circuitBreaker": {"mode": "adaptive", "minimumCalls": 20}`), grpc: diffExtension,
			wantErr: `serviceconfig: methodConfig[0].circuitBreaker.minimumCalls: is not used in mode "adaptive"`},
		{name: "circuit breaker adaptive with openDuration", doc: orders(`"circuitBreaker": {"mode": "adaptive", "openDuration": "5s"}`), grpc: diffExtension,
			wantErr: `serviceconfig: methodConfig[0].circuitBreaker.openDuration: is not used in mode "adaptive"`},
		{name: "circuit breaker adaptive with maxOpenDuration", doc: orders(`"circuitBreaker": {"mode": "adaptive", "maxOpenDuration": "60s"}`), grpc: diffExtension,
			wantErr: `serviceconfig: methodConfig[0].circuitBreaker.maxOpenDuration: is not used in mode "adaptive"`},
		{name: "circuit breaker adaptive with halfOpenProbes", doc: orders(`"circuitBreaker": {"mode": "adaptive", "halfOpenProbes": 1}`), grpc: diffExtension,
			wantErr: `serviceconfig: methodConfig[0].circuitBreaker.halfOpenProbes: is not used in mode "adaptive"`},
		{name: "circuit breaker adaptive with failureStatusCodes", doc: orders(`"circuitBreaker": {"mode": "adaptive", "failureStatusCodes": ["UNAVAILABLE"]}`), grpc: diffExtension,
			wantErr: `serviceconfig: methodConfig[0].circuitBreaker.failureStatusCodes: is not used in mode "adaptive"`},
		{name: "circuit breaker k without adaptive", doc: orders(`"circuitBreaker": {"k": 2}`), grpc: diffExtension,
			wantErr: `serviceconfig: methodConfig[0].circuitBreaker.k: is used only in mode "adaptive"`},
		{name: "circuit breaker adaptive negative window", doc: orders(`"circuitBreaker": {"mode": "adaptive", "window": "-1s"}`), grpc: diffExtension,
			wantErr: "serviceconfig: methodConfig[0].circuitBreaker.window: must not be negative"},
		{name: "circuit breaker rate over 1", doc: orders(`"circuitBreaker": {"failureRateThreshold": 1.5}`), grpc: diffExtension,
			wantErr: "serviceconfig: methodConfig[0].circuitBreaker.failureRateThreshold: must be between 0 and 1"},
		{name: "circuit breaker slow rate without duration", doc: orders(`"circuitBreaker": {"slowCallRateThreshold": 0.5}`), grpc: diffExtension,
			wantErr: "methodConfig[0].circuitBreaker.slowCallDuration: must be set when slowCallRateThreshold is"},
		{name: "circuit breaker minimumCalls string", doc: orders(`"circuitBreaker": {"minimumCalls": "20"}`), grpc: diffExtension,
			wantErr: "methodConfig[0].circuitBreaker.minimumCalls: must be an integer, not a string"},
		{name: "circuit breaker window without unit", doc: orders(`"circuitBreaker": {"window": "10"}`), grpc: diffExtension,
			wantErr: `methodConfig[0].circuitBreaker.window: "10" is not a duration`},
		{name: "circuit breaker code unknown", doc: orders(`"circuitBreaker": {"failureStatusCodes": ["UNAVAILABLE", "BROKEN"]}`), grpc: diffExtension,
			wantErr: `methodConfig[0].circuitBreaker.failureStatusCodes[1]: unknown status code "BROKEN"`},
		{name: "circuit breaker not an object", doc: orders(`"circuitBreaker": true`), grpc: diffExtension,
			wantErr: "serviceconfig: methodConfig[0].circuitBreaker: must be an object, not true or false"},
		{name: "circuit breaker empty takes defaults", doc: orders(`"circuitBreaker": {}`),
			want: svc(serviceconfig.MethodConfig{CircuitBreaker: &serviceconfig.CircuitBreaker{}})},
		{name: "bulkhead empty", doc: orders(`"bulkhead": {}`), grpc: diffExtension,
			wantErr: "serviceconfig: methodConfig[0].bulkhead.maxConcurrent: must be greater than 0"},
		{name: "bulkhead negative queue", doc: orders(`"bulkhead": {"maxConcurrent": 1, "maxQueue": -1}`), grpc: diffExtension,
			wantErr: "methodConfig[0].bulkhead.maxQueue: must not be negative"},
		{name: "bulkhead fractional", doc: orders(`"bulkhead": {"maxConcurrent": 1.5}`), grpc: diffExtension,
			wantErr: "methodConfig[0].bulkhead.maxConcurrent: must be an integer, not 1.5"},
		{name: "retry budget", doc: `{"retryBudget": {"ratio": 0.1, "ttl": "30s"}}`,
			wantBudget: &serviceconfig.RetryBudget{Ratio: 0.1, TTL: 30 * time.Second}},
		{name: "retry budget ratio negative", doc: `{"retryBudget": {"ratio": -0.1}}`, grpc: diffExtension,
			wantErr: "serviceconfig: retryBudget.ratio: must be between 0 and 1000"},
		{name: "retry budget ttl without unit", doc: `{"retryBudget": {"ttl": "10"}}`, grpc: diffExtension,
			wantErr: `serviceconfig: retryBudget.ttl: "10" is not a duration`},
		{name: "retry budget null", doc: `{"retryBudget": null}`},
		{name: "extension blocks of a nameless entry are not validated", lenient: true,
			doc: `{"methodConfig": [{"circuitBreaker": {"failureRateThreshold": 7}, "bulkhead": {}}]}`},
		{name: "extension blocks of a nameless entry must decode", doc: `{"methodConfig": [{"bulkhead": {"maxConcurrent": "x"}}]}`, grpc: diffExtension,
			wantErr: "methodConfig[0].bulkhead.maxConcurrent: must be an integer, not a string"},
	}
}

// precedence has an exact, a service and a default entry.
const precedence = `{"methodConfig": [
	{"name": [{}], "waitForReady": true},
	{"name": [{"service": "shop.Orders"}], "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}},
	{"name": [{"service": "shop.Orders", "method": "Create"}], "timeout": "1s"}
]}`

// extensions is the document of DESIGN.md with every block filled in.
const extensions = `{
  "methodConfig": [{
    "name": [{"service": "shop.Orders"}],
    "timeout": "2s",
    "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"],
                    "perAttemptRecvTimeout": "0.5s", "jitter": "full"},
    "circuitBreaker": {"consecutiveFailures": 5, "failureRateThreshold": 0.5, "slowCallDuration": "2s",
                       "slowCallRateThreshold": 0.8, "minimumCalls": 20, "window": "10s", "openDuration": "5s",
                       "maxOpenDuration": "60s", "halfOpenProbes": 2, "failureStatusCodes": ["unavailable", 13]},
    "bulkhead": {"maxConcurrent": 64, "maxQueue": 128, "maxQueueWait": "0.1s"}
  }],
  "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},
  "retryBudget": {"ratio": 0.2, "minRetriesPerSecond": 10, "ttl": "10s"}
}`

func parseOpts(c parseCase) []serviceconfig.ParseOption {
	var opts []serviceconfig.ParseOption
	if c.cap != 0 {
		opts = append(opts, serviceconfig.WithMaxAttemptsCap(c.cap))
	}
	if c.lenient {
		opts = append(opts, serviceconfig.Lenient())
	}
	return opts
}

func TestParse(t *testing.T) {
	tests := parseCases()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := serviceconfig.Parse([]byte(tt.doc), parseOpts(tt)...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse(%q) = %v, want error containing %q", tt.doc, err, tt.wantErr)
				}
				var e *serviceconfig.Error
				if !errors.As(err, &e) || got != nil {
					t.Fatalf("Parse(%q) = %v, %T, want nil, *serviceconfig.Error", tt.doc, got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q) = %v, want no error", tt.doc, err)
			}
			meth := tt.meth
			if meth == "" {
				meth = testMethod
			}
			mc, ok := got.Lookup(meth)
			if tt.want == nil {
				if ok {
					t.Fatalf("Parse(%q).Lookup(%q) = %+v, want no entry", tt.doc, meth, mc)
				}
			} else {
				if !ok {
					t.Fatalf("Parse(%q).Lookup(%q) found no entry, want %s", tt.doc, meth, show(tt.want))
				}
				equal(t, mc, *tt.want, "Parse(%q).Lookup(%q)", tt.doc, meth)
			}
			equal(t, got.RetryThrottling, tt.wantThrottling, "Parse(%q).RetryThrottling", tt.doc)
			equal(t, got.RetryBudget, tt.wantBudget, "Parse(%q).RetryBudget", tt.doc)
			if err := got.Validate(); err != nil {
				t.Fatalf("Parse(%q).Validate() = %v, want nil", tt.doc, err)
			}
			checkRoundTrip(t, got, parseOpts(tt)...)
			checkStrict(t, []byte(tt.doc), got, tt.cap)
		})
	}
}

// checkStrict checks that Parse without Lenient refuses data, which Parse
// with Lenient read as lenient, exactly when lenient has a warning of kind
// WarningCoverage, with the first one's path and text; and that it
// otherwise gives the same config.
func checkStrict(t *testing.T, data []byte, lenient *serviceconfig.Config, cap int) {
	t.Helper()
	var opts []serviceconfig.ParseOption
	if cap != 0 {
		opts = append(opts, serviceconfig.WithMaxAttemptsCap(cap))
	}
	strict, err := serviceconfig.Parse(data, opts...)
	var first *serviceconfig.Warning
	for _, w := range lenient.Warnings() {
		if w.Kind == serviceconfig.WarningCoverage {
			first = w
			break
		}
	}
	switch {
	case first == nil && err != nil:
		t.Fatalf("Parse(%q) = %v, but with Lenient it has no coverage warning", data, err)
	case first == nil:
		equal(t, exported(strict), exported(lenient), "Parse(%q)", data)
		equal(t, strict.Warnings(), lenient.Warnings(), "Parse(%q).Warnings()", data)
	case err == nil || err.Error() != first.Error():
		t.Fatalf("Parse(%q) = %v, want the first coverage warning of Lenient as the error: %v", data, err, first)
	default:
		var e *serviceconfig.Error
		if !errors.As(err, &e) || e.Path != first.Path || strict != nil {
			t.Fatalf("Parse(%q) = %v, %#v, want nil and an *Error at %q", data, strict, err, first.Path)
		}
	}
}

// TestParseMatchesGRPC feeds every table document to grpc-go's own parser
// and checks that it gives the same verdict, or the opposite one where the
// case says why, and that both resolve the looked-up method alike.
func TestParseMatchesGRPC(t *testing.T) {
	parsers := map[int]*grpcParser{}
	tests := parseCases()
	for _, tt := range tests {
		p := parsers[tt.cap]
		if p == nil {
			p = newGRPCParser(t, tt.cap)
			parsers[tt.cap] = p
		}
		t.Run(tt.name, func(t *testing.T) {
			meth := tt.meth
			if meth == "" {
				meth = testMethod
			}
			grpcGot, grpcErr := p.parse(tt.doc, meth)
			ours := tt.wantErr == ""
			theirs := grpcErr == nil
			if tt.grpc != "" {
				if ours == theirs {
					t.Fatalf("grpc-go on %q: accepted %v (%v); the case says it differs from Parse (accepted %v): %s",
						tt.doc, theirs, grpcErr, ours, tt.grpc)
				}
				return
			}
			if ours != theirs {
				t.Fatalf("grpc-go on %q: accepted %v (%v), Parse accepted %v", tt.doc, theirs, grpcErr, ours)
			}
			if !ours {
				return
			}
			var want grpcPolicy
			if tt.want != nil {
				want = grpcPolicyOf(tt.want)
			}
			equal(t, grpcGot, want, "grpc-go's policy for %s in %q", meth, tt.doc)
		})
	}
}

// grpcPolicyOf returns the part of mc grpc-go applies, as grpc-go holds it.
func grpcPolicyOf(mc *serviceconfig.MethodConfig) grpcPolicy {
	got := grpcPolicy{found: true, waitForReady: mc.WaitForReady, timeout: mc.Timeout}
	if mc.MaxRequestMessageBytes != nil {
		got.maxReq = ptr(int(*mc.MaxRequestMessageBytes))
	}
	if mc.MaxResponseMessageBytes != nil {
		got.maxResp = ptr(int(*mc.MaxResponseMessageBytes))
	}
	if p := mc.RetryPolicy; p != nil {
		got.retry = &grpcRetry{
			maxAttempts:       p.MaxAttempts,
			initialBackoff:    p.InitialBackoff,
			maxBackoff:        p.MaxBackoff,
			backoffMultiplier: p.BackoffMultiplier,
			codes:             rescodes.Of(p.RetryableStatusCodes...),
		}
	}
	return got
}

// equal fails t unless got and want are deeply equal.
func equal(t *testing.T, got, want any, format string, args ...any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf(format+" = %s, want %s", append(args, show(got), show(want))...)
	}
}

// show formats v for a failure message, following pointers.
func show(v any) string {
	switch v := v.(type) {
	case *serviceconfig.Config:
		if v != nil {
			if b, err := json.Marshal(v); err == nil {
				return string(b)
			}
		}
	case grpcPolicy:
		s := fmt.Sprintf("%+v", v)
		if v.retry != nil {
			s += fmt.Sprintf(" retry=%+v", *v.retry)
		}
		return s
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
}

// checkRoundTrip checks that parse → marshal → parse gives c again, and
// that marshalling that gives the same document.
func checkRoundTrip(t *testing.T, c *serviceconfig.Config, opts ...serviceconfig.ParseOption) {
	t.Helper()
	out, err := json.Marshal(c)
	if err != nil {
		t.Fatalf("json.Marshal(%+v) = %v", c, err)
	}
	again, err := serviceconfig.Parse(out, opts...)
	if err != nil {
		t.Fatalf("Parse(%s) = %v, want the config it was marshalled from", out, err)
	}
	// The document written has no unknown keys, so no warnings of them;
	// an entry of a Lenient parse with an empty name list stays one.
	for _, w := range again.Warnings() {
		if w.Kind != serviceconfig.WarningCoverage || !strings.HasSuffix(w.Path, ".name") {
			t.Fatalf("Parse(%s).Warnings() holds %v, want none but empty name lists", out, w)
		}
	}
	equal(t, exported(again), exported(c), "Parse(%s)", out)
	if again.MaxAttemptsCap() != c.MaxAttemptsCap() {
		t.Fatalf("Parse(%s).MaxAttemptsCap() = %d, want %d", out, again.MaxAttemptsCap(), c.MaxAttemptsCap())
	}
	out2, err := json.Marshal(again)
	if err != nil || !bytes.Equal(out, out2) {
		t.Fatalf("json.Marshal(Parse(%s)) = %s, %v, want the same", out, out2, err)
	}
}

// exported returns the fields of c that a document carries, without what
// Parse notes beside them (the cap it applied, its warnings).
func exported(c *serviceconfig.Config) serviceconfig.Config {
	return serviceconfig.Config{
		MethodConfig: c.MethodConfig, RetryThrottling: c.RetryThrottling, RetryBudget: c.RetryBudget,
		LoadBalancingPolicy: c.LoadBalancingPolicy, LoadBalancingConfig: c.LoadBalancingConfig,
		HealthCheckConfig: c.HealthCheckConfig,
	}
}

// TestRetryBudgetZeroWrittenOut pins the kill switch (issue 32): both
// ratio and minRetriesPerSecond written out as 0 make a zero budget; one
// of them written out as 0 alone is an error naming its path, since a 0
// left out means the default; null is as left out. Marshal writes a zero
// budget back as both zeros.
func TestRetryBudgetZeroWrittenOut(t *testing.T) {
	tests := []struct {
		doc     string
		want    *serviceconfig.RetryBudget
		errPath string
	}{
		{`{"retryBudget": {"ratio": 0, "minRetriesPerSecond": 0}}`, &serviceconfig.RetryBudget{Zero: true}, ""},
		{`{"retryBudget": {"ratio": 0, "minRetriesPerSecond": 0, "ttl": "5s"}}`, &serviceconfig.RetryBudget{Zero: true, TTL: 5 * time.Second}, ""},
		{`{"retryBudget": {}}`, &serviceconfig.RetryBudget{}, ""},
		{`{"retryBudget": {"ratio": null, "minRetriesPerSecond": null}}`, &serviceconfig.RetryBudget{}, ""},
		{`{"retryBudget": {"ratio": 0.1}}`, &serviceconfig.RetryBudget{Ratio: 0.1}, ""},
		{`{"retryBudget": {"ratio": 0}}`, nil, "retryBudget.ratio"},
		{`{"retryBudget": {"ratio": 0, "minRetriesPerSecond": 5}}`, nil, "retryBudget.ratio"},
		{`{"retryBudget": {"minRetriesPerSecond": 0}}`, nil, "retryBudget.minRetriesPerSecond"},
	}
	for _, tt := range tests {
		cfg, err := serviceconfig.Parse([]byte(tt.doc))
		var se *serviceconfig.Error
		switch {
		case tt.errPath != "":
			if !errors.As(err, &se) || se.Path != tt.errPath {
				t.Errorf("Parse(%s) = %v, want an error at %s", tt.doc, err, tt.errPath)
			}
			continue
		case err != nil:
			t.Errorf("Parse(%s) = %v", tt.doc, err)
			continue
		}
		if *cfg.RetryBudget != *tt.want {
			t.Errorf("Parse(%s).RetryBudget = %+v, want %+v", tt.doc, *cfg.RetryBudget, *tt.want)
		}
		js, err := cfg.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		back, err := serviceconfig.Parse(js)
		if err != nil || *back.RetryBudget != *tt.want {
			t.Errorf("Parse(Marshal(Parse(%s))) = %+v, %v; JSON %s", tt.doc, back.RetryBudget, err, js)
		}
	}
	if err := (&serviceconfig.RetryBudget{Zero: true, Ratio: 0.2}).Validate(); err == nil {
		t.Error("RetryBudget{Zero, Ratio 0.2}.Validate() = nil, want an error")
	}
}
