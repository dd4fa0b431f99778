package interceptor

import (
	"reflect"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestPolicyNamesWhereItCameFrom: Policy gives the entry in force for a
// method as grpc-go picks it (the method's, else its service's, else the
// default) and names where it came from as the Client's errors do, after
// an update too; what it returns is a copy.
func TestPolicyNamesWhereItCameFrom(t *testing.T) {
	const svc = "resilience.echo.v1.EchoService"
	doc, err := serviceconfig.Parse([]byte(`{"methodConfig": [
		{"name": [{"service": "` + svc + `"}], "timeout": "2s"},
		{"name": [{}], "timeout": "9s"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(WithServiceConfig(doc), WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{Service: svc, Method: "Lookup"}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5},
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tests := []struct {
		method, source string
	}{
		{"/" + svc + "/Lookup", "WithMethodConfig: entry 0"},
		{svc + "/Lookup", "WithMethodConfig: entry 0"},
		{"/" + svc + "/Echo", "WithServiceConfig: methodConfig[0]"},
		{"/other.Service/Call", "WithServiceConfig: methodConfig[1]"},
	}
	for _, tt := range tests {
		if got := c.Policy(tt.method); got.Source != tt.source || got.FullMethod != tt.method {
			t.Errorf("Policy(%q) = %+v, want source %q", tt.method, got, tt.source)
		}
	}
	p := c.Policy("/" + svc + "/Lookup")
	if p.Config.CircuitBreaker == nil || p.Config.CircuitBreaker.ConsecutiveFailures != 5 {
		t.Fatalf("Policy(Lookup).Config = %+v, want the breaker of 5 failures", p.Config)
	}
	p.Config.CircuitBreaker.ConsecutiveFailures = 1
	p.Config.Name[0].Method = "Echo"
	if again := c.Policy("/" + svc + "/Lookup"); again.Config.CircuitBreaker.ConsecutiveFailures != 5 || again.Config.Name[0].Method != "Lookup" {
		t.Errorf("after changing what Policy returned, Policy = %+v; want the client's config unchanged", again.Config)
	}
	upd, err := serviceconfig.Parse([]byte(`{"methodConfig": [{"name": [{"service": "` + svc + `", "method": "Echo"}], "timeout": "1s"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.UpdateServiceConfig(upd); err != nil {
		t.Fatal(err)
	}
	if got := c.Policy("/" + svc + "/Echo"); got.Source != "UpdateServiceConfig: methodConfig[0]" || got.Config.Timeout.Seconds() != 1 {
		t.Errorf("after UpdateServiceConfig, Policy(Echo) = %+v, want its entry 0", got)
	}
	if got := c.Policy("/" + svc + "/Lookup"); got.Source != "" || got.Config.CircuitBreaker != nil {
		t.Errorf("after UpdateServiceConfig, Policy(Lookup) = %+v, want no entry", got)
	}
}

// TestPolicyIsADeepCopy: every pointer and slice of what Policy returns is
// its own, so changing any of it changes nothing of the Client's config,
// for every block a MethodConfig can hold. The entries below set each
// reference field of MethodConfig; a block added to it without a clone in
// Policy fails the coverage check, then the aliasing check.
func TestPolicyIsADeepCopy(t *testing.T) {
	const svc = "resilience.echo.v1.EchoService"
	yes, n := true, int64(1<<20)
	retried := serviceconfig.MethodConfig{
		Name:                    []serviceconfig.Name{{Service: svc, Method: "Echo"}},
		WaitForReady:            &yes,
		MaxRequestMessageBytes:  &n,
		MaxResponseMessageBytes: &n,
		RetryPolicy:             fastPolicy(3),
		CircuitBreaker:          &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5, FailureStatusCodes: []codes.Code{codes.Unavailable}},
		Bulkhead:                &serviceconfig.Bulkhead{MaxConcurrent: 4},
		RateLimit:               &serviceconfig.ClientRateLimit{Rate: 10, Burst: 1},
	}
	retried.RetryPolicy.RetryableStatusCodes = []codes.Code{codes.Unavailable}
	hedged := serviceconfig.MethodConfig{
		Name:          []serviceconfig.Name{{Service: svc, Method: "Lookup"}},
		HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: time.Millisecond, NonFatalStatusCodes: []codes.Code{codes.Unavailable}},
	}
	c := newTestClient(t, WithMethodConfig(retried, hedged))
	covered := map[string]bool{}
	for _, method := range []string{"/" + svc + "/Echo", "/" + svc + "/Lookup"} {
		a, b := c.Policy(method), c.Policy(method)
		if a.Source == "" {
			t.Fatalf("Policy(%q) = %+v, want an entry", method, a)
		}
		for _, alias := range sharedRefs("Config", reflect.ValueOf(a.Config), reflect.ValueOf(b.Config), covered) {
			t.Errorf("Policy(%q): %s is the same memory in two results: changing it would change the Client's config", method, alias)
		}
	}
	for _, path := range refPaths("Config", reflect.TypeFor[serviceconfig.MethodConfig]()) {
		if !covered[path] {
			t.Errorf("no entry of this test sets %s: set it, so that Policy's copy of it is checked", path)
		}
	}
}

// sharedRefs walks a and b, two values of one type, and returns the paths
// of the pointers and non-empty slices that are the same memory in both,
// marking in covered the paths where a holds one.
func sharedRefs(path string, a, b reflect.Value, covered map[string]bool) []string {
	var out []string
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() {
			return nil
		}
		covered[path] = true
		if a.Pointer() == b.Pointer() {
			out = append(out, path)
		}
		out = append(out, sharedRefs(path, a.Elem(), b.Elem(), covered)...)
	case reflect.Slice:
		if a.Len() == 0 {
			return nil
		}
		covered[path] = true
		if a.Pointer() == b.Pointer() {
			out = append(out, path)
		}
		for i := range a.Len() {
			out = append(out, sharedRefs(path+"[]", a.Index(i), b.Index(i), covered)...)
		}
	case reflect.Struct:
		for i := range a.NumField() {
			out = append(out, sharedRefs(path+"."+a.Type().Field(i).Name, a.Field(i), b.Field(i), covered)...)
		}
	}
	return out
}

// refPaths returns the paths of the pointers and slices a value of type t
// holds, as sharedRefs names them.
func refPaths(path string, t reflect.Type) []string {
	switch t.Kind() {
	case reflect.Pointer:
		return append([]string{path}, refPaths(path, t.Elem())...)
	case reflect.Slice:
		return append([]string{path}, refPaths(path+"[]", t.Elem())...)
	case reflect.Struct:
		var out []string
		for i := range t.NumField() {
			out = append(out, refPaths(path+"."+t.Field(i).Name, t.Field(i).Type)...)
		}
		return out
	}
	return nil
}
