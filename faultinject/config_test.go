package faultinject_test

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/faultinject"
)

func TestParse(t *testing.T) {
	cfg, err := faultinject.Parse([]byte(`{"seed": 7, "faults": [{
		"methods": ["resilience.echo.v1.EchoService/Echo", "shop.Orders"],
		"delay": {"fixedDelay": "0.05s", "percentage": {"numerator": 20}},
		"abort": {"grpcStatus": "unavailable", "pushback": "-1s", "retryDelay": "150ms",
		          "percentage": {"numerator": 2500, "denominator": "TEN_THOUSAND"}},
		"streamAbort": {"afterMessages": 3, "grpcStatus": 10},
		"outage": {"every": "1m", "duration": "5s", "grpcStatus": "INTERNAL"}}]}`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	f := cfg.Faults[0]
	if cfg.Seed != 7 || f.Delay.Fixed != 50*time.Millisecond || f.Delay.Rate != 0.2 ||
		f.Abort.Code != codes.Unavailable || f.Abort.Rate != 0.25 || f.Abort.Pushback != -time.Second ||
		f.Abort.RetryDelay != 150*time.Millisecond || f.StreamAbort.AfterMessages != 3 ||
		f.StreamAbort.Code != codes.Aborted || f.StreamAbort.Rate != 0 ||
		*f.Outage != (faultinject.Outage{Every: time.Minute, Duration: 5 * time.Second, Code: codes.Internal}) {
		t.Errorf("Parse = %+v %+v %+v %+v %+v", cfg, *f.Delay, *f.Abort, *f.StreamAbort, *f.Outage)
	}
}

func TestParseErrorsNameTheJSONPath(t *testing.T) {
	tests := []struct {
		name, json, want string
	}{
		{"empty fault", `{"faults": [{"methods": ["a.B"]}]}`,
			"faultinject: faults[0]: needs delay, abort, streamAbort or outage"},
		{"unknown code", `{"faults": [{"delay": {"fixedDelay": "1s"}}, {"abort": {"grpcStatus": "UNAVAILABEL"}}]}`,
			`faultinject: faults[1].abort.grpcStatus: unknown status code "UNAVAILABEL"`},
		{"OK is no failure", `{"faults": [{"abort": {"grpcStatus": 0}}]}`,
			`faultinject: faults[0].abort.grpcStatus: OK is not a failure`},
		{"missing code", `{"faults": [{"abort": {}}]}`,
			`faultinject: faults[0].abort.grpcStatus: is required`},
		{"denominator", `{"faults": [{"abort": {"grpcStatus": "INTERNAL", "percentage": {"numerator": 1, "denominator": "THOUSAND"}}}]}`,
			`faultinject: faults[0].abort.percentage: denominator "THOUSAND": want HUNDRED, TEN_THOUSAND or MILLION`},
		{"numerator 0", `{"faults": [{"delay": {"fixedDelay": "1s", "percentage": {"numerator": 0}}}]}`,
			`faultinject: faults[0].delay.percentage: numerator 0 never injects: remove the fault instead`},
		{"negative delay", `{"faults": [{"delay": {"fixedDelay": "-1s"}}]}`,
			`faultinject: faults[0].delay.fixedDelay: "-1s" must not be negative`},
		{"bad duration", `{"faults": [{"delay": {"fixedDelay": "soon"}}]}`,
			`faultinject: faults[0].delay.fixedDelay: "soon" is not a duration such as "0.05s"`},
		{"after 0", `{"faults": [{"streamAbort": {"grpcStatus": "ABORTED"}}]}`,
			`faultinject: faults[0].streamAbort.afterMessages: must be at least 1, got 0`},
		{"bad method", `{"faults": [{"methods": ["/a.B/C/D"], "delay": {"fixedDelay": "1s"}}]}`,
			`faultinject: faults[0].methods[0]: "/a.B/C/D": method "C/D" holds a slash: a method is its bare name, such as "D"`},
		{"method with a space", `{"faults": [{"methods": ["shop.Orders "], "delay": {"fixedDelay": "1s"}}]}`,
			`faultinject: faults[0].methods[0]: "shop.Orders ": service "shop.Orders " holds a space or control character`},
		{"method ending in a slash", `{"faults": [{"methods": ["/shop.Orders/"], "delay": {"fixedDelay": "1s"}}]}`,
			`faultinject: faults[0].methods[0]: "/shop.Orders/" ends in a slash: want "/pkg.Service/Method" or "pkg.Service"`},
		{"unknown field", `{"faults": [{"delay": {"fixedDelay": "1s"}}, {"dealy": {}}]}`,
			`faultinject: faults[1].dealy: unknown key; the keys here are methods, delay, abort, streamAbort, outage`},
		{"unknown nested field", `{"faults": [{"abort": {"grpcStatus": "INTERNAL", "percentage": {"numerator": 1, "denominatr": "MILLION"}}}]}`,
			`faultinject: faults[0].abort.percentage.denominatr: unknown key; the keys here are numerator, denominator`},
		{"wrong type", `{"seed": "x"}`,
			`faultinject: seed: cannot be a string`},
		{"wrong nested type", `{"faults": [{"delay": {"fixedDelay": 0.5}}]}`,
			`faultinject: faults[0].delay.fixedDelay: cannot be a number`},
		{"number out of range", `{"faults": [{"abort": {"grpcStatus": "INTERNAL", "percentage": {"numerator": -1}}}]}`,
			`faultinject: faults[0].abort.percentage.numerator: must be a whole number that fits uint32, not -1`},
		{"faults not a list", `{"faults": {}}`,
			`faultinject: faults: must be an array, not an object`},
		{"syntax", `{"faults": [}`,
			`faultinject: invalid JSON at byte 13: invalid character '}' looking for beginning of value`},
		{"outage without every", `{"faults": [{"outage": {"duration": "1s", "grpcStatus": "UNAVAILABLE"}}]}`,
			`faultinject: faults[0].outage.every: is required`},
		{"outage longer than its period", `{"faults": [{"outage": {"every": "1s", "duration": "2s", "grpcStatus": "UNAVAILABLE"}}]}`,
			`faultinject: faults[0].outage.duration: must be in (0, every=1s], got 2s`},
		{"trailing", `{} {}`,
			`faultinject: trailing data after the configuration, at byte 3`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := faultinject.Parse([]byte(tt.json))
			if err == nil || err.Error() != tt.want {
				t.Fatalf("Parse(%s) = %v, want %s", tt.json, err, tt.want)
			}
			var fe *faultinject.Error
			if !errors.As(err, &fe) {
				t.Errorf("Parse(%s) error %T is not a *faultinject.Error", tt.json, err)
			}
		})
	}
}

func TestNewValidatesGoConfigs(t *testing.T) {
	_, err := faultinject.New(faultinject.Config{Faults: []faultinject.Fault{{Abort: &faultinject.Abort{Code: codes.Internal, Rate: 1.5}}}})
	if want := "faultinject: faults[0].abort.percentage: must be a fraction from 0 to 1, got 1.5"; err == nil || err.Error() != want {
		t.Errorf("New = %v, want %s", err, want)
	}
}
