package interceptor

import (
	"fmt"
	"testing"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// A method a config named exactly stays named, and kept, after an update
// drops its entry (populate carries the named flag), so it never counts
// against maxMethods and is never let go: a control plane or resolver that
// pushes configs naming new methods (per tenant, per rollout) grows the
// table with every push, and each update copies all of it. Measured: 3000
// updates, each naming one new method, keep 3000 methods and take ~10s
// (O(n²)). A method no longer named by the config nor called by a
// generated stub should count against the bound like any other.
func TestMethodsNamedOnlyByOldConfigsAreBounded(t *testing.T) {
	t.Skip("known gap (r20): the named flag does not say whether a config or a generated stub named the method; " +
		"a fix splits it (stub-named vs config-named) on the hot path's fast check and lets populate drop " +
		"unnamed methods past the bound: see the r20 report")
	c := newTestClient(t)
	const updates = 2 * maxMethods
	for i := range updates {
		cfg := &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
			Name:           []serviceconfig.Name{{Service: "tenant.Service", Method: fmt.Sprintf("M%d", i)}},
			CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 3},
		}}}
		if err := c.UpdateServiceConfig(cfg); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	c.state.Load().methods.Range(func(_, _ any) bool { n++; return true })
	if n > maxMethods+1 {
		t.Errorf("after %d updates each naming one new method, %d methods kept, want at most %d", updates, n, maxMethods+1)
	}
}
