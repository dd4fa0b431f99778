package serviceconfig_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// FuzzParse checks that Parse never panics, with or without Lenient, that
// its errors are *Error, that what it accepts validates and survives parse
// → marshal → parse, and that without Lenient it refuses exactly the
// documents whose Lenient parse has a warning of kind WarningCoverage.
func FuzzParse(f *testing.F) {
	for _, c := range parseCases() {
		f.Add([]byte(c.doc))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, opts := range [][]serviceconfig.ParseOption{nil, {serviceconfig.Lenient()}} {
			c, err := serviceconfig.Parse(data, opts...)
			if err != nil {
				var e *serviceconfig.Error
				if !errors.As(err, &e) || c != nil || !strings.HasPrefix(err.Error(), "serviceconfig: ") {
					t.Fatalf("Parse(%q) = %v, %T %v, want nil, *serviceconfig.Error", data, c, err, err)
				}
				continue
			}
			if err := c.Validate(); err != nil {
				t.Fatalf("Parse(%q).Validate() = %v, want nil", data, err)
			}
			for _, m := range []string{testMethod, "/a/b", "/", ""} {
				c.Lookup(m)
			}
			for _, w := range c.Warnings() {
				if w.Kind != serviceconfig.WarningIgnoredKey && (w.Kind != serviceconfig.WarningCoverage || opts == nil) {
					t.Fatalf("Parse(%q, %d options) warns %v of kind %v", data, len(opts), w, w.Kind)
				}
			}
			checkRoundTrip(t, c, opts...)
			if opts != nil {
				checkStrict(t, data, c, 0)
			}
		}
	})
}

// FuzzParseMatchesGRPC checks that Parse with Lenient and grpc-go's own
// parser give the same verdict, but for the differences the package
// documents: our extension blocks and the gRFC A6 corrections
// (hedgingPolicy, retryThrottling, case-insensitive status codes), and
// load-balancing policies grpc-go looks up in its registry. Without
// Lenient, Parse also refuses what changes which methods a policy covers:
// FuzzParse checks that it refuses exactly that.
func FuzzParseMatchesGRPC(f *testing.F) {
	for _, c := range parseCases() {
		f.Add([]byte(c.doc))
	}
	// Keys as encoding/json matches them: any case (Unicode folding
	// included: U+017F folds to s, U+212A to k), repeated, null, escaped,
	// holding dots; and unknown keys in arrays and in our blocks.
	for _, doc := range []string{
		`{"METHODCONFIG": [{"NAME": [{"SERVICE": "a.B"}], "BULKHEAD": {"MAXCONCURRENT": 1}, "CircuitBreaker": {"K": 2, "mode": "adaptive"}}]}`,
		`{"methodConfig": [{"name": [{"ſervice": "a.B"}], "circuitBreaker": {"\u212a": 2, "mode": "adaptive"}, "bulkhead": {"maxQueue": 1, "maxqueue": 2}}]}`,
		`{"methodConfig": [{"name": [{"service": "a.B", "method": null}], "bulkhead": null, "retryPolicy": null}], "retryBudget": {"ttl": null}}`,
		`{"methodConfig": [{"name": [{"service": "a.B"}, {"service": "a.C", "methd": "x"}], "bulkhead": {"max.Queue": 1}}]}`,
		`{"methodConfig": [{"name": [{"service": "a.B"}], "rateLimit": {"rate": 1e-300, "burst": 9007199254740993, "maxWait": "-0s", "Rate": 0}}]}`,
		`{"methodConfig": [{"name": [{"service": "a.B"}]}, {"name": [{"service": "a.C"}], "bulkhead": {"maxQueu": 1}}], "methodConfig": [{"name": [{"service": "a.D"}]}]}`,
		`{"methodConfig": [{"name": [{"service": "a.B"}], "retryPolicy": {"maxAttempts": 2, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": [14], "JITTER": "full", "perattemptrecvtimeout": "1s"}}]}`,
		`{"healthCheckConfig": {"serviceName": "x", "ttl": 1}, "retryThrottling": {"maxTokens": 1, "tokenRatio": 0.1, "Ratio": 1}}`,
	} {
		f.Add([]byte(doc))
	}
	p := newGRPCParser(f, 0)
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := serviceconfig.Parse(data, serviceconfig.Lenient())
		_, grpcErr := p.parse(string(data), testMethod)
		switch {
		case (err == nil) == (grpcErr == nil):
		case err != nil:
			var e *serviceconfig.Error
			if errors.As(err, &e) && ourKeyRejected(e) {
				if why := refusedKeyIsKnown(data, e); why != "" {
					t.Fatalf("Parse(%q) = %v, but %s", data, err, why)
				}
				return
			}
			if errors.As(err, &e) && documentedRejection(e.Path) {
				return
			}
			t.Fatalf("Parse(%q) = %v, but grpc-go accepts it", data, err)
		default:
			if caseInsensitiveCode(grpcErr) || strings.Contains(grpcErr.Error(), "no supported policies") {
				return
			}
			t.Fatalf("Parse(%q) accepts it, but grpc-go says %v", data, grpcErr)
		}
	})
}

// ourKeyRejected reports whether e is an unknown key that Parse refuses
// and grpc-go ignores by design: one of our keys misspelt or misplaced.
func ourKeyRejected(e *serviceconfig.Error) bool {
	return strings.HasPrefix(e.Err.Error(), "unknown key") || neverMatches(e)
}

// knownKeys are the keys of each object of a service config, gRFC A6's
// and ours, written out here rather than read from the wire types, so that
// the check below does not share the parser's idea of them.
var knownKeys = map[string][]string{
	"":                  {"loadBalancingPolicy", "loadBalancingConfig", "methodConfig", "retryThrottling", "healthCheckConfig", "retryBudget"},
	"methodConfig":      {"name", "waitForReady", "timeout", "maxRequestMessageBytes", "maxResponseMessageBytes", "retryPolicy", "hedgingPolicy", "circuitBreaker", "bulkhead", "rateLimit"},
	"name":              {"service", "method"},
	"retryPolicy":       {"maxAttempts", "initialBackoff", "maxBackoff", "backoffMultiplier", "retryableStatusCodes", "perAttemptRecvTimeout", "jitter"},
	"hedgingPolicy":     {"maxAttempts", "hedgingDelay", "nonFatalStatusCodes", "hedgingDelayQuantile", "hedgingDelayFloor", "hedgingDelayMinSamples"},
	"retryThrottling":   {"maxTokens", "tokenRatio"},
	"healthCheckConfig": {"serviceName"},
	"retryBudget":       {"ratio", "minRetriesPerSecond", "ttl"},
	"circuitBreaker": {"mode", "k", "consecutiveFailures", "failureRateThreshold", "slowCallDuration", "slowCallRateThreshold",
		"minimumCalls", "window", "openDuration", "maxOpenDuration", "halfOpenProbes", "failureStatusCodes"},
	"bulkhead":  {"maxConcurrent", "maxQueue", "maxQueueWait"},
	"rateLimit": {"rate", "per", "burst", "maxWait"},
}

// refusedKeyIsKnown checks an "unknown key" error of Parse against the
// document: its path must lead, through the document's own keys, to a key
// that the object holding it does not know (encoding/json, and so grpc-go,
// would match a known key without regard to case). It says what is wrong,
// or returns "" when the refusal is right or the path cannot be followed
// (a repeated key, whose last value encoding/json keeps, may hide the
// object the parser walked).
func refusedKeyIsKnown(data []byte, e *serviceconfig.Error) string {
	if !strings.HasPrefix(e.Err.Error(), "unknown key") {
		return ""
	}
	var doc any
	if json.Unmarshal(data, &doc) != nil {
		return ""
	}
	kind, path := "", e.Path
	for {
		obj, ok := doc.(map[string]any)
		if !ok {
			return ""
		}
		if _, ok := obj[path]; ok {
			for _, k := range knownKeys[kind] {
				if strings.EqualFold(k, path) {
					return "the key " + strconv.Quote(path) + " is " + strconv.Quote(k) + ", which the object knows"
				}
			}
			return ""
		}
		key, rest, ok := nextKey(obj, path)
		if !ok {
			return ""
		}
		doc, path, kind = obj[key], rest, canonicalKey(kind, key)
		for arr, isArr := doc.([]any); isArr && strings.HasPrefix(path, "["); arr, isArr = doc.([]any) {
			end := strings.IndexByte(path, ']')
			i, err := strconv.Atoi(path[1:max(end, 1)])
			if end < 0 || err != nil || i >= len(arr) {
				return ""
			}
			doc, path = arr[i], path[end+1:]
		}
		if !strings.HasPrefix(path, ".") {
			return "the path names no key"
		}
		path = path[1:]
	}
}

// nextKey returns the key of obj that path starts with, and the rest of
// path; the longest such key, since keys may hold dots and brackets.
func nextKey(obj map[string]any, path string) (key, rest string, ok bool) {
	for k := range obj {
		if strings.HasPrefix(path, k) && len(path) > len(k) && (path[len(k)] == '.' || path[len(k)] == '[') && len(k) >= len(key) {
			key, rest, ok = k, path[len(k):], true
		}
	}
	return key, rest, ok
}

// canonicalKey returns the knownKeys entry of the object that key, a key
// of an object of kind parent, holds, or "-" for an object with no known
// keys.
func canonicalKey(parent, key string) string {
	for _, k := range knownKeys[parent] {
		if strings.EqualFold(k, key) {
			if _, ok := knownKeys[k]; ok {
				return k
			}
		}
	}
	return "-"
}

// neverMatches reports whether e refuses a name that can never match a
// call, which grpc-go accepts (Name.Validate).
func neverMatches(e *serviceconfig.Error) bool {
	msg := e.Err.Error()
	return strings.Contains(e.Path, ".name[") &&
		(strings.Contains(msg, "holds a slash") || strings.Contains(msg, "holds a space") || strings.Contains(msg, "has an empty part"))
}

// documentedRejection reports whether an error at path is one grpc-go does
// not give by design: in our blocks or fields, or in a block gRFC A6 has us
// validate where grpc-go does not.
func documentedRejection(path string) bool {
	for _, p := range []string{".hedgingPolicy", ".circuitBreaker", ".bulkhead", ".rateLimit", ".perAttemptRecvTimeout", ".jitter"} {
		if strings.Contains(path, p) {
			return true
		}
	}
	return strings.HasPrefix(path, "retryThrottling") || strings.HasPrefix(path, "retryBudget")
}

// caseInsensitiveCode reports whether grpcErr is grpc-go rejecting a status
// code name only for its case, which gRFC A6 allows.
func caseInsensitiveCode(grpcErr error) bool {
	// grpc-go: invalid code: "\"unavailable\""
	_, quoted, ok := strings.Cut(grpcErr.Error(), "invalid code: ")
	if !ok {
		return false
	}
	raw, err := strconv.Unquote(quoted)
	if err != nil {
		return false
	}
	var name string
	if json.Unmarshal([]byte(raw), &name) != nil || strings.ContainsRune(raw, '\\') || name == strings.ToUpper(name) {
		return false
	}
	_, err = rescodes.Parse(name)
	return err == nil && (name[0] < '0' || name[0] > '9')
}
