package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/faultinject"
)

func TestFlagErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"faults": [{"abort": {"grpcStatus": "NOPE"}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	badConfig := filepath.Join(dir, "config.json")
	if err := os.WriteFile(badConfig, []byte(`{"methodConfig": 5}`), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-scope", "everyone"}, `-scope "everyone": want none, mtls, metadata:<key> or shared`},
		{[]string{"-scope", "metadata:grpc-timeout"}, `-scope "metadata:grpc-timeout": want metadata:<key> with a text header that is not grpc-*`},
		{[]string{"-store", "disk"}, `-store "disk": want memory or redis`},
		{[]string{"-fail-rate", "30"}, `invalid value "30" for flag -fail-rate: want a fraction from 0 to 1, such as 0.3, or a percentage such as 30%`},
		{[]string{"-fail-rate", "1.5"}, `invalid value "1.5" for flag -fail-rate: want a fraction from 0 to 1, such as 0.3, or a percentage such as 30%`},
		{[]string{"-fail-rate", "130%"}, `invalid value "130%" for flag -fail-rate: want a fraction from 0 to 1, such as 0.3, or a percentage such as 30%`},
		{[]string{"-fail-rate", "0.1", "-fail-code", "OK"}, `-fail-code: OK is not a failure`},
		{[]string{"-outage", "2s"}, `-outage "2s": want DURATION/EVERY, such as 2s/10s`},
		{[]string{"-outage", "20s/10s"}, `-outage "20s/10s": the outage must be positive and no longer than its period`},
		{[]string{"-faults", bad}, `-faults ` + bad + `: faultinject: faults[0].abort.grpcStatus: unknown status code "NOPE"`},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-forward-config", bad}, `-forward-config needs -forward`},
		{[]string{"-forward", "127.0.0.1:1,,127.0.0.1:2"}, `-forward "127.0.0.1:1,,127.0.0.1:2": an empty address`},
		{[]string{"-forward", "127.0.0.1:1", "-forward-config", badConfig}, `-forward-config: serviceconfig: methodConfig: must be an array, not a number`},
	}
	for _, tt := range tests {
		err := run(context.Background(), append([]string{"-addr", "127.0.0.1:0", "-metrics-addr", ""}, tt.args...), io.Discard, io.Discard)
		if err == nil || err.Error() != tt.want {
			t.Errorf("run(%q) = %v, want %s", tt.args, err, tt.want)
		}
	}
}

// TestFailRateTakesAFractionOrAPercentage pins -fail-rate's two forms.
// Before, -fail-rate 30 failed with a JSON path the user never wrote
// (faults[0].abort.percentage) and 30% was not a number.
func TestFailRateTakesAFractionOrAPercentage(t *testing.T) {
	for _, tt := range []struct {
		arg  string
		want float64
	}{{"0.3", 0.3}, {"30%", 0.3}, {"0", 0}, {"1", 1}, {"100%", 1}, {"2.5%", 0.025}} {
		c, err := parseFlags([]string{"-fail-rate", tt.arg}, io.Discard)
		if err != nil || c.failRate != tt.want {
			t.Errorf("-fail-rate %s = %v, %v, want %v", tt.arg, c, err, tt.want)
		}
	}
}

func TestShorthandFaults(t *testing.T) {
	c, err := parseFlags([]string{"-fail-rate", "0.2", "-fail-code", "internal", "-latency", "5ms", "-outage", "1s/1m", "-seed", "9"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := c.faultConfig()
	if err != nil {
		t.Fatal(err)
	}
	f := cfg.Faults[0]
	if cfg.Seed != 9 || len(cfg.Faults) != 1 || strings.Join(f.Methods, ",") != "resilience.echo.v1.EchoService" ||
		*f.Abort != (faultinject.Abort{Code: codes.Internal, Rate: 0.2}) || f.Delay.Fixed != 5*time.Millisecond ||
		*f.Outage != (faultinject.Outage{Every: time.Minute, Duration: time.Second, Code: codes.Internal}) {
		t.Errorf("faultConfig = %+v, fault %+v", cfg, f)
	}
}

func TestScopes(t *testing.T) {
	scope := metadataScope("x-tenant")
	got, err := scope(metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-tenant", "acme")))
	if err != nil || got != "md:acme" {
		t.Errorf("metadataScope = %q, %v; want md:acme", got, err)
	}
	if _, err := scope(context.Background()); status.Code(err) != codes.Unauthenticated {
		t.Errorf("metadataScope without the header = %v, want UNAUTHENTICATED", err)
	}
	if _, err := noScope(context.Background()); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "-scope") {
		t.Errorf("noScope = %v, want FAILED_PRECONDITION naming -scope", err)
	}
}
