package serviceconfig_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestUnknownKeyInOurBlocksIsAnError pins the strictness of our schema: a
// misspelt key in our blocks, or one of our keys misspelt or misplaced in
// gRFC A6's objects, is an error naming its JSON path and the closest
// known key. Before, each of these documents was accepted and the field
// silently kept its default (the breaker of the first one opened for 5s).
func TestUnknownKeyInOurBlocksIsAnError(t *testing.T) {
	entry := func(rest string) string {
		return `{"methodConfig": [{"name": [{"service": "shop.Orders"}], ` + rest + `}]}`
	}
	retry := `"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]`
	tests := []struct {
		name, doc, wantErr string
	}{
		{"the issue's breaker", entry(`"circuitBreaker": {"failureRate": 0.5, "openDurationMs": 100}`),
			`serviceconfig: methodConfig[0].circuitBreaker.failureRate: unknown key: did you mean "failureRateThreshold"?`},
		{"breaker key with a unit", entry(`"circuitBreaker": {"openDurationMs": 100}`),
			`methodConfig[0].circuitBreaker.openDurationMs: unknown key: did you mean "openDuration"?`},
		{"breaker key like none", entry(`"circuitBreaker": {"colour": "red"}`),
			`methodConfig[0].circuitBreaker.colour: unknown key; the keys here are mode, k, consecutiveFailures,`},
		{"bulkhead", entry(`"bulkhead": {"maxConcurrency": 4}`),
			`methodConfig[0].bulkhead.maxConcurrency: unknown key: did you mean "maxConcurrent"?`},
		{"retry budget", `{"retryBudget": {"ratio": 0.1, "minRetriesPerSec": 5}}`,
			`retryBudget.minRetriesPerSec: unknown key: did you mean "minRetriesPerSecond"?`},
		{"retry budget misspelt at the top level", `{"retryBudgets": {"ratio": 0.1}}`,
			`retryBudgets: unknown key: did you mean "retryBudget"? (one of grpc-resilience's own keys)`},
		{"retry budget in an entry", entry(`"retryBudget": {"ratio": 0.1}`),
			`methodConfig[0].retryBudget: unknown key here: it belongs in the top level`},
		{"block misspelt in an entry", entry(`"circuit_breaker": {}`),
			`methodConfig[0].circuit_breaker: unknown key: did you mean "circuitBreaker"?`},
		{"retry extension field misspelt", entry(`"retryPolicy": {` + retry + `, "perAttemptRecvTimout": "1s"}`),
			`methodConfig[0].retryPolicy.perAttemptRecvTimout: unknown key: did you mean "perAttemptRecvTimeout"?`},
		{"retry extension field misplaced", entry(`"jitter": "full"`),
			`methodConfig[0].jitter: unknown key here: it belongs in retryPolicy`},
		{"hedging extension field misspelt", entry(`"hedgingPolicy": {"maxAttempts": 2, "hedgingDelayQuantil": 0.9}`),
			`methodConfig[0].hedgingPolicy.hedgingDelayQuantil: unknown key: did you mean "hedgingDelayQuantile"?`},
		{"skipped entry too", `{"methodConfig": [{"bulkhead": {"maxQueu": 1}}]}`,
			`methodConfig[0].bulkhead.maxQueu: unknown key: did you mean "maxQueue"?`},
		{"the first in document order", entry(`"bulkhead": {"maxQueu": 1, "maxQueueWayt": "1s"}`),
			`methodConfig[0].bulkhead.maxQueu:`},
		{"required A6 field misspelt", entry(`"retryPolicy": {"maxAttemps": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}`),
			`methodConfig[0].retryPolicy.maxAttempts: is required and must be greater than 1 (the document has "maxAttemps": a misspelling?)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := serviceconfig.Parse([]byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Parse(%s) = %v, want error containing %q", tt.doc, err, tt.wantErr)
			}
			var e *serviceconfig.Error
			if !errors.As(err, &e) || c != nil {
				t.Fatalf("Parse(%s) = %v, %T, want nil, *serviceconfig.Error", tt.doc, c, err)
			}
		})
	}
}

// TestUnknownKeyInA6ObjectsIsAWarning pins grpc-go's leniency in A6's own
// objects: the document is accepted (with Lenient, which the name's typo
// needs), and Warnings names each unknown key, in document order, with the
// key it most likely misspells and its kind, then the entries that select
// no method.
func TestUnknownKeyInA6ObjectsIsAWarning(t *testing.T) {
	doc := `{"methodConfig": [{"name": [{"service": "shop.Orders", "methods": "Pay"}], "timout": "1s",
		"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
		                "retryableStatusCodes": ["UNAVAILABLE"], "extra": {}}}, {"name": [], "timeout": "1s"}],
		"loadBalancingPolicyy": "round_robin", "retryBudget": {"TTL": "5s", "Ratio": 0.1}}`
	c, err := serviceconfig.Parse([]byte(doc), serviceconfig.Lenient())
	if err != nil {
		t.Fatalf("Parse() = %v, want a document grpc-go accepts to be accepted", err)
	}
	var got []string
	for _, w := range c.Warnings() {
		if !errors.Is(w, w.Err) {
			t.Fatalf("warning %v does not unwrap to its Err", w)
		}
		got = append(got, w.Kind.String()+": "+w.Error())
	}
	want := []string{
		`coverage: serviceconfig: methodConfig[0].name[0].methods: unknown key: did you mean "method"? grpc-go ignores it, which leaves the name {"service": "shop.Orders"}: its policies would apply to every method of shop.Orders`,
		`ignored key: serviceconfig: methodConfig[0].timout: unknown key, ignored (grpc-go ignores it too): did you mean "timeout"?`,
		`ignored key: serviceconfig: methodConfig[0].retryPolicy.extra: unknown key, ignored (grpc-go ignores it too)`,
		`ignored key: serviceconfig: loadBalancingPolicyy: unknown key, ignored (grpc-go ignores it too): did you mean "loadBalancingPolicy"?`,
		`coverage: serviceconfig: methodConfig[1].name: is empty, so the entry applies to no method: list its methods, or write [{}] for every method`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Warnings() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if c.RetryBudget == nil || c.RetryBudget.Ratio != 0.1 {
		t.Errorf("RetryBudget = %+v: keys in any case are known keys", c.RetryBudget)
	}
	clean, err := serviceconfig.Parse([]byte(`{"methodConfig": [{"name": [{"service": "a.B"}], "timeout": "1s"}]}`))
	if err != nil || clean.Warnings() != nil {
		t.Errorf("Parse(clean document) = %v, warnings %v, want none", err, clean.Warnings())
	}
}

// TestServerConfigUnknownKeys pins that the server document is ours
// throughout: an unknown key anywhere is an error.
func TestServerConfigUnknownKeys(t *testing.T) {
	tests := []struct{ doc, wantErr string }{
		{`{"concurrencyLimit": {"maxLimt": 8}}`, `serviceconfig: concurrencyLimit.maxLimt: unknown key: did you mean "maxLimit"?`},
		{`{"maxQueue": 3}`, `serviceconfig: maxQueue: unknown key here: it belongs in concurrencyLimit`},
		{`{"methodConfig": [{"name": [{"service": "a.B", "methd": "C"}], "concurrencyLimit": {}}]}`,
			`serviceconfig: methodConfig[0].name[0].methd: unknown key: did you mean "method"?`},
		{`{"methodConfig": [{"name": [{"service": "a.B"}], "concurrencyLimit": {}, "zz": 1}]}`,
			`serviceconfig: methodConfig[0].zz: unknown key; the keys here are name, concurrencyLimit, rateLimits`},
	}
	for _, tt := range tests {
		_, err := serviceconfig.ParseServer([]byte(tt.doc))
		if err == nil || err.Error() != tt.wantErr {
			t.Errorf("ParseServer(%s) = %v, want %q", tt.doc, err, tt.wantErr)
		}
	}
}

// TestNegativeTimeoutIsAWarning pins a value grpc-go ignores: a negative
// timeout parses, as in grpc-go, to no timeout, and Warnings says so,
// where before it was dropped in silence ("timeout": "-1s" read as no
// timeout, and svcconfig check printed "ok").
func TestNegativeTimeoutIsAWarning(t *testing.T) {
	c, err := serviceconfig.Parse([]byte(`{"methodConfig": [{"name": [{"service": "shop.Orders"}], "timeout": "-1s"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.MethodConfig[0].Timeout; got != 0 {
		t.Errorf("Timeout = %v, want 0 (none), as grpc-go reads it", got)
	}
	const want = "ignored key: serviceconfig: methodConfig[0].timeout: is negative, which grpc-go ignores, and so does Parse: the methods get no timeout"
	if ws := c.Warnings(); len(ws) != 1 || ws[0].Kind.String()+": "+ws[0].Error() != want {
		t.Errorf("Warnings() = %v, want [%s]", ws, want)
	}
}

// TestHedgingDelayMinSamplesZeroIsAWarning: "hedgingDelayMinSamples": 0
// written out reads as "no warm-up" but, as the Go field's 0, means the
// default; it parses as the default, and Warnings says so (it went
// unnoticed before).
func TestHedgingDelayMinSamplesZeroIsAWarning(t *testing.T) {
	c, err := serviceconfig.Parse([]byte(`{"methodConfig": [{"name": [{"service": "shop.Orders"}], ` +
		`"hedgingPolicy": {"maxAttempts": 2, "hedgingDelayQuantile": 0.9, "hedgingDelayMinSamples": 0}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.MethodConfig[0].HedgingPolicy.HedgingDelayMinSamples; got != 0 {
		t.Errorf("HedgingDelayMinSamples = %d, want 0 (the default)", got)
	}
	const want = "ignored key: serviceconfig: methodConfig[0].hedgingPolicy.hedgingDelayMinSamples: is 0, which means the default, 100 observed attempts, not none: leave it out for the default, or give at least 1"
	if ws := c.Warnings(); len(ws) != 1 || ws[0].Kind.String()+": "+ws[0].Error() != want {
		t.Errorf("Warnings() = %v, want [%s]", ws, want)
	}
}
