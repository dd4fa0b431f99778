// Package serviceconfig is the data model of grpc-resilience: the gRPC
// service config of gRFC A6 and this module's extension blocks, as plain Go
// structs with Validate methods, and a parser for the JSON document.
//
// The same structs come from Go code and from a service-config document, so
// one data model drives the client either way. The package is pure data and
// validation, with no grpc runtime; package interceptor turns a Config into
// behaviour.
//
// Specifications:
//   - gRFC A6, client retries: https://github.com/grpc/proposal/blob/master/A6-client-retries.md
//   - the service config: https://github.com/grpc/grpc/blob/master/doc/service_config.md
//   - its proto: https://github.com/grpc/grpc-proto/blob/master/grpc/service_config/service_config.proto
//
// # Parsing
//
// [Parse] reads the document platform teams already hand to grpc-go (from
// DNS TXT records, a resolver, a config repository) and gives the same
// verdict as grpc-go v1.85 on it, except for the gRFC A6 corrections and
// the strictness listed below ("Where Parse differs from grpc-go"): a typo
// that would widen a policy to every method is an error, which [Lenient]
// turns back into grpc-go's silent acceptance. A test feeds every case of
// its table, and a fuzz target random documents, to grpc-go's own parser
// to hold this. [Config.Lookup] then
// resolves a method's policy with grpc's precedence: the entry naming the
// exact method, else the one naming its service, else the default entry;
// entries at different levels are never merged.
//
// A bad document gets an [*Error] naming the JSON path of the first problem
// and the rule it breaks, and Parse never panics:
//
//	serviceconfig: methodConfig[1].retryPolicy.maxAttempts: must be greater than 1
//	serviceconfig: methodConfig[0].timeout: "100ms" is not a duration: a service config takes seconds, so write "0.1s"
//	serviceconfig: methodConfig[0]: invalid JSON at line 3, column 18: invalid character '}' ...
//
// # What Parse accepts
//
// As grpc-go does:
//   - The document is a JSON object, or null (an empty config); empty input,
//     other JSON values and trailing data are errors.
//   - Keys match field names case-insensitively, as encoding/json matches
//     them. In gRFC A6's own objects an unknown key is ignored, whatever it
//     holds, and reported by [Config.Warnings] with the known key it most
//     likely misspells (svcconfig check prints these warnings and fails on
//     them with -strict); see "Unknown keys" below for the keys that are
//     errors, and "A typo never widens a policy" for those that change
//     which methods a policy covers. A key given twice
//     decodes twice, as in encoding/json: the last value wins, objects and
//     arrays merge into the earlier ones, and a value that failed to decode
//     fails the document even if a later one is good (but see "A typo
//     never widens a policy" for a key given twice in a name, and "name"
//     or "methodConfig" given twice).
//   - null means absent for timeout, waitForReady, the message sizes, the
//     policies, and the blocks. For a number or string field it leaves the
//     field as it was (absent, so zero). initialBackoff and maxBackoff hold
//     values, not pointers, in grpc-go, so null there is an error.
//   - Durations (timeout, initialBackoff, maxBackoff and every duration of
//     our blocks) are JSON strings in the protobuf JSON form: decimal seconds
//     with a lower-case "s" and up to 9 fraction digits, such as "1s",
//     "0.5s", ".05s", "-1s". "1", "100ms", "1S", "1m" and JSON numbers are
//     errors. More than 315,576,000,000 s is an error; past the ~292 years a
//     time.Duration holds the value is clamped. Like grpc-go, the parser
//     takes a sign after the "-" or the "." as written ("+1s" is 1s).
//   - A negative timeout is accepted and, as in grpc-go, means no timeout;
//     [Config.Warnings] reports it.
//   - maxAttempts is a JSON integer greater than 1 (2.0 and "3" are errors)
//     and is lowered to the cap, 5 unless [WithMaxAttemptsCap] raises it.
//     initialBackoff and maxBackoff must be greater than 0, backoffMultiplier
//     a number greater than 0, retryableStatusCodes a non-empty list. No
//     relation between the backoffs is required.
//   - maxRequestMessageBytes and maxResponseMessageBytes are JSON integers
//     of 64 bits; any value, negative included, is kept.
//   - Status codes are names, or JSON numbers 0 to 16. A name is a plain
//     JSON string: "14" and names with escape sequences are errors. A null
//     element reads as OK (0), as it does in grpc-go.
//   - Names: {"service", "method"} selects one method, {"service"} (or an
//     empty method) a whole service, {} (or an empty service) is the
//     default. null in a name is refused (see "A typo never widens a
//     policy"); with [Lenient], as in grpc-go, a null element is {} and a
//     null service or method is "".
//     A method without a service is an error. A name given twice anywhere in
//     the document is an error; names are compared as grpc-go files them,
//     by the key "/service/method". A name that no well-formed call carries is
//     an error too, where grpc-go accepts it and applies it to nothing: a
//     slash in service or method ({"service": "/shop.Orders/Pay"} is
//     written {"service": "shop.Orders", "method": "Pay"}), a space or a
//     control character, an empty dotted part (".shop.Orders"); see
//     [Name.Validate].
//   - An entry whose name is absent or null applies to no method, and so
//     does one with an empty name list: Parse refuses both (see "A typo
//     never widens a policy"). With [Lenient], as in grpc-go, an entry
//     without a name is skipped: it must still decode (durations, status
//     codes and types as above), but its policies are not checked, and it
//     is left out of Config; an entry with an empty name list is checked
//     and kept, and selects nothing.
//   - One invalid entry invalidates the whole document.
//   - loadBalancingPolicy must be a string, healthCheckConfig an object
//     with a string serviceName. Both are carried in Config, not applied.
//   - loadBalancingConfig must be a non-empty array of objects that each
//     hold exactly one policy, read in order up to the first policy grpc
//     supports: pick_first (whose config is checked as pick_first checks it)
//     or round_robin. It is carried in Config as compact JSON.
//
// # A zero timeout
//
// gRFC A6 does not say what "timeout": "0s" means. grpc-go gives the call a
// deadline that has already passed, so it fails at once with
// DEADLINE_EXCEEDED and no attempt reaches the server; Parse follows it, the
// safe choice for a document both may run: "0s" parses to a Timeout of 1ns
// (zero means no timeout in MethodConfig, so "0s" cannot parse to zero),
// which the interceptor package runs the same way: a call under it fails
// at once, before any attempt. A negative timeout is ignored, as grpc-go
// ignores it: it parses to a Timeout of 0, no timeout, with a warning.
//
// # Where Parse differs from grpc-go
//
// Only where grpc-go departs from gRFC A6, where a pure package cannot know
// what grpc-go knows, and where grpc-go's leniency would change in silence
// which methods a policy covers:
//
//   - Status code names are case-insensitive (A6): "unavailable" is
//     UNAVAILABLE. grpc-go accepts upper case only.
//
//   - hedgingPolicy is parsed and validated (A6): maxAttempts is required,
//     greater than 1 and capped like retryPolicy's; hedgingDelay is an
//     optional duration, not negative; nonFatalStatusCodes an optional
//     list. grpc-go ignores the block.
//
//   - An entry with both retryPolicy and hedgingPolicy is an error (A6:
//     "only one of retryPolicy or hedgingPolicy may be set"). grpc-go
//     ignores hedgingPolicy and accepts it.
//
//   - retryThrottling is validated even when methodConfig is absent or null;
//     grpc-go checks it only when methodConfig is present. maxTokens must be
//     in (0, 1000]; digits of tokenRatio past the third decimal are dropped,
//     as A6 says ("up to 3 decimal places are supported"), and a positive
//     tokenRatio under 0.001, which A6 allows, is raised to 0.001 rather
//     than cut to 0 (a bucket that never refills): 0.0009 runs as 0.001,
//     where grpc-go uses it whole, so a success adds 0.0001 more tokens than
//     in grpc-go. The cut is made on the decimal digits as written: 1.0059
//     gives 1.005.
//
//   - loadBalancingConfig: grpc-go accepts a policy only if the running
//     program registered it, and checks its config with that policy's
//     parser. Parse sees no registry: a list whose policies are all
//     unknown to it (neither pick_first, round_robin nor this module's
//     resilience_endpoint, see EndpointPolicy) is accepted, and their
//     configs are not checked. resilience_endpoint's block is checked by
//     ParseEndpointPolicy, with errors at paths such as
//     loadBalancingConfig[0].resilience_endpoint.maxEjectionPercent. loadBalancingPolicy is not checked
//     either; grpc-go falls back to pick_first for an unknown name.
//
//   - Our extension blocks, which grpc-go ignores, are validated (below).
//
//   - Unknown keys in our blocks are errors (below), and so is, in A6's
//     objects, a key that is one of ours misspelt or put in the wrong
//     place; grpc-go ignores both.
//
//   - A typo or an empty entry that changes which methods a policy covers
//     is an error (below), which grpc-go accepts. With [Lenient], Parse
//     gives grpc-go's verdict and reports them as warnings of kind
//     [WarningCoverage]; interceptor.Client.WrapResolver parses the
//     configs a resolver delivers so, as grpc-go applies them anyway.
//
// # A typo never widens a policy
//
// grpc-go ignores an unknown key wherever it is. In a name that is worse
// than a default: {"services": "shop.Orders"} is the name {}, the default
// entry, and a 10-attempt policy meant for one service applies to every
// method, health checks included. So Parse refuses what changes which
// methods a policy covers, naming the path and the key it likely
// misspells:
//
//	serviceconfig: methodConfig[0].name[0].services: unknown key: did you mean "service"? grpc-go ignores it, which leaves the name {}, the default entry: its policies would apply to every method
//	serviceconfig: methodConfigs: unknown key: did you mean "methodConfig"? grpc-go ignores it, so the entries it holds apply to no method
//
// That is: any unknown key in a name; a key that most likely misspells
// "name" in an entry, or "methodConfig" at the top level; any other unknown
// top-level key in a document without methodConfig (unless it most likely
// misspells another top-level key); an entry whose name is absent, null or
// an empty list, which applies to no method; null in a name, which grpc-go
// reads as "" ({"service": null} and [null] are the default entry, a null
// method widens a name to its service: what a template whose variable is
// unset writes); and a key given twice in a name, or "name" twice in an
// entry, or "methodConfig" twice, which grpc-go merges into names neither
// copy wrote:
//
//	serviceconfig: methodConfig[0].name[0].service: null: grpc-go reads it as "", which leaves the name {}, the default entry: its policies would apply to every method (write {} if every method is meant)
//
// A document delivered by a resolver, which grpc-go applies whatever it
// holds, is read with [Lenient]; each [Warning] has a Kind that tells
// these ([WarningCoverage]) from the unknown keys that only leave a field
// at its default ([WarningIgnoredKey]).
//
// # Extension blocks
//
// grpc-go ignores unknown keys, so one document carries our blocks too and
// stays valid for grpc-go. Their keys are the lowerCamel names of the Go
// fields; durations use the protobuf form above; status-code lists read as
// above; null means absent. They decode into the same structs Go code
// builds, are checked by the same Validate methods, and an error names the
// full path, such as methodConfig[0].circuitBreaker.failureRateThreshold.
//
//	{
//	  "methodConfig": [{
//	    "name": [{"service": "shop.Orders"}],
//	    "timeout": "2s",
//	    "retryPolicy": {
//	      "maxAttempts": 4, "initialBackoff": "0.05s", "maxBackoff": "1s",
//	      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"],
//	      "perAttemptRecvTimeout": "0.5s",  // RetryPolicy.PerAttemptRecvTimeout
//	      "jitter": "full"                  // a6, full, equal, decorrelated, none
//	    },
//	    "circuitBreaker": {                 // CircuitBreaker, per method
//	      "consecutiveFailures": 5, "failureRateThreshold": 0.5,
//	      "slowCallDuration": "2s", "slowCallRateThreshold": 0.8,
//	      "minimumCalls": 20, "window": "10s", "openDuration": "5s",
//	      "maxOpenDuration": "60s", "halfOpenProbes": 1,
//	      "failureStatusCodes": ["UNAVAILABLE", "INTERNAL"]
//	    },
//	    "bulkhead": {"maxConcurrent": 64, "maxQueue": 128, "maxQueueWait": "0.1s"}
//	  }, {
//	    "name": [{"service": "shop.Catalog"}],
//	    "hedgingPolicy": {
//	      "maxAttempts": 2, "hedgingDelay": "0.02s",  // the delay until 100 samples
//	      "hedgingDelayQuantile": 0.95,   // then hedge at the observed p95 latency
//	      "hedgingDelayFloor": "0.001s",  // never sooner than 1ms
//	      "hedgingDelayMinSamples": 100   // HedgingPolicy.HedgingDelayMinSamples
//	    }
//	  }],
//	  "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},
//	  "retryBudget": {"ratio": 0.2, "minRetriesPerSecond": 10, "ttl": "10s"}
//	}
//
// A circuitBreaker block may instead ask for the SRE book's client-side
// adaptive throttling, which takes only k and window:
//
//	"circuitBreaker": {"mode": "adaptive", "k": 2, "window": "60s"}
//
// (JSON has no comments; they are here for the reader.) Integers must be
// JSON integers, numbers JSON numbers; a field left out is zero, which
// means the default each field documents.
//
// # Unknown keys
//
// A misspelt key would otherwise leave its field at the default without a
// word: "circuitBreaker": {"failureRate": 0.5, "openDurationMs": 100}
// would run a breaker with the 5s default. Where the schema is ours, an
// unknown key is an error that names its path and the closest known key:
//
//	serviceconfig: methodConfig[0].circuitBreaker.failureRate: unknown key: did you mean "failureRateThreshold"?
//	serviceconfig: methodConfig[0].retryBudget: unknown key here: it belongs in the top level
//
// That holds in circuitBreaker, bulkhead and retryBudget, in every block of
// the server document ([ParseServer]), and for our extension fields in
// A6's objects (perAttemptRecvTimeout and jitter in retryPolicy, the
// adaptive delay's fields in hedgingPolicy): in an A6 object, a key that is
// close to one of ours (an edit distance of 2, or one a prefix of the
// other, compared without regard to case) or that is one of ours in the
// wrong object is an error. Any other unknown key in an A6 object stays a
// warning ([Config.Warnings]), so that a document grpc-go accepts is not
// refused for a field a newer gRFC adds. A required A6 field reported
// missing names the unknown key that likely misspells it:
//
//	serviceconfig: methodConfig[0].retryPolicy.maxAttempts: is required and must be greater than 1 (the document has "maxAttemps": a misspelling?)
//
// # Writing a document
//
// [Config.MarshalJSON] writes a Config back in this form, durations as
// "0.5s" and codes as upper-case names. Parse reads what it writes back to
// an equal Config, which the fuzz test checks.
//
// # Concurrency
//
// Parse and the Validate methods are safe to call concurrently. A Config is
// a plain value: reading it (Lookup, MarshalJSON) from many goroutines is
// safe while nothing writes it.
package serviceconfig
