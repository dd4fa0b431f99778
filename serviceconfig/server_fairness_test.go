package serviceconfig_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

func TestParseServerTenantFairness(t *testing.T) {
	c, err := serviceconfig.ParseServer([]byte(`{"concurrencyLimit": {},
		"tenantFairness": {"metadataKey": "x-tenant-id", "maxTenants": 64, "idleTimeout": "2.5s"}}`))
	if err != nil {
		t.Fatalf("ParseServer: %v", err)
	}
	want := serviceconfig.TenantFairness{MetadataKey: "x-tenant-id", MaxTenants: 64, IdleTimeout: 2500 * time.Millisecond}
	if c.TenantFairness == nil || *c.TenantFairness != want {
		t.Errorf("TenantFairness = %+v, want %+v", c.TenantFairness, want)
	}
	c, err = serviceconfig.ParseServer([]byte(`{"concurrencyLimit": {}}`))
	if err != nil || c.TenantFairness != nil {
		t.Errorf("without the block: %+v, %v; want nil", c.TenantFairness, err)
	}
}

func TestParseServerTenantFairnessErrors(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"no key", `{"tenantFairness": {}}`, "serviceconfig: tenantFairness.metadataKey: is required"},
		{"upper case key", `{"tenantFairness": {"metadataKey": "X-Tenant"}}`, "serviceconfig: tenantFairness.metadataKey: must be a lower-case metadata key"},
		{"binary key", `{"tenantFairness": {"metadataKey": "x-tenant-bin"}}`, "serviceconfig: tenantFairness.metadataKey: must be a lower-case metadata key"},
		{"reserved key", `{"tenantFairness": {"metadataKey": "grpc-timeout"}}`, "serviceconfig: tenantFairness.metadataKey: must be a lower-case metadata key"},
		{"negative bound", `{"tenantFairness": {"metadataKey": "t", "maxTenants": -1}}`, "serviceconfig: tenantFairness.maxTenants: must not be negative"},
		{"bad idle", `{"tenantFairness": {"metadataKey": "t", "idleTimeout": "5"}}`, `serviceconfig: tenantFairness.idleTimeout: "5" is not a duration`},
		{"negative idle", `{"tenantFairness": {"metadataKey": "t", "idleTimeout": "-1s"}}`, "serviceconfig: tenantFairness.idleTimeout: must not be negative"},
		{"type", `{"tenantFairness": {"metadataKey": 7}}`, "serviceconfig: tenantFairness.metadataKey: must be a string"},
		{"unknown key", `{"tenantFairness": {"metadataKy": "x"}}`, `serviceconfig: tenantFairness.metadataKy: unknown key: did you mean "metadataKey"?`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := serviceconfig.ParseServer([]byte(tt.doc))
			var se *serviceconfig.Error
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.As(err, &se) {
				t.Errorf("ParseServer(%s) = %v, want an *Error containing %q", tt.doc, err, tt.want)
			}
		})
	}
}
