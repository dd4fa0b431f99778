package interceptor

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
)

// A scenario of the differential test (parity_test.go): one service config
// with gRFC A6 fields only, and calls made one after another on one
// connection, each with a script of what the server does on each of its
// attempts. It is plain JSON, so that a failing scenario can be printed,
// saved and replayed (-parity.replay).
type scenario struct {
	// Seed is the generator's seed for this scenario (informative).
	Seed uint64 `json:"seed,omitempty"`
	// MaxAttempts, Codes and BackoffMultiplier make the retryPolicy of Echo
	// and ServerStream; Lookup has no policy, nor has ServerStream when
	// StreamNoPolicy is set.
	MaxAttempts       int      `json:"maxAttempts"`
	Codes             []string `json:"retryableStatusCodes"`
	BackoffMultiplier float64  `json:"backoffMultiplier"`
	StreamNoPolicy    bool     `json:"streamNoPolicy,omitempty"`
	// MaxTokens and TokenRatio make the retryThrottling block, when
	// MaxTokens is positive.
	MaxTokens  float64 `json:"maxTokens,omitempty"`
	TokenRatio float64 `json:"tokenRatio,omitempty"`
	// TimeoutMs is the methods' timeout in ms; 0: none.
	TimeoutMs int `json:"timeoutMs,omitempty"`
	// ZeroTimeout gives the methods "timeout": "0s" instead.
	ZeroTimeout bool `json:"zeroTimeout,omitempty"`
	// Calls are made in order.
	Calls []scenarioCall `json:"calls"`
}

// scenarioCall is one call of a scenario.
type scenarioCall struct {
	// Method is "Echo", "Lookup" or "ServerStream", or "EchoRaw": Echo
	// with messages that are not proto (rawCodec).
	Method string `json:"method"`
	// Wire is the request's size on the wire (message plus gRPC's 5-byte
	// prefix) when it is large; 0 for a small request.
	Wire int `json:"wire,omitempty"`
	// Count is the number of responses a ServerStream asks for.
	Count int `json:"count,omitempty"`
	// HeaderFirst makes the caller of a ServerStream call Header() before
	// its first Recv; otherwise it calls it after the stream ended.
	HeaderFirst bool `json:"headerFirst,omitempty"`
	// Attempts script the server's attempts in order; attempts past the
	// end succeed.
	Attempts []scriptedAttempt `json:"attempts"`
}

// scriptedAttempt is what the server does on one attempt.
type scriptedAttempt struct {
	// Code ends the attempt with that status code name; "" succeeds.
	Code string `json:"code,omitempty"`
	// Pushback values go in the grpc-retry-pushback-ms trailer.
	Pushback []string `json:"pushback,omitempty"`
	// Header sends response headers before failing.
	Header bool `json:"header,omitempty"`
	// Hang waits until the call's timeout ends the attempt (only with a
	// timeout).
	Hang bool `json:"hang,omitempty"`
	// Sent is the number of stream responses sent before failing.
	Sent int `json:"sent,omitempty"`
}

// parityService is the service the scenarios call.
const parityService = "resilience.echo.v1.EchoService"

// serviceConfig returns the scenario's service config document: A6 fields
// only, backoffs of a millisecond or two so that scenarios run fast.
func (s *scenario) serviceConfig() string {
	codes, _ := json.Marshal(s.Codes)
	var timeout string
	switch {
	case s.ZeroTimeout:
		timeout = `"timeout": "0s", `
	case s.TimeoutMs > 0:
		timeout = fmt.Sprintf(`"timeout": "%.3fs", `, float64(s.TimeoutMs)/1000)
	}
	retried, plain := []string{"Echo", "ServerStream"}, []string{"Lookup"}
	if s.StreamNoPolicy {
		retried, plain = retried[:1], append(plain, "ServerStream")
	}
	doc := fmt.Sprintf(`{"methodConfig": [{"name": %s, %s`+
		`"retryPolicy": {"maxAttempts": %d, "initialBackoff": "0.001s", "maxBackoff": "0.002s", "backoffMultiplier": %g, "retryableStatusCodes": %s}}`,
		names(retried), timeout, s.MaxAttempts, s.BackoffMultiplier, codes)
	if timeout != "" {
		// The methods without a retry policy have the same timeout.
		doc += fmt.Sprintf(`, {"name": %s, %s"waitForReady": false}`, names(plain), timeout)
	}
	doc += `]`
	if s.MaxTokens > 0 {
		doc += fmt.Sprintf(`, "retryThrottling": {"maxTokens": %g, "tokenRatio": %g}`, s.MaxTokens, s.TokenRatio)
	}
	return doc + `}`
}

// names returns the JSON name list of methods of parityService.
func names(methods []string) string {
	var parts []string
	for _, m := range methods {
		parts = append(parts, fmt.Sprintf(`{"service": %q, "method": %q}`, parityService, m))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// String returns the scenario as one line of JSON.
func (s *scenario) String() string {
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Sprintf("%+v", *s)
	}
	return string(b)
}

// The generator's vocabularies.
var (
	// parityCodes are the codes a scripted attempt fails with.
	parityCodes = []string{"UNAVAILABLE", "RESOURCE_EXHAUSTED", "ABORTED", "DEADLINE_EXCEEDED", "INTERNAL", "INVALID_ARGUMENT", "CANCELLED", "UNKNOWN"}
	// parityRetryable are the codes a policy may list.
	parityRetryable = []string{"UNAVAILABLE", "RESOURCE_EXHAUSTED", "ABORTED", "DEADLINE_EXCEEDED", "INTERNAL", "CANCELLED"}
	// parityPushbacks are trailer values: delays of 0 to 2 ms, and values
	// that say not to retry (negative, malformed, repeated).
	parityPushbacks = [][]string{{"0"}, {"1"}, {"2"}, {"-1"}, {"-5"}, {"soon"}, {""}, {"1.5"}, {"1", "2"}, {"-1", "-1"}}
)

// generate returns the scenario of seed.
func generate(seed uint64) *scenario {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := &scenario{
		Seed:              seed,
		MaxAttempts:       2 + r.IntN(4),
		BackoffMultiplier: []float64{1, 1.5, 2}[r.IntN(3)],
	}
	for _, c := range parityRetryable {
		if r.IntN(3) == 0 {
			s.Codes = append(s.Codes, c)
		}
	}
	if len(s.Codes) == 0 {
		s.Codes = []string{"UNAVAILABLE"}
	}
	s.StreamNoPolicy = r.IntN(6) == 0
	if r.IntN(2) == 0 {
		s.MaxTokens = float64(1 + r.IntN(8))
		s.TokenRatio = []float64{0.1, 0.5, 1, 0.25, 0.0009}[r.IntN(5)]
	}
	switch r.IntN(40) {
	case 0:
		s.ZeroTimeout = true
	case 1, 2, 3, 4, 5, 6, 7, 8:
		// Long enough that only a hang meets it, even under -race on a
		// busy machine.
		s.TimeoutMs = 1000 + 100*r.IntN(3)
	}
	for range 1 + r.IntN(6) {
		s.Calls = append(s.Calls, generateCall(r, s))
	}
	return s
}

// generateCall returns a random call under s.
func generateCall(r *rand.Rand, s *scenario) scenarioCall {
	c := scenarioCall{Method: []string{"Echo", "Echo", "Lookup", "ServerStream", "ServerStream"}[r.IntN(5)]}
	if c.Method == "ServerStream" {
		c.Count = r.IntN(4)
		c.HeaderFirst = r.IntN(2) == 0
	}
	if r.IntN(8) == 0 {
		// Around the replay bound: grpc-go commits when the bytes buffered
		// exceed it.
		c.Wire = DefaultStreamReplayBuffer + r.IntN(13) - 6
	}
	for range r.IntN(s.MaxAttempts + 2) {
		a := scriptedAttempt{}
		switch {
		case r.IntN(3) == 0:
			a.Code = s.Codes[r.IntN(len(s.Codes))] // retryable under the policy
		default:
			a.Code = parityCodes[r.IntN(len(parityCodes))]
		}
		if r.IntN(4) == 0 {
			a.Pushback = parityPushbacks[r.IntN(len(parityPushbacks))]
		}
		a.Header = r.IntN(6) == 0
		if c.Method == "ServerStream" && c.Count > 0 && r.IntN(4) == 0 {
			a.Sent = 1 + r.IntN(c.Count)
		}
		if s.TimeoutMs > 0 && r.IntN(6) == 0 {
			a = scriptedAttempt{Hang: true}
		}
		c.Attempts = append(c.Attempts, a)
	}
	return c
}

// describe returns a short text of call i of s, for failure messages.
func (s *scenario) describe(i int) string {
	b, _ := json.Marshal(s.Calls[i])
	return strings.TrimSpace(string(b))
}

// namedScenarios are the classes of calls where our A6 throttle accounting
// once differed from grpc-go's (issue 20, item 10), run by every run of
// the differential test beside the generated scenarios: for each method
// (Echo also with messages that are not proto, measured by their codec),
// with and without a retry policy, requests from 5 bytes under to 5 bytes
// over the replay buffer (grpc-go commits a call whose bytes sent exceed
// it), failing with a retryable code, with a pushback that says not to
// retry, or after response headers (committed). Each scenario is one call
// on a full throttle, whose tokens are compared after it.
func namedScenarios() []*scenario {
	failures := [][]scriptedAttempt{
		{{Code: "UNAVAILABLE"}},
		{{Code: "UNAVAILABLE", Pushback: []string{"-1"}}},
		{{Code: "INVALID_ARGUMENT", Pushback: []string{"1", "2"}}},
		{{Code: "UNAVAILABLE", Header: true}},
		{{Code: "UNAVAILABLE", Header: true, Pushback: []string{"-1"}}},
	}
	var out []*scenario
	for _, method := range []string{"Echo", "EchoRaw", "Lookup", "ServerStream"} {
		for _, noPolicy := range []bool{false, true} {
			if noPolicy && method != "ServerStream" {
				continue // Lookup is the unary method without a policy
			}
			for d := -5; d <= 5; d++ {
				for _, f := range failures {
					out = append(out, &scenario{MaxAttempts: 3, Codes: []string{"UNAVAILABLE"}, BackoffMultiplier: 1,
						StreamNoPolicy: noPolicy, MaxTokens: 10, TokenRatio: 0.5,
						Calls: []scenarioCall{{Method: method, Count: 1, Wire: DefaultStreamReplayBuffer + d, Attempts: f}}})
				}
			}
		}
	}
	return out
}
