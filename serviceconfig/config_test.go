package serviceconfig_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

func TestLookup(t *testing.T) {
	exact := serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: "shop.Orders", Method: "Create"}}, Timeout: 1}
	service := serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: "shop.Orders"}}, Timeout: 2}
	def := serviceconfig.MethodConfig{Name: []serviceconfig.Name{{}}, Timeout: 3}
	slashed := serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: "a", Method: "b/"}}, Timeout: 4}
	all := &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{def, exact, service}}
	tests := []struct {
		name   string
		config *serviceconfig.Config
		method string
		want   *serviceconfig.MethodConfig
	}{
		{name: "nil config", config: nil, method: "/shop.Orders/Create"},
		{name: "empty config", config: &serviceconfig.Config{}, method: "/shop.Orders/Create"},
		{name: "exact", config: all, method: "/shop.Orders/Create", want: &exact},
		{name: "service", config: all, method: "/shop.Orders/Cancel", want: &service},
		{name: "default", config: all, method: "/shop.Carts/Get", want: &def},
		{name: "without leading slash", config: all, method: "shop.Orders/Create", want: &exact},
		{name: "service only", config: all, method: "/shop.Orders", want: &service},
		{name: "prefix of a service is not the service", config: all, method: "/shop.Order/Create", want: &def},
		{name: "method is case-sensitive", config: all, method: "/shop.Orders/create", want: &service},
		{name: "no default", config: &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{exact}}, method: "/shop.Orders/Cancel"},
		{name: "first of two unvalidated duplicates", method: "/shop.Orders/Cancel",
			config: &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{service, {Name: service.Name, Timeout: 9}}}, want: &service},
		// grpc-go files {a, "b/"} under the key "/a/b/", which is the
		// service key of /a/b/c.
		{name: "method ending in a slash acts as a service key", config: &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{slashed}},
			method: "/a/b/c", want: &slashed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.config.Lookup(tt.method)
			if tt.want == nil {
				if ok {
					t.Fatalf("Lookup(%q) = %s, want no entry", tt.method, show(got))
				}
				return
			}
			if !ok {
				t.Fatalf("Lookup(%q) found no entry, want %s", tt.method, show(tt.want))
			}
			equal(t, got, *tt.want, "Lookup(%q)", tt.method)
		})
	}
}

func TestLookupDoesNotAllocate(t *testing.T) {
	c, err := serviceconfig.Parse([]byte(precedence))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"/shop.Orders/Create", "/shop.Orders/Cancel", "/shop.Carts/Get"} {
		if n := testing.AllocsPerRun(100, func() { c.Lookup(m) }); n != 0 {
			t.Errorf("Lookup(%q) allocates %v times, want 0", m, n)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	valid := &serviceconfig.RetryPolicy{} // zero fields mean the defaults
	tests := []struct {
		name    string
		config  serviceconfig.Config
		wantErr string
	}{
		{name: "zero", config: serviceconfig.Config{}},
		{name: "defaults", config: serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{Name: ordersName, RetryPolicy: valid}}}},
		{name: "method without service",
			config:  serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{Name: []serviceconfig.Name{{Method: "M"}}}}},
			wantErr: `serviceconfig: methodConfig[0].name[0]: method "M" set without service`},
		{name: "names colliding through a slash",
			config: serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{
				{Name: []serviceconfig.Name{{Service: "a/b", Method: "c"}}},
				{Name: []serviceconfig.Name{{Service: "a", Method: "b/c"}}},
			}},
			wantErr: `serviceconfig: methodConfig[0].name[0]: service "a/b" holds a slash`},
		{name: "names colliding by key",
			config: serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{
				{Name: []serviceconfig.Name{{Service: "a", Method: "b"}}},
				{Name: []serviceconfig.Name{{Service: "a", Method: "b"}}},
			}},
			wantErr: "serviceconfig: methodConfig[1].name[0]: duplicates the name at methodConfig[0].name[0]"},
		{name: "negative timeout", config: serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{Timeout: -1}}},
			wantErr: "serviceconfig: methodConfig[0].timeout: must not be negative"},
		{name: "retry and hedging",
			config:  serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{RetryPolicy: valid, HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2}}}},
			wantErr: "serviceconfig: methodConfig[0].hedgingPolicy: cannot be set together with retryPolicy"},
		{name: "bad jitter",
			config:  serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{}, {RetryPolicy: &serviceconfig.RetryPolicy{Jitter: "wild"}}}},
			wantErr: "serviceconfig: methodConfig[1].retryPolicy.jitter: must be one of"},
		{name: "hedging quantile out of range",
			config:  serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 1.5}}}},
			wantErr: "serviceconfig: methodConfig[0].hedgingPolicy.hedgingDelayQuantile: must be between 0 and 1, exclusive"},
		{name: "hedging floor without quantile",
			config:  serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayFloor: time.Millisecond}}}},
			wantErr: "serviceconfig: methodConfig[0].hedgingPolicy.hedgingDelayFloor: needs hedgingDelayQuantile"},
		{name: "hedging min samples without quantile",
			config:  serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayMinSamples: 5}}}},
			wantErr: "serviceconfig: methodConfig[0].hedgingPolicy.hedgingDelayMinSamples: needs hedgingDelayQuantile"},
		{name: "hedging min samples negative",
			config:  serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.9, HedgingDelayMinSamples: -1}}}},
			wantErr: "serviceconfig: methodConfig[0].hedgingPolicy.hedgingDelayMinSamples: must not be negative"},
		{name: "hedging adaptive", config: serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{HedgingPolicy: &serviceconfig.HedgingPolicy{
			MaxAttempts: 2, HedgingDelayQuantile: 0.95, HedgingDelayFloor: time.Millisecond, HedgingDelayMinSamples: 10}}}}},
		{name: "tokenRatio zero", config: serviceconfig.Config{RetryThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10}},
			wantErr: "serviceconfig: retryThrottling.tokenRatio: must be greater than 0"},
		{name: "budget", config: serviceconfig.Config{RetryBudget: &serviceconfig.RetryBudget{TTL: -time.Second}},
			wantErr: "serviceconfig: retryBudget.ttl: must not be negative"},
		{name: "loadBalancingConfig not JSON", config: serviceconfig.Config{LoadBalancingConfig: json.RawMessage(`[{`)},
			wantErr: "serviceconfig: loadBalancingConfig: is not valid JSON"},
		{name: "loadBalancingConfig empty entry", config: serviceconfig.Config{LoadBalancingConfig: json.RawMessage(`[{}]`)},
			wantErr: "serviceconfig: loadBalancingConfig[0]: must hold exactly one policy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.config.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestMarshalJSON(t *testing.T) {
	tests := []struct {
		name    string
		config  serviceconfig.Config
		want    string
		wantErr string
	}{
		{name: "zero", config: serviceconfig.Config{}, want: `{}`},
		{name: "defaults are written out",
			config: serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
				Name:        []serviceconfig.Name{{}},
				RetryPolicy: &serviceconfig.RetryPolicy{RetryableStatusCodes: []codes.Code{codes.Unavailable}},
			}}},
			want: `{"methodConfig":[{"name":[{}],"retryPolicy":{"maxAttempts":3,"initialBackoff":"0.1s","maxBackoff":"5s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}`},
		{name: "every block",
			config: serviceconfig.Config{
				MethodConfig: []serviceconfig.MethodConfig{{
					Name:          []serviceconfig.Name{{Service: "shop.Orders", Method: "Create"}, {}},
					WaitForReady:  ptr(true),
					Timeout:       1500 * time.Millisecond,
					HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 3, HedgingDelay: time.Millisecond, NonFatalStatusCodes: []codes.Code{codes.Internal}},
					CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 3, Window: time.Minute,
						FailureStatusCodes: []codes.Code{codes.Unknown, codes.DataLoss}},
					Bulkhead: &serviceconfig.Bulkhead{MaxConcurrent: 8, MaxQueueWait: 20 * time.Millisecond},
				}},
				RetryThrottling:     &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 0.1},
				RetryBudget:         &serviceconfig.RetryBudget{Ratio: 0.25},
				LoadBalancingPolicy: "round_robin",
				HealthCheckConfig:   &serviceconfig.HealthCheckConfig{ServiceName: "shop"},
			},
			want: `{"loadBalancingPolicy":"round_robin","methodConfig":[{"name":[{"service":"shop.Orders","method":"Create"},{}],` +
				`"waitForReady":true,"timeout":"1.5s","hedgingPolicy":{"maxAttempts":3,"hedgingDelay":"0.001s","nonFatalStatusCodes":["INTERNAL"]},` +
				`"circuitBreaker":{"consecutiveFailures":3,"window":"60s","failureStatusCodes":["UNKNOWN","DATA_LOSS"]},` +
				`"bulkhead":{"maxConcurrent":8,"maxQueueWait":"0.02s"}}],"retryThrottling":{"maxTokens":10,"tokenRatio":0.1},` +
				`"healthCheckConfig":{"serviceName":"shop"},"retryBudget":{"ratio":0.25}}`},
		{name: "adaptive hedging delay",
			config: serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
				Name: []serviceconfig.Name{{}},
				HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelayQuantile: 0.95,
					HedgingDelayFloor: time.Millisecond, HedgingDelayMinSamples: 50},
			}}},
			want: `{"methodConfig":[{"name":[{}],"hedgingPolicy":{"maxAttempts":2,"hedgingDelayQuantile":0.95,"hedgingDelayFloor":"0.001s","hedgingDelayMinSamples":50}}]}`},
		{name: "one attempt has no document form",
			config:  serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{RetryPolicy: &serviceconfig.RetryPolicy{MaxAttempts: 1, RetryableStatusCodes: []codes.Code{codes.OK}}}}},
			wantErr: "serviceconfig: methodConfig[0].retryPolicy.maxAttempts: 1 (no retry) has no document form"},
		{name: "default codes have no document form",
			config:  serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{RetryPolicy: &serviceconfig.RetryPolicy{}}}},
			wantErr: "serviceconfig: methodConfig[0].retryPolicy.retryableStatusCodes: empty (the default rules) has no document form"},
		{name: "invalid config", config: serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{Bulkhead: &serviceconfig.Bulkhead{}}}},
			wantErr: "serviceconfig: methodConfig[0].bulkhead.maxConcurrent: must be greater than 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := json.Marshal(tt.config)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("json.Marshal(%+v) = %s, %v, want error %q", tt.config, got, err, tt.wantErr)
				}
				var e *serviceconfig.Error
				if !errors.As(err, &e) {
					t.Fatalf("json.Marshal error %T does not wrap an *Error", err)
				}
				return
			}
			if err != nil || string(got) != tt.want {
				t.Fatalf("json.Marshal(%+v) = %s, %v, want %s", tt.config, got, err, tt.want)
			}
			if _, err := serviceconfig.Parse(got); err != nil {
				t.Fatalf("Parse(%s) = %v, want nil", got, err)
			}
		})
	}
}

func TestConfigUnmarshalJSON(t *testing.T) {
	var wrapper struct {
		Service serviceconfig.Config `json:"service"`
	}
	err := json.Unmarshal([]byte(`{"service": `+extensions+`}`), &wrapper)
	if err != nil {
		t.Fatalf("json.Unmarshal = %v", err)
	}
	want, err := serviceconfig.Parse([]byte(extensions))
	if err != nil {
		t.Fatal(err)
	}
	equal(t, &wrapper.Service, want, "json.Unmarshal(extensions)")

	err = json.Unmarshal([]byte(`{"service": {"methodConfig": 1}}`), &wrapper)
	if err == nil || !strings.Contains(err.Error(), "serviceconfig: methodConfig: must be an array, not a number") {
		t.Fatalf("json.Unmarshal of a bad config = %v, want the Parse error", err)
	}
}

func TestError(t *testing.T) {
	_, err := serviceconfig.Parse([]byte(ordersRetry(`"maxAttempts": 1`)))
	var e *serviceconfig.Error
	if !errors.As(err, &e) {
		t.Fatalf("Parse error %T is not an *Error", err)
	}
	if e.Path != "methodConfig[0].retryPolicy.maxAttempts" || e.Err.Error() != "must be greater than 1" {
		t.Fatalf("Parse error = {Path: %q, Err: %q}, want the path of maxAttempts and its rule", e.Path, e.Err)
	}
	if errors.Unwrap(err) != e.Err {
		t.Fatalf("errors.Unwrap(%v) = %v, want %v", err, errors.Unwrap(err), e.Err)
	}
}

func TestWithMaxAttemptsCapAppliesToHedging(t *testing.T) {
	c, err := serviceconfig.Parse([]byte(orders(`"hedgingPolicy": {"maxAttempts": 9}`)), serviceconfig.WithMaxAttemptsCap(7))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.MethodConfig[0].HedgingPolicy.MaxAttempts; got != 7 {
		t.Fatalf("Parse(hedging maxAttempts 9, WithMaxAttemptsCap(7)) MaxAttempts = %d, want 7", got)
	}
}

// TestNameValidate pins the names that can never match a call, and that
// the error quotes the part at fault.
func TestNameValidate(t *testing.T) {
	tests := []struct {
		n       serviceconfig.Name
		wantErr string
	}{
		{serviceconfig.Name{}, ""},
		{serviceconfig.Name{Service: "shop.Orders"}, ""},
		{serviceconfig.Name{Service: "shop.Orders", Method: "Pay"}, ""},
		{serviceconfig.Name{Service: "shop-v2.Orders_X", Method: "pay_now"}, ""},
		{serviceconfig.Name{Method: "Pay"}, `serviceconfig: method "Pay" set without service`},
		{serviceconfig.Name{Service: "/shop.Orders/Pay"}, `serviceconfig: service "/shop.Orders/Pay" holds a slash: for one method write {"service": "shop.Orders", "method": "Pay"}`},
		{serviceconfig.Name{Service: "shop.Orders/Pay"}, `serviceconfig: service "shop.Orders/Pay" holds a slash: for one method write {"service": "shop.Orders", "method": "Pay"}`},
		{serviceconfig.Name{Service: "/shop.Orders"}, `serviceconfig: service "/shop.Orders" holds a slash: write "shop.Orders"`},
		{serviceconfig.Name{Service: "shop.Orders/", Method: "Pay"}, `serviceconfig: service "shop.Orders/" holds a slash: write "shop.Orders"`},
		{serviceconfig.Name{Service: "a/b/c"}, `serviceconfig: service "a/b/c" holds a slash`},
		{serviceconfig.Name{Service: "shop.Orders", Method: "/Pay"}, `serviceconfig: method "/Pay" holds a slash: a method is its bare name, such as "Pay"`},
		{serviceconfig.Name{Service: "shop.Orders", Method: "Pay\n"}, `serviceconfig: method "Pay\n" holds a space or control character`},
		{serviceconfig.Name{Service: " shop.Orders"}, `serviceconfig: service " shop.Orders" holds a space or control character`},
		{serviceconfig.Name{Service: ".shop.Orders"}, `serviceconfig: service ".shop.Orders" has an empty part: write it as "shop.Orders", package and service`},
		{serviceconfig.Name{Service: "shop..Orders"}, `serviceconfig: service "shop..Orders" has an empty part: write it as "shop.Orders", package and service`},
	}
	for _, tt := range tests {
		err := tt.n.Validate()
		if got := fmt.Sprint(err); (err == nil) != (tt.wantErr == "") || err != nil && got != tt.wantErr {
			t.Errorf("%+v.Validate() = %v, want %q", tt.n, err, tt.wantErr)
		}
	}
}
