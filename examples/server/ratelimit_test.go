package main

import (
	"context"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestLimitsFileServesAPerTenantRateLimit: the server document shipped
// beside the example (limits.json) limits each tenant (x-tenant) to its
// burst of 10 at once: the calls beyond are refused with RESOURCE_EXHAUSTED,
// a RetryInfo and a QuotaFailure naming the limit, and another tenant is
// served.
func TestLimitsFileServesAPerTenantRateLimit(t *testing.T) {
	addr, _ := startServer(t, "-server-config", "limits.json")
	client := echov1.NewEchoServiceClient(dial(t, addr, insecure.NewCredentials()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acme := metadata.AppendToOutgoingContext(ctx, "x-tenant", "acme")
	var refused error
	for i := 0; i < 100 && refused == nil; i++ { // 20/s: 100 calls take far less than the 5 s they would need
		_, refused = client.Echo(acme, &echov1.EchoRequest{Message: "m"})
	}
	st := status.Convert(refused)
	var wait time.Duration
	var subject string
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			wait = d.GetRetryDelay().AsDuration()
		case *errdetails.QuotaFailure:
			subject = d.GetViolations()[0].GetSubject()
		}
	}
	if st.Code() != codes.ResourceExhausted || wait <= 0 || wait > 50*time.Millisecond || subject != "ratelimit:echo-per-tenant" {
		t.Fatalf("a tenant over its limit: %v (RetryInfo %v, QuotaFailure %q), want RESOURCE_EXHAUSTED, a wait of at most one interval (50ms), the limit named", refused, wait, subject)
	}
	other := metadata.AppendToOutgoingContext(ctx, "x-tenant", "globex")
	if _, err := client.Echo(other, &echov1.EchoRequest{Message: "m"}); err != nil {
		t.Errorf("another tenant: %v, want served", err)
	}
}
