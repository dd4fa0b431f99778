package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden with the current output")

// TestRun runs the command on the documents of testdata and compares its exit
// status, standard output and standard error with testdata/NAME.golden.
// Run with -update to rewrite the golden files, then review the diff.
func TestRun(t *testing.T) {
	shop, err := os.ReadFile("testdata/shop.json")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		args  []string
		stdin string
	}{
		// check
		{name: "check_valid", args: []string{"check", "testdata/shop.json"}},
		{name: "check_footguns", args: []string{"check", "testdata/footguns.json"}},
		{name: "check_footguns_strict", args: []string{"check", "-strict", "testdata/footguns.json"}},
		{name: "check_flags_after_file", args: []string{"check", "testdata/footguns.json", "-strict", "-max-attempts-cap", "10"}},
		{name: "check_jitters", args: []string{"check", "testdata/jitters.json"}},
		{name: "check_blocks", args: []string{"check", "testdata/blocks.json"}},
		{name: "check_ratelimit_client", args: []string{"check", "testdata/ratelimit_client.json"}},
		{name: "check_ratelimit_client_misspelt", args: []string{"check", "-"}, stdin: `{"methodConfig": [{"name": [{"service": "a.B"}], "rateLimit": {"rate": 10, "brust": 2}}]}`},
		{name: "check_invalid", args: []string{"check", "testdata/invalid.json"}},
		{name: "check_invalid_json", args: []string{"check", "testdata/syntax.json"}},
		{name: "check_stdin", args: []string{"check", "-"}, stdin: string(shop)},
		{name: "check_stdin_empty", args: []string{"check", "-"}, stdin: ""},
		{name: "check_stdin_invalid", args: []string{"check", "-"}, stdin: `{"retryThrottling": {"maxTokens": 0, "tokenRatio": 1}}`},
		{name: "check_no_entries", args: []string{"check", "-"}, stdin: `{"retryBudget": {"ttl": "5s"}}`},
		// a hedgingPolicy that may cover streams, which it leaves with one attempt
		{name: "check_hedging_covers_streams", args: []string{"check", "-"}, stdin: `{"methodConfig": [
			{"name": [{"service": "shop.Orders"}], "hedgingPolicy": {"maxAttempts": 2}},
			{"name": [{}], "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.1s"}},
			{"name": [{"service": "shop.Orders", "method": "Get"}], "hedgingPolicy": {"maxAttempts": 2}}]}`},
		{name: "check_zero_budget", args: []string{"check", "-"}, stdin: `{"retryBudget": {"ratio": 0, "minRetriesPerSecond": 0}}`},
		{name: "check_zero_ratio_alone", args: []string{"check", "-"}, stdin: `{"retryBudget": {"ratio": 0}}`},
		{name: "explain_zero_budget", args: []string{"explain", "-", "/shop.Orders/Pay"},
			stdin: `{"methodConfig": [{"name": [{"service": "shop.Orders"}], "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s",
				"maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}],
			 "retryBudget": {"ratio": 0, "minRetriesPerSecond": 0}}`},
		{name: "check_missing_file", args: []string{"check", "testdata/missing.json"}},
		{name: "check_strict_clean", args: []string{"check", "-strict", "testdata/nodefault.json"}},
		{name: "check_unknown_keys", args: []string{"check", "testdata/unknown.json"}},
		{name: "check_unknown_keys_strict", args: []string{"check", "-strict", "testdata/unknown.json"}},
		{name: "check_unknown_key_in_block", args: []string{"check", "-"},
			stdin: `{"methodConfig": [{"name": [{"service": "a.B"}], "circuitBreaker": {"failureRate": 0.5, "openDurationMs": 100}}]}`},
		{name: "check_duration_go_form", args: []string{"check", "-"},
			stdin: `{"methodConfig": [{"name": [{"service": "a.B"}], "timeout": "100ms"}]}`},
		{name: "explain_unknown_keys_strict", args: []string{"explain", "-strict", "testdata/unknown.json", "/shop.Orders/Pay"}},

		// a typo that changes which methods a policy covers fails the check,
		// with -lenient (grpc-go's reading) or without
		{name: "check_typo_services", args: []string{"check", "testdata/typo.json"}},
		{name: "check_typo_services_lenient", args: []string{"check", "-lenient", "testdata/typo.json"}},
		{name: "explain_typo_services_lenient", args: []string{"explain", "-lenient", "testdata/typo.json", "/grpc.health.v1.Health/Check"}},
		{name: "check_typo_method_config", args: []string{"check", "-"},
			stdin: `{"methodConfigs": [{"name": [{"service": "shop.Orders"}], "timeout": "1s"}]}`},
		{name: "check_typo_method_config_lenient", args: []string{"check", "-lenient", "-"},
			stdin: `{"methodConfigs": [{"name": [{"service": "shop.Orders"}], "timeout": "1s"}]}`},
		{name: "check_null_service", args: []string{"check", "-"},
			stdin: `{"methodConfig": [{"name": [{"service": null}], "timeout": "1s"}]}`},
		{name: "check_null_service_lenient", args: []string{"check", "-lenient", "-"},
			stdin: `{"methodConfig": [{"name": [{"service": null}], "timeout": "1s"}]}`},
		{name: "check_service_twice", args: []string{"check", "-"},
			stdin: `{"methodConfig": [{"name": [{"service": "shop.Orders", "service": ""}], "timeout": "1s"}]}`},
		{name: "check_nameless", args: []string{"check", "testdata/nameless.json"}},
		{name: "check_nameless_lenient", args: []string{"check", "-lenient", "testdata/nameless.json"}},
		{name: "check_lenient_clean", args: []string{"check", "-lenient", "testdata/shop.json"}},

		// a document of the other kind
		{name: "check_server_document", args: []string{"check", "testdata/server.json"}},
		{name: "explain_server_document", args: []string{"explain", "testdata/server_fair.json", "/shop.Orders/Get"}},
		{name: "server_client_document", args: []string{"server", "testdata/shop.json"}},
		{name: "server_client_document_stdin", args: []string{"server", "-"},
			stdin: `{"methodConfig": [{"name": [{"service": "a.B"}], "retryPolicy": {}}]}`},

		// the endpoint load-balancing policy
		{name: "check_endpoint", args: []string{"check", "testdata/endpoint.json"}},
		{name: "explain_endpoint", args: []string{"explain", "testdata/endpoint.json", "/shop.Orders/Get"}},
		{name: "check_endpoint_defaults", args: []string{"check", "-"},
			stdin: `{"loadBalancingConfig": [{"resilience_endpoint": {"maxEjectionPercent": 10}}]}`},
		{name: "check_endpoint_peak_ewma", args: []string{"check", "-"},
			stdin: `{"loadBalancingConfig": [{"resilience_endpoint": {"childPolicy": [{"peak_ewma": {"decayTime": "5s", "endpointConcurrency": 1}}], "consecutiveLocalOriginFailures": -1, "maxEjectionPercent": 0}}]}`},
		{name: "check_endpoint_local_origin", args: []string{"check", "-"},
			stdin: `{"loadBalancingConfig": [{"resilience_endpoint": {"childPolicy": [{"peak_ewma": {}}], "consecutiveLocalOriginFailures": 3, "failureStatusCodes": ["UNAVAILABLE", "UNKNOWN"]}}]}`},
		{name: "check_endpoint_invalid", args: []string{"check", "-"},
			stdin: `{"loadBalancingConfig": [{"resilience_endpoint": {"failurePercentageEjection": {"threshold": 0}}}]}`},

		// adaptive throttling and the server document
		{name: "check_breaker_adaptive", args: []string{"check", "testdata/breaker_adaptive.json"}},
		{name: "explain_breaker_adaptive", args: []string{"explain", "testdata/breaker_adaptive.json", "/shop.Orders/Pay"}},
		{name: "explain_breaker_adaptive_defaults", args: []string{"explain", "testdata/breaker_adaptive.json", "/shop.Carts/Get"}},
		{name: "server_check", args: []string{"server", "testdata/server.json"}},
		{name: "server_method", args: []string{"server", "testdata/server.json", "/shop.Orders/Report"}},
		{name: "server_service", args: []string{"server", "testdata/server.json", "/shop.Admin/Ban"}},
		{name: "server_default", args: []string{"server", "testdata/server.json", "shop.Orders/Get"}},
		{name: "server_none", args: []string{"server", "-"}, stdin: `{"methodConfig": [{"name": [{"service": "a.B"}], "concurrencyLimit": {}}]}`},
		{name: "server_fair_check", args: []string{"server", "testdata/server_fair.json"}},
		{name: "server_fair_method", args: []string{"server", "testdata/server_fair.json", "/shop.Orders/Get"}},
		{name: "server_invalid", args: []string{"server", "-"}, stdin: `{"concurrencyLimit": {"algorithm": "gradient2"}}`},
		{name: "usage_server_args", args: []string{"server"}},
		{name: "server_rates_check", args: []string{"server", "testdata/server_rates.json"}},
		{name: "server_rates_method", args: []string{"server", "testdata/server_rates.json", "/shop.Orders/Create"}},
		{name: "server_rates_service", args: []string{"server", "testdata/server_rates.json", "/shop.Orders/Get"}},
		{name: "server_rates_exempt", args: []string{"server", "testdata/server_rates.json", "/grpc.health.v1.Health/Check"}},
		{name: "server_rates_invalid", args: []string{"server", "-"},
			stdin: `{"rateLimits": [{"name": "a", "rate": 10, "burst": 0, "key": "tennant"}]}`},
		{name: "server_rates_misspelt", args: []string{"server", "-"},
			stdin: `{"rateLimits": [{"name": "a", "rate": 10, "brust": 5, "key": "peer"}]}`},

		// explain: resolution
		{name: "explain_exact", args: []string{"explain", "testdata/shop.json", "/shop.Orders/Pay"}},
		{name: "explain_service", args: []string{"explain", "testdata/shop.json", "/shop.Orders/Create"}},
		{name: "explain_default", args: []string{"explain", "testdata/shop.json", "/shop.Carts/Get"}},
		{name: "explain_no_entry", args: []string{"explain", "testdata/nodefault.json", "/shop.Carts/Get"}},
		{name: "explain_no_leading_slash", args: []string{"explain", "testdata/shop.json", "shop.Orders/Pay"}},

		// explain: every jitter
		{name: "explain_jitter_default", args: []string{"explain", "testdata/jitters.json", "/j.Default/M"}},
		{name: "explain_jitter_a6", args: []string{"explain", "testdata/jitters.json", "/j.A6/M"}},
		{name: "explain_jitter_full", args: []string{"explain", "testdata/jitters.json", "/j.Full/M"}},
		{name: "explain_jitter_equal", args: []string{"explain", "testdata/jitters.json", "/j.Equal/M"}},
		{name: "explain_jitter_decorrelated", args: []string{"explain", "testdata/jitters.json", "/j.Decorrelated/M"}},
		{name: "explain_jitter_none", args: []string{"explain", "testdata/jitters.json", "/j.None/M"}},

		// explain: the timeout warning and the attempt time
		{name: "explain_attempt_time", args: []string{"explain", "-attempt-time", "2.5s", "testdata/jitters.json", "/j.Default/M"}},
		{name: "explain_attempt_time_first_too_long", args: []string{"explain", "-attempt-time", "3s", "testdata/shop.json", "/shop.Orders/Pay"}},
		{name: "explain_attempt_time_overrides", args: []string{"explain", "testdata/shop.json", "/shop.Orders/Create", "-attempt-time", "100ms"}},
		{name: "explain_strict", args: []string{"explain", "-strict", "testdata/shop.json", "/shop.Orders/Create"}},

		// explain: foot-guns, hedging, blocks, long schedules
		{name: "explain_footguns", args: []string{"explain", "testdata/footguns.json", "/f.Svc/Clamped"}},
		{name: "explain_cap_raised", args: []string{"explain", "-max-attempts-cap", "20", "testdata/footguns.json", "/f.Svc/Clamped"}},
		{name: "explain_hedging", args: []string{"explain", "testdata/footguns.json", "/f.Svc/Hedged"}},
		{name: "explain_hedging_adaptive", args: []string{"explain", "testdata/adaptive.json", "/a.Svc/Warm"}},
		{name: "explain_hedging_adaptive_no_delay", args: []string{"explain", "testdata/adaptive.json", "/a.Svc/Cold"}},
		{name: "check_hedging_adaptive", args: []string{"check", "testdata/adaptive.json"}},
		{name: "explain_blocks_defaults", args: []string{"explain", "testdata/blocks.json", "/any.Svc/Call"}},
		{name: "explain_ratelimit_client", args: []string{"explain", "testdata/ratelimit_client.json", "/shop.Orders/Create"}},
		{name: "explain_ratelimit_client_pacing", args: []string{"explain", "testdata/ratelimit_client.json", "/shop.Billing/Pay"}},
		{name: "explain_blocks_exempt", args: []string{"explain", "testdata/blocks.json", "/grpc.health.v1.Health/Check"}},
		{name: "explain_long_schedule", args: []string{"explain", "-max-attempts-cap", "40", "testdata/long.json", "/l.Svc/M"}},
		{name: "explain_stdin", args: []string{"explain", "-", "/shop.Orders/Pay"}, stdin: string(shop)},
		{name: "explain_invalid", args: []string{"explain", "testdata/invalid.json", "/shop.Orders/Create"}},

		// usage
		{name: "usage_help", args: []string{"-h"}},
		{name: "usage_help_command", args: []string{"help"}},
		{name: "usage_check_help", args: []string{"check", "-h"}},
		{name: "usage_no_command", args: nil},
		{name: "usage_unknown_command", args: []string{"lint", "x.json"}},
		{name: "usage_check_no_file", args: []string{"check"}},
		{name: "usage_check_two_files", args: []string{"check", "a.json", "b.json"}},
		{name: "usage_explain_no_method", args: []string{"explain", "testdata/shop.json"}},
		{name: "usage_explain_bad_method", args: []string{"explain", "testdata/shop.json", "shop.Orders"}},
		{name: "usage_unknown_flag", args: []string{"check", "-verbose", "testdata/shop.json"}},
		{name: "usage_bad_attempt_time", args: []string{"explain", "-attempt-time", "5", "testdata/shop.json", "/a.B/C"}},
		{name: "usage_negative_attempt_time", args: []string{"explain", "-attempt-time=-1s", "testdata/shop.json", "/a.B/C"}},
		{name: "usage_double_dash", args: []string{"check", "--", "-strict"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tt.args, strings.NewReader(tt.stdin), &stdout, &stderr)
			got := transcript(tt.args, code, stdout.String(), stderr.String())
			golden := filepath.Join("testdata", tt.name+".golden")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run the test with -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("run(%q) does not match %s (run with -update to accept it):\n got:\n%s\nwant:\n%s", tt.args, golden, got, want)
			}
		})
	}
}

// transcript lays out one run for a golden file.
func transcript(args []string, code int, stdout, stderr string) string {
	var b strings.Builder
	b.WriteString("$ svcconfig")
	for _, a := range args {
		b.WriteString(" " + a)
	}
	b.WriteString("\n")
	b.WriteString("-- exit " + strconv.Itoa(code) + " --\n")
	b.WriteString("-- stdout --\n" + stdout)
	b.WriteString("-- stderr --\n" + stderr)
	return b.String()
}

// TestRunDeterministic runs explain twice on every jitter: the output is a
// function of the document and the flags alone.
func TestRunDeterministic(t *testing.T) {
	for _, m := range []string{"/j.Default/M", "/j.Full/M", "/j.Equal/M", "/j.Decorrelated/M", "/j.None/M"} {
		var first string
		for i := range 3 {
			var stdout, stderr bytes.Buffer
			run([]string{"explain", "testdata/jitters.json", m}, strings.NewReader(""), &stdout, &stderr)
			if i == 0 {
				first = stdout.String()
			} else if stdout.String() != first {
				t.Errorf("explain %s: run %d differs from run 0", m, i)
			}
		}
	}
}

// TestREADMEServiceConfigsPassStrict runs check -strict on every JSON
// service config of the repository's README (its ```json blocks): the
// documents a newcomer copies first must carry no warning.
func TestREADMEServiceConfigsPassStrict(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := jsonBlocks(string(readme))
	if len(blocks) == 0 {
		t.Fatal("README.md has no ```json block")
	}
	for i, doc := range blocks {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"check", "-strict", "-"}, strings.NewReader(doc), &stdout, &stderr); code != exitOK {
			t.Errorf("README.md json block %d: svcconfig check -strict exits %d:\n%s%s", i+1, code, stdout.String(), stderr.String())
		}
	}
}

// jsonBlocks returns the contents of the ```json blocks of markdown.
func jsonBlocks(markdown string) []string {
	var out []string
	for rest := markdown; ; {
		_, after, ok := strings.Cut(rest, "\n```json\n")
		if !ok {
			return out
		}
		block, tail, _ := strings.Cut(after, "\n```")
		out = append(out, block)
		rest = tail
	}
}
