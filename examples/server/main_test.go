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
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-scope", "everyone"}, `-scope "everyone": want none, mtls, metadata:<key> or shared`},
		{[]string{"-scope", "metadata:grpc-timeout"}, `-scope "metadata:grpc-timeout": want metadata:<key> with a text header that is not grpc-*`},
		{[]string{"-store", "disk"}, `-store "disk": want memory or redis`},
		{[]string{"-fail-rate", "1.5"}, `fault flags: faultinject: faults[0].abort.percentage: must be a fraction from 0 to 1, got 1.5`},
		{[]string{"-fail-rate", "0.1", "-fail-code", "OK"}, `-fail-code: OK is not a failure`},
		{[]string{"-outage", "2s"}, `-outage "2s": want DURATION/EVERY, such as 2s/10s`},
		{[]string{"-outage", "20s/10s"}, `fault flags: faultinject: faults[0].outage.duration: must be in (0, every=10s], got 20s`},
		{[]string{"-faults", bad}, `-faults ` + bad + `: faultinject: faults[0].abort.grpcStatus: unknown status code "NOPE"`},
		{[]string{"extra"}, `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		err := run(context.Background(), append([]string{"-addr", "127.0.0.1:0", "-metrics-addr", ""}, tt.args...), io.Discard, io.Discard)
		if err == nil || err.Error() != tt.want {
			t.Errorf("run(%q) = %v, want %s", tt.args, err, tt.want)
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
