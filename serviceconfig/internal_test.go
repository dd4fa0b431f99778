package serviceconfig

import (
	"math"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    time.Duration
		wantErr string
	}{
		{name: "seconds", in: "1s", want: time.Second},
		{name: "fraction", in: "0.5s", want: 500 * time.Millisecond},
		{name: "fraction only", in: ".05s", want: 50 * time.Millisecond},
		{name: "empty fraction", in: "3.s", want: 3 * time.Second},
		{name: "nine digits", in: "1.000000001s", want: time.Second + 1},
		{name: "negative", in: "-100.700s", want: -100*time.Second - 700*time.Millisecond},
		{name: "negative fraction only", in: "-.001s", want: -time.Millisecond},
		{name: "plus sign", in: "+2s", want: 2 * time.Second},
		{name: "two minus signs", in: "--2s", want: 2 * time.Second},
		{name: "signed fraction", in: "1.-5s", want: 950 * time.Millisecond},
		{name: "largest Duration", in: "9223372036.854775807s", want: math.MaxInt64},
		{name: "past largest Duration", in: "9223372036.854775808s", want: math.MaxInt64},
		{name: "whole seconds past Duration", in: "9223372037s", want: math.MaxInt64},
		{name: "protobuf limit", in: "315576000000s", want: math.MaxInt64},
		{name: "smallest Duration", in: "-9223372036.854775808s", want: math.MinInt64},
		{name: "past smallest Duration", in: "-9223372036.854775809s", want: math.MinInt64},
		{name: "negative protobuf limit", in: "-315576000000s", want: math.MinInt64},
		{name: "past the protobuf limit", in: "315576000001s", wantErr: "out of range"},
		{name: "past the negative protobuf limit", in: "-315576000001s", wantErr: "out of range"},
		{name: "no unit", in: "1", wantErr: `must end in "s"`},
		{name: "minutes", in: "5m", wantErr: `must end in "s"`},
		{name: "milliseconds", in: "5ms", wantErr: "bad seconds"},
		{name: "upper-case unit", in: "5S", wantErr: `must end in "s"`},
		{name: "two dots", in: "5.3.2s", wantErr: "too many dots"},
		{name: "letters", in: "x.3s", wantErr: "bad seconds"},
		{name: "letters in fraction", in: "3.xs", wantErr: "bad fraction"},
		{name: "ten digits", in: "3.1234567890s", wantErr: "more than 9 digits"},
		{name: "dot only", in: ".s", wantErr: "no digits"},
		{name: "unit only", in: "s", wantErr: "no digits"},
		{name: "minus only", in: "-s", wantErr: "no digits"},
		{name: "empty", in: "", wantErr: `must end in "s"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseDuration(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseDuration(%q) = %v, %v, want error containing %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("parseDuration(%q) = %v, %v, want %v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestFormatDuration(t *testing.T) {
	tests := []struct {
		name string
		in   time.Duration
		want string
	}{
		{name: "zero", in: 0, want: "0s"},
		{name: "seconds", in: 2 * time.Second, want: "2s"},
		{name: "half", in: 500 * time.Millisecond, want: "0.5s"},
		{name: "millisecond", in: time.Millisecond, want: "0.001s"},
		{name: "nanosecond", in: 1, want: "0.000000001s"},
		{name: "minute and a bit", in: time.Minute + 250*time.Microsecond, want: "60.00025s"},
		{name: "negative", in: -1500 * time.Millisecond, want: "-1.5s"},
		{name: "largest", in: math.MaxInt64, want: "9223372036.854775807s"},
		{name: "smallest", in: math.MinInt64, want: "-9223372036.854775808s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := formatDuration(tt.in)
			if got != tt.want {
				t.Fatalf("formatDuration(%d) = %q, want %q", tt.in, got, tt.want)
			}
			back, err := parseDuration(got)
			if err != nil || back != tt.in {
				t.Fatalf("parseDuration(%q) = %v, %v, want %v", got, back, err, tt.in)
			}
		})
	}
}

func TestTruncMilli(t *testing.T) {
	tests := []struct {
		text string
		want float64
	}{
		{"0.1", 0.1},
		{"2", 2},
		{"1.0059", 1.005},
		{"1.005", 1.005}, // 1.005 × 1000 is 1004.999… in binary
		{"0.0009", 0},
		{"0.0019999", 0.001},
		{"12345e-4", 1.234},
		{"1.2345E+1", 12.345},
		{"1e-400", 0},
		{"123456.78912", 123456.789},
		{"-1.0059", -1.005},
		{"1e12", 1e12},
		{"1234567890123.4567", 1234567890123.4567},
	}
	for _, tt := range tests {
		f := mustFloat(t, tt.text)
		if got := truncMilli(tt.text, f); got != tt.want {
			t.Errorf("truncMilli(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

func mustFloat(t *testing.T, text string) float64 {
	t.Helper()
	var d decimal
	if err := d.UnmarshalJSON([]byte(text)); err != nil && !strings.Contains(text, "e-400") {
		t.Fatalf("decimal.UnmarshalJSON(%q) = %v", text, err)
	}
	return d.f
}

func TestPathAt(t *testing.T) {
	const doc = `{"methodConfig": [{"name": [{"service": "a"}]}, {"timeout": 1, "x": [true, {"y": null}]}]}`
	tests := []struct {
		at   string // the text whose first byte is looked up
		want string
	}{
		{`{"methodConfig"`, ""},
		{`[{"name"`, "methodConfig"},
		{`{"name"`, "methodConfig[0]"},
		{`[{"service"`, "methodConfig[0].name"},
		{`"a"`, "methodConfig[0].name[0].service"},
		{`1,`, "methodConfig[1].timeout"},
		{`true`, "methodConfig[1].x[0]"},
		{`null`, "methodConfig[1].x[1].y"},
	}
	for _, tt := range tests {
		pos := strings.Index(doc, tt.at)
		if got := pathAt([]byte(doc), int64(pos)); got != tt.want {
			t.Errorf("pathAt(doc, %d) at %q = %q, want %q", pos, tt.at, got, tt.want)
		}
	}
	// Broken and truncated input gives the deepest path reached.
	for _, in := range []string{``, `{`, `{"a": [`, `{"a": [1, {"b": "x`, `[}`, `{"a" 1}`, `{1}`, `"\`} {
		pathAt([]byte(in), int64(len(in)))
	}
	if got := pathAt([]byte(`{"a": [1, {"b": "x`), 100); got != "a[1].b" {
		t.Errorf(`pathAt({"a": [1, {"b": "x) = %q, want "a[1].b"`, got)
	}
}

// TestClosestKey pins the rule closest documents: an edit distance of 2
// at most (1 when either key has 3 letters or fewer), or one key a prefix
// of the other (4 letters or more each), compared in lower case; the
// nearest wins.
func TestClosestKey(t *testing.T) {
	s := &schema{fields: []schemaField{{name: "k"}, {name: "window"}, {name: "openDuration"},
		{name: "maxOpenDuration"}, {name: "failureRateThreshold", ours: true}}}
	tests := []struct{ key, want string }{
		{"K", "k"},
		{"kk", "k"},
		{"kkk", ""}, // distance 2 from a 1-letter key
		{"", ""},
		{"windw", "window"},
		{"WINDOWS", "window"},
		{"wndw", "window"},                 // distance 2
		{"wnds", ""},                       // distance 3
		{"openDurationMs", "openDuration"}, // a prefix, distance 2
		{"openDurationSeconds", "openDuration"},
		{"maxOpenDurationMs", "maxOpenDuration"}, // nearer than openDuration
		{"failureRate", "failureRateThreshold"},
		{"fail", "failureRateThreshold"},
		{"fai", ""},
	}
	for _, tt := range tests {
		if got, _ := closest(s, tt.key); got != tt.want {
			t.Errorf("closest(%q) = %q, want %q", tt.key, got, tt.want)
		}
	}
	if _, ours := closest(s, "failureRate"); !ours {
		t.Error(`closest("failureRate") is not reported as one of ours`)
	}
}

// TestClosestKeyCostsTheKeysLength pins that a long unknown key costs about
// its length, not its length times the number of keys it is compared with:
// the edit distance runs only against keys of about its length (a longer
// or shorter key is a prefix, whose distance is the difference in length,
// or too far). Before: closest on a 1 MiB key against a methodConfig
// entry's 9 keys allocated 36 MiB (a rune copy of the key for each) and a
// document with such a key parsed 35 times slower than grpc-go parses it;
// after, 1 MiB (the key in lower case).
func TestClosestKeyCostsTheKeysLength(t *testing.T) {
	s := schemaOf(reflect.TypeFor[wireMethod](), "a methodConfig entry")
	key := strings.Repeat("x", 1<<20)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	best, _ := closest(s, key)
	runtime.ReadMemStats(&after)
	if best != "" {
		t.Errorf("closest(1 MiB of x) = %q, want none", best)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 2<<20 {
		t.Errorf("closest on a 1 MiB key allocated %.1f MiB, want at most 2", float64(got)/(1<<20))
	}
}
