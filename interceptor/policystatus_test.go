package interceptor

import (
	"testing"

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
