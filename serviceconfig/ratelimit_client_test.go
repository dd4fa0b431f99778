package serviceconfig_test

import (
	"testing"
	"time"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestClientRateLimitParse pins the client's rateLimit block: what it
// accepts, and each refusal with its JSON path.
func TestClientRateLimitParse(t *testing.T) {
	wrap := func(block string) string {
		return `{"methodConfig":[{"name":[{"service":"shop.Orders"}],"rateLimit":` + block + `}]}`
	}
	tests := []struct {
		name    string
		doc     string
		want    *serviceconfig.ClientRateLimit
		wantErr string
	}{
		{name: "limit and wait", doc: wrap(`{"rate": 10, "per": "60s", "burst": 2, "maxWait": "0.5s"}`),
			want: &serviceconfig.ClientRateLimit{Rate: 10, Per: time.Minute, Burst: 2, MaxWait: 500 * time.Millisecond}},
		{name: "pacing only", doc: wrap(`{}`), want: &serviceconfig.ClientRateLimit{}},
		{name: "pacing with a wait", doc: wrap(`{"maxWait": "1s"}`), want: &serviceconfig.ClientRateLimit{MaxWait: time.Second}},
		{name: "rate 0 written out", doc: wrap(`{"rate": 0, "burst": 2}`),
			wantErr: "serviceconfig: methodConfig[0].rateLimit.rate: must be a positive number of attempts per period (leave it out to pace only)"},
		{name: "negative rate", doc: wrap(`{"rate": -1, "burst": 2}`),
			wantErr: "serviceconfig: methodConfig[0].rateLimit.rate: must be a positive number of attempts per period (leave it out to pace only)"},
		{name: "rate without burst", doc: wrap(`{"rate": 10}`),
			wantErr: "serviceconfig: methodConfig[0].rateLimit.burst: must be at least 1 (the attempts sent at once; 1 spaces them evenly)"},
		{name: "burst 0", doc: wrap(`{"rate": 10, "burst": 0}`),
			wantErr: "serviceconfig: methodConfig[0].rateLimit.burst: must be at least 1 (the attempts sent at once; 1 spaces them evenly)"},
		{name: "burst without rate", doc: wrap(`{"burst": 3}`),
			wantErr: "serviceconfig: methodConfig[0].rateLimit.burst: needs rate: without a rate, the block only paces the method as the server says"},
		{name: "per without rate", doc: wrap(`{"per": "1s"}`),
			wantErr: "serviceconfig: methodConfig[0].rateLimit.per: needs rate: without a rate, the block only paces the method as the server says"},
		{name: "misspelt key", doc: wrap(`{"rate": 10, "brust": 3}`),
			wantErr: `serviceconfig: methodConfig[0].rateLimit.brust: unknown key: did you mean "burst"?`},
		{name: "server's plural in a client entry", doc: `{"methodConfig":[{"name":[{"service":"a.B"}],"rateLimits":{"rate":10}}]}`,
			wantErr: `serviceconfig: methodConfig[0].rateLimits: unknown key: did you mean "rateLimit"? (one of grpc-resilience's own keys)`},
		{name: "at the top level", doc: `{"rateLimit":{"rate":1}}`,
			wantErr: "serviceconfig: rateLimit: unknown key here: it belongs in a methodConfig entry"},
		{name: "rate of the wrong type", doc: wrap(`{"rate": "10"}`),
			wantErr: "serviceconfig: methodConfig[0].rateLimit.rate: must be a number, not a string"},
		{name: "negative maxWait", doc: wrap(`{"rate": 10, "burst": 1, "maxWait": "-1s"}`),
			wantErr: "serviceconfig: methodConfig[0].rateLimit.maxWait: must not be negative"},
		{name: "over one per nanosecond", doc: wrap(`{"rate": 1e10, "burst": 1}`),
			wantErr: "serviceconfig: methodConfig[0].rateLimit.rate: more than one attempt per nanosecond"},
		{name: "not an object", doc: wrap(`[]`),
			wantErr: "serviceconfig: methodConfig[0].rateLimit: must be an object, not an array"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := serviceconfig.Parse([]byte(tt.doc))
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("Parse(%s) = %v, want %q", tt.doc, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%s) = %v", tt.doc, err)
			}
			if got := c.MethodConfig[0].RateLimit; got == nil || *got != *tt.want {
				t.Fatalf("Parse(%s).RateLimit = %+v, want %+v", tt.doc, got, tt.want)
			}
			// The document MarshalJSON writes parses to the same block.
			b, err := c.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			c2, err := serviceconfig.Parse(b)
			if err != nil {
				t.Fatalf("Parse(MarshalJSON()) = %v for %s", err, b)
			}
			if got := c2.MethodConfig[0].RateLimit; *got != *tt.want {
				t.Fatalf("round trip %s: %+v, want %+v", b, got, tt.want)
			}
		})
	}
}

// TestClientRateLimitValidateGo: the Go struct is checked as the JSON is,
// with the same paths.
func TestClientRateLimitValidateGo(t *testing.T) {
	tests := []struct {
		r    serviceconfig.ClientRateLimit
		want string
	}{
		{serviceconfig.ClientRateLimit{}, ""},
		{serviceconfig.ClientRateLimit{Rate: 5, Burst: 1}, ""},
		{serviceconfig.ClientRateLimit{Rate: -5, Burst: 1}, "serviceconfig: methodConfig[0].rateLimit.rate: must be a positive number of attempts per period"},
		{serviceconfig.ClientRateLimit{Rate: 5}, "serviceconfig: methodConfig[0].rateLimit.burst: must be at least 1 (the attempts sent at once; 1 spaces them evenly)"},
		{serviceconfig.ClientRateLimit{Burst: 5}, "serviceconfig: methodConfig[0].rateLimit.burst: needs rate: without a rate, the block only paces the method as the server says"},
		{serviceconfig.ClientRateLimit{Rate: 5, Burst: 1, Per: -time.Second}, "serviceconfig: methodConfig[0].rateLimit.per: must not be negative"},
		{serviceconfig.ClientRateLimit{MaxWait: -1}, "serviceconfig: methodConfig[0].rateLimit.maxWait: must not be negative"},
	}
	for _, tt := range tests {
		c := serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
			Name: []serviceconfig.Name{{Service: "a.B"}}, RateLimit: &tt.r}}}
		err := c.Validate()
		if got := errString(err); got != tt.want {
			t.Errorf("Validate(%+v) = %q, want %q", tt.r, got, tt.want)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
