package faultinject

import (
	"slices"
	"testing"

	"github.com/grpc-resilience/resilience/interceptor"
)

// TestExemptServicesMatchTheInterceptors pins faultinject's exempt list to
// the interceptors' own: a service added to one and not the other would be
// shed by one and broken on purpose by the other.
func TestExemptServicesMatchTheInterceptors(t *testing.T) {
	if !slices.Equal(exemptServices, interceptor.DefaultExemptServices) {
		t.Fatalf("faultinject exempts %q, interceptor.DefaultExemptServices is %q", exemptServices, interceptor.DefaultExemptServices)
	}
}
