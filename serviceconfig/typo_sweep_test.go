package serviceconfig_test

import (
	"strings"
	"testing"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// fullClientDoc writes every key of the client's document once, each block
// filled in, so that a sweep over its keys reaches every one.
const fullClientDoc = `{
  "loadBalancingPolicy": "round_robin",
  "methodConfig": [
    {"name": [{"service": "shop.Orders", "method": "Pay"}],
     "waitForReady": true,
     "timeout": "5s",
     "maxRequestMessageBytes": 1024,
     "maxResponseMessageBytes": 1024,
     "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                     "retryableStatusCodes": ["UNAVAILABLE"], "perAttemptRecvTimeout": "1s", "jitter": "full"},
     "circuitBreaker": {"failureRateThreshold": 0.5,
                        "slowCallDuration": "1s", "slowCallRateThreshold": 0.5, "minimumCalls": 10,
                        "window": "10s", "openDuration": "5s", "maxOpenDuration": "60s", "halfOpenProbes": 1,
                        "failureStatusCodes": ["UNAVAILABLE"]},
     "bulkhead": {"maxConcurrent": 8, "maxQueue": 16, "maxQueueWait": "1s"},
     "rateLimit": {"rate": 10, "per": "1s", "burst": 5, "maxWait": "0.1s"}},
    {"name": [{"service": "shop.Search"}],
     "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.1s", "nonFatalStatusCodes": ["UNAVAILABLE"],
                       "hedgingDelayQuantile": 0.9, "hedgingDelayFloor": "0.005s", "hedgingDelayMinSamples": 20}},
    {"name": [{"service": "shop.Adaptive"}],
     "circuitBreaker": {"mode": "adaptive", "k": 2}},
    {"name": [{"service": "shop.Consecutive"}],
     "circuitBreaker": {"consecutiveFailures": 5}}
  ],
  "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},
  "healthCheckConfig": {"serviceName": "shop"},
  "retryBudget": {"ratio": 0.1, "minRetriesPerSecond": 5, "ttl": "10s"}
}`

// TestEveryMisspeltKeyIsReported sweeps the keys of a document that writes
// every key of the client's schema, misspelling each in turn three ways:
// none may be accepted in silence. Parse refuses the document with an
// error that names the misspelt key, or (a key of gRFC A6's own objects,
// which grpc-go ignores) accepts it with a warning that does.
func TestEveryMisspeltKeyIsReported(t *testing.T) {
	if _, err := serviceconfig.Parse([]byte(fullClientDoc)); err != nil {
		t.Fatalf("Parse(full document) = %v, want it valid", err)
	}
	keys := documentKeys(fullClientDoc)
	if len(keys) < 60 {
		t.Fatalf("the full document has %d keys, want every key of the schema", len(keys))
	}
	misspell := []struct {
		how string
		f   func(string) string
	}{
		{"last letter dropped", func(k string) string { return k[:len(k)-1] }},
		{"an s added", func(k string) string { return k + "s" }},
		{"snake_case", func(k string) string { return k[:1] + "_" + k[1:] }},
	}
	for _, at := range keys {
		key := fullClientDoc[at.start:at.end]
		for _, m := range misspell {
			typo := m.f(key)
			doc := fullClientDoc[:at.start] + typo + fullClientDoc[at.end:]
			for _, mode := range []struct {
				name string
				opts []serviceconfig.ParseOption
			}{{"strict", nil}, {"Lenient", []serviceconfig.ParseOption{serviceconfig.Lenient()}}} {
				c, err := serviceconfig.Parse([]byte(doc), mode.opts...)
				if err != nil {
					if !strings.Contains(err.Error(), `"`+typo+`"`) && !strings.Contains(err.Error(), "."+typo+":") &&
						!strings.HasPrefix(err.Error(), "serviceconfig: "+typo+":") {
						t.Errorf("%q, %s (%q): Parse, %s = %v, want an error naming %q", key, m.how, typo, mode.name, err, typo)
					}
					continue
				}
				named := false
				for _, w := range c.Warnings() {
					named = named || strings.Contains(w.Error(), typo)
				}
				if !named {
					t.Errorf("%q, %s (%q): Parse, %s, accepted it with warnings %v, want one naming %q",
						key, m.how, typo, mode.name, c.Warnings(), typo)
				}
			}
		}
	}
}

// keySpan is where a key's text (without its quotes) sits in a document.
type keySpan struct{ start, end int }

// documentKeys returns the spans of the object keys of doc: the strings
// followed by a colon. doc's strings hold no escaped quotes.
func documentKeys(doc string) []keySpan {
	var spans []keySpan
	for i := 0; i < len(doc); i++ {
		if doc[i] != '"' {
			continue
		}
		j := i + 1 + strings.IndexByte(doc[i+1:], '"')
		if rest := strings.TrimLeft(doc[j+1:], " \n\t"); strings.HasPrefix(rest, ":") {
			spans = append(spans, keySpan{i + 1, j})
		}
		i = j
	}
	return spans
}

// TestMisspeltServiceBesideAMethodIsHinted pins the hint on a name whose
// service is misspelt beside its method: the name is refused for a method
// without a service, and the error names the key that most likely meant
// it, as a missing required field's does. It used to say only "method
// "Pay" set without service", leaving the reader to find "services".
func TestMisspeltServiceBesideAMethodIsHinted(t *testing.T) {
	doc := `{"methodConfig": [{"name": [{"services": "shop.Orders", "method": "Pay"}], "timeout": "1s"}]}`
	want := `serviceconfig: methodConfig[0].name[0]: method "Pay" set without service (the document has "services": a misspelling?)`
	for _, opts := range [][]serviceconfig.ParseOption{nil, {serviceconfig.Lenient()}} {
		if _, err := serviceconfig.Parse([]byte(doc), opts...); err == nil || err.Error() != want {
			t.Errorf("Parse(%s, %d options) = %v, want %q", doc, len(opts), err, want)
		}
	}
}

// fullServerDoc writes every key of the server's document once.
const fullServerDoc = `{
  "concurrencyLimit": {"algorithm": "aimd", "initialLimit": 4, "minLimit": 2, "maxLimit": 8, "baseWindow": "10s",
                       "maxQueue": 4, "maxQueueWait": "0.02s"},
  "tenantFairness": {"metadataKey": "x-tenant-id", "maxTenants": 100, "idleTimeout": "10s"},
  "rateLimits": [{"name": "server", "rate": 5000, "burst": 500, "key": "shared"}],
  "methodConfig": [
    {"name": [{"service": "shop.Orders", "method": "Create"}],
     "concurrencyLimit": {"maxLimit": 50},
     "rateLimits": [{"name": "orders-per-scope", "rate": 50, "per": "60s", "burst": 10, "key": "idempotencyScope",
                     "maxKeys": 1000, "distributed": true, "fallback": "closed"}]}
  ]
}`

// TestEveryMisspeltServerKeyIsAnError sweeps the server document as
// TestEveryMisspeltKeyIsReported sweeps the client's: the document is ours
// throughout, so each misspelt key is an error that names it.
func TestEveryMisspeltServerKeyIsAnError(t *testing.T) {
	if _, err := serviceconfig.ParseServer([]byte(fullServerDoc)); err != nil {
		t.Fatalf("ParseServer(full document) = %v, want it valid", err)
	}
	keys := documentKeys(fullServerDoc)
	if len(keys) < 30 {
		t.Fatalf("the full document has %d keys, want every key of the schema", len(keys))
	}
	for _, at := range keys {
		key := fullServerDoc[at.start:at.end]
		for _, typo := range []string{key[:len(key)-1], key + "s", key[:1] + "_" + key[1:]} {
			doc := fullServerDoc[:at.start] + typo + fullServerDoc[at.end:]
			_, err := serviceconfig.ParseServer([]byte(doc))
			if err == nil || !strings.Contains(err.Error(), `"`+typo+`"`) && !strings.Contains(err.Error(), "."+typo+":") &&
				!strings.HasPrefix(err.Error(), "serviceconfig: "+typo+":") {
				t.Errorf("%q misspelt %q: ParseServer = %v, want an error naming %q", key, typo, err, typo)
			}
		}
	}
}
