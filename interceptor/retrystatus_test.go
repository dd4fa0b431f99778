package interceptor

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestRetryStatusFollowsTheTokens: RetryStatus shows A6 throttling's tokens
// and cap, which a failed attempt lowers by one, and the budget's balance;
// nil for what is off.
func TestRetryStatusFollowsTheTokens(t *testing.T) {
	srv := &testserver.Server{}
	srv.SetScript(failFirst(1, codes.Unavailable))
	cfg := &serviceconfig.Config{RetryThrottling: &serviceconfig.RetryThrottling{MaxTokens: 10, TokenRatio: 0.1}}
	ec, c := newEcho(t, srv, WithServiceConfig(cfg), WithRetryPolicy(fastPolicy(3)))
	st := c.RetryStatus()
	if st.Throttling == nil || st.Throttling.Tokens != 10 || st.Throttling.MaxTokens != 10 || st.Budget == nil || st.Budget.Available <= 0 {
		t.Fatalf("RetryStatus() = %+v / %+v, want 10 of 10 tokens and a budget with retries available", st.Throttling, st.Budget)
	}
	if _, err := ec.Echo(context.Background(), &echov1.EchoRequest{Message: "x"}); err != nil {
		t.Fatal(err)
	}
	// One failure (−1), then one success (+0.1).
	if got := c.RetryStatus().Throttling.Tokens; got != 9.1 {
		t.Errorf("after one failure and one success, Tokens = %v, want 9.1", got)
	}
	off := newTestClient(t, WithRetryBudget(nil))
	if st := off.RetryStatus(); st.Budget != nil || st.Throttling != nil {
		t.Errorf("RetryStatus() without budget or throttling = %+v, want both nil", st)
	}
}
