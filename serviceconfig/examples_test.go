package serviceconfig_test

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Parse a document with a retry policy for one service and a breaker for
// one of its methods, then resolve two methods.
func Example() {
	doc := []byte(`{
	  "methodConfig": [
	    {"name": [{"service": "shop.Orders"}],
	     "timeout": "2s",
	     "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.05s", "maxBackoff": "1s",
	                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "resource_exhausted"],
	                     "jitter": "full"}},
	    {"name": [{"service": "shop.Orders", "method": "Pay"}],
	     "circuitBreaker": {"consecutiveFailures": 5, "openDuration": "5s"}}
	  ],
	  "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
	}`)
	c, err := serviceconfig.Parse(doc)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range []string{"/shop.Orders/Create", "/shop.Orders/Pay", "/shop.Carts/Get"} {
		mc, ok := c.Lookup(m)
		switch {
		case !ok:
			fmt.Printf("%s: no policy\n", m)
		case mc.RetryPolicy != nil:
			p := mc.RetryPolicy
			fmt.Printf("%s: timeout %v, %d attempts, backoff %v to %v ×%v, jitter %s, retry on %v\n",
				m, mc.Timeout, p.MaxAttempts, p.InitialBackoff, p.MaxBackoff, p.BackoffMultiplier, p.Jitter, p.RetryableStatusCodes)
		case mc.CircuitBreaker != nil:
			// No merging: the exact entry replaces the service's, retry policy and all.
			fmt.Printf("%s: no retry, breaker opens after %d failures for %v\n",
				m, mc.CircuitBreaker.ConsecutiveFailures, mc.CircuitBreaker.OpenDuration)
		}
	}
	fmt.Printf("throttling: %+v\n", *c.RetryThrottling)
	// Output:
	// /shop.Orders/Create: timeout 2s, 4 attempts, backoff 50ms to 1s ×2, jitter full, retry on [ResourceExhausted Unavailable]
	// /shop.Orders/Pay: no retry, breaker opens after 5 failures for 5s
	// /shop.Carts/Get: no policy
	// throttling: {MaxTokens:10 TokenRatio:0.1}
}

// A bad document gets an error naming the JSON path and the rule.
func ExampleParse_error() {
	_, err := serviceconfig.Parse([]byte(`{"methodConfig": [
	  {"name": [{"service": "shop.Orders"}]},
	  {"name": [{"service": "shop.Carts"}], "retryPolicy": {"maxAttempts": 1}}
	]}`))
	fmt.Println(err)

	var e *serviceconfig.Error
	if errors.As(err, &e) {
		fmt.Println(e.Path)
	}
	// Output:
	// serviceconfig: methodConfig[1].retryPolicy.maxAttempts: must be greater than 1
	// methodConfig[1].retryPolicy.maxAttempts
}

// A client that raised grpc's cap with grpc.WithMaxCallAttempts(8) reads the
// document the same way with WithMaxAttemptsCap(8).
func ExampleWithMaxAttemptsCap() {
	doc := []byte(`{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 10,
	  "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": [14]}}]}`)
	for _, opts := range [][]serviceconfig.ParseOption{nil, {serviceconfig.WithMaxAttemptsCap(8)}} {
		c, err := serviceconfig.Parse(doc, opts...)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(c.MethodConfig[0].RetryPolicy.MaxAttempts)
	}
	// Output:
	// 5
	// 8
}

// MarshalJSON writes a Config built in Go as a document; zero policy fields
// are written as the defaults they mean.
func ExampleConfig_MarshalJSON() {
	c := serviceconfig.Config{
		MethodConfig: []serviceconfig.MethodConfig{{
			Name:     []serviceconfig.Name{{Service: "shop.Orders"}},
			Timeout:  1500_000_000, // 1.5s
			Bulkhead: &serviceconfig.Bulkhead{MaxConcurrent: 16},
		}},
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(b))
	// Output:
	// {
	//   "methodConfig": [
	//     {
	//       "name": [
	//         {
	//           "service": "shop.Orders"
	//         }
	//       ],
	//       "timeout": "1.5s",
	//       "bulkhead": {
	//         "maxConcurrent": 16
	//       }
	//     }
	//   ]
	// }
}

func ExampleParseServer() {
	cfg, err := serviceconfig.ParseServer([]byte(`{
	  "concurrencyLimit": {"maxLimit": 500},
	  "methodConfig": [{"name": [{"service": "shop.Orders", "method": "Report"}],
	                    "concurrencyLimit": {"algorithm": "aimd", "maxLimit": 8}}]
	}`))
	if err != nil {
		panic(err)
	}
	for _, m := range []string{"/shop.Orders/Report", "/shop.Orders/Get"} {
		l, name, _ := cfg.Lookup(m)
		fmt.Printf("%s: %q algorithm %q maxLimit %d\n", m, name, l.Algorithm, l.MaxLimit)
	}
	_, err = serviceconfig.ParseServer([]byte(`{"concurrencyLimit": {"algorithm": "gradient2"}}`))
	fmt.Println(err)
	// Output:
	// /shop.Orders/Report: "/shop.Orders/Report" algorithm "aimd" maxLimit 8
	// /shop.Orders/Get: "" algorithm "" maxLimit 500
	// serviceconfig: concurrencyLimit.algorithm: must be "vegas" or "aimd"
}

func ExampleServerConfig_LookupRateLimits() {
	cfg, err := serviceconfig.ParseServer([]byte(`{
	  "rateLimits": [{"name": "server", "rate": 5000, "burst": 500, "key": "shared"}],
	  "methodConfig": [{"name": [{"service": "shop.Orders", "method": "Create"}],
	                    "rateLimits": [{"name": "create-per-tenant", "rate": 100, "per": "60s", "burst": 20,
	                                    "key": "tenant", "distributed": true}]}],
	  "tenantFairness": {"metadataKey": "x-tenant"}
	}`))
	if err != nil {
		panic(err)
	}
	for _, m := range []string{"/shop.Orders/Create", "/shop.Orders/Get"} {
		for _, a := range cfg.LookupRateLimits(m) {
			fmt.Printf("%s: %s (scope %q): a token every %v, burst %d, by %s\n", m, a.Limit.Name, a.Scope, a.Limit.Interval(), a.Limit.Burst, a.Limit.Key)
		}
	}
	_, err = serviceconfig.ParseServer([]byte(`{"rateLimits": [{"name": "x", "rate": 10, "burst": 5, "key": "tennant"}]}`))
	fmt.Println(err)
	// Output:
	// /shop.Orders/Create: create-per-tenant (scope "/shop.Orders/Create"): a token every 600ms, burst 20, by tenant
	// /shop.Orders/Create: server (scope ""): a token every 200µs, burst 500, by shared
	// /shop.Orders/Get: server (scope ""): a token every 200µs, burst 500, by shared
	// serviceconfig: rateLimits[0].key: "tennant" is not a key: want one of "tenant", "peer", "idempotencyScope" or "shared" (did you mean "tenant"?)
}

func ExampleCircuitBreaker_adaptive() {
	cfg, err := serviceconfig.Parse([]byte(`{"methodConfig": [{"name": [{"service": "shop.Orders"}],
	  "circuitBreaker": {"mode": "adaptive", "k": 2, "window": "60s"}}]}`))
	if err != nil {
		panic(err)
	}
	mc, _ := cfg.Lookup("/shop.Orders/Pay")
	fmt.Println(mc.CircuitBreaker.Mode, mc.CircuitBreaker.K, mc.CircuitBreaker.Window)
	// Output:
	// adaptive 2 1m0s
}

// "timeout": "0s" parses to the shortest timeout, 1ns, which fails every
// call at once with DEADLINE_EXCEEDED, as in grpc-go; zero in a
// MethodConfig means no timeout, which a negative timeout gives, as grpc-go
// ignores it.
func ExampleParse_zeroTimeout() {
	for _, timeout := range []string{`"0s"`, `"-1s"`, `"0.5s"`} {
		c, err := serviceconfig.Parse([]byte(`{"methodConfig": [{"name": [{"service": "shop.Orders"}], "timeout": ` + timeout + `}]}`))
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: Timeout %v\n", timeout, c.MethodConfig[0].Timeout)
	}
	// Output:
	// "0s": Timeout 1ns
	// "-1s": Timeout 0s
	// "0.5s": Timeout 500ms
}

// A typo in a name is refused: grpc-go would ignore "services" and read the
// name as {}, the default entry, so that the 10-attempt policy applied to
// every method. Lenient reads the document as grpc-go does, and its
// Warnings tell the typo that changed which methods the policy covers.
func ExampleLenient() {
	doc := []byte(`{"methodConfig": [{"name": [{"services": "shop.Orders"}],
	  "retryPolicy": {"maxAttempts": 10, "initialBackoff": "0.1s", "maxBackoff": "1s",
	                  "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`)
	_, err := serviceconfig.Parse(doc)
	fmt.Println(err)

	c, err := serviceconfig.Parse(doc, serviceconfig.Lenient())
	if err != nil {
		fmt.Println(err)
		return
	}
	mc, _ := c.Lookup("/grpc.health.v1.Health/Check")
	fmt.Printf("health checks get %d attempts\n", mc.RetryPolicy.MaxAttempts)
	for _, w := range c.Warnings() {
		fmt.Printf("%s: %s\n", w.Kind, w.Path)
	}
	// Output:
	// serviceconfig: methodConfig[0].name[0].services: unknown key: did you mean "service"? grpc-go ignores it, which leaves the name {}, the default entry: its policies would apply to every method
	// health checks get 5 attempts
	// coverage: methodConfig[0].name[0].services
}
