package codes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    codes.Code
		wantErr bool
	}{
		{"UNAVAILABLE", codes.Unavailable, false},
		{"unavailable", codes.Unavailable, false},
		{"Resource_Exhausted", codes.ResourceExhausted, false},
		{"OK", codes.OK, false},
		{"cancelled", codes.Canceled, false},
		{"0", codes.OK, false},
		{"14", codes.Unavailable, false},
		{"16", codes.Unauthenticated, false},
		{"17", 0, true},
		{"-1", 0, true},
		{"1.0", 0, true},
		{"", 0, true},
		{" UNAVAILABLE", 0, true},
		{"CANCELED", 0, true}, // the service config spells it CANCELLED
		{"Unavailable ", 0, true},
		{"999999999999999999999", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Parse(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("Parse(%q) = %v, %v, want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrUnknownCode) {
				t.Errorf("Parse(%q) error %v does not wrap ErrUnknownCode", tt.in, err)
			}
		})
	}
}

func TestNameRoundTripsEveryCode(t *testing.T) {
	for c := codes.Code(0); c < numCodes; c++ {
		if got, err := Parse(Name(c)); err != nil || got != c {
			t.Errorf("Parse(Name(%d)) = %v, %v, want %v", c, got, err, c)
		}
	}
	if got := Name(99); got != "CODE(99)" {
		t.Errorf("Name(99) = %q, want CODE(99)", got)
	}
}

func TestParseSetNamesTheBadElement(t *testing.T) {
	_, err := ParseSet([]string{"UNAVAILABLE", "aborted", "BOGUS"})
	if err == nil || err.Error() != `[2]: unknown status code "BOGUS"` {
		t.Fatalf("ParseSet error = %v, want [2]: unknown status code \"BOGUS\"", err)
	}
	s, err := ParseSet([]string{"UNAVAILABLE", "10", "unavailable"})
	if err != nil || s != Of(codes.Unavailable, codes.Aborted) {
		t.Fatalf("ParseSet = %v, %v, want UNAVAILABLE|ABORTED", s, err)
	}
}

func TestSetOperations(t *testing.T) {
	s := Of(codes.Unavailable, codes.Internal, codes.Code(40))
	if !s.Has(codes.Unavailable) || s.Has(codes.OK) || s.Has(codes.Code(40)) {
		t.Errorf("Of(UNAVAILABLE, INTERNAL, 40).Has gives wrong answers: %v", s)
	}
	if got := s.Len(); got != 2 {
		t.Errorf("Len() = %d, want 2", got)
	}
	if got := s.String(); got != "INTERNAL|UNAVAILABLE" {
		t.Errorf("String() = %q, want INTERNAL|UNAVAILABLE", got)
	}
	if got := s.Without(codes.Internal).With(codes.OK); got != Of(codes.OK, codes.Unavailable) {
		t.Errorf("Without/With = %v, want OK|UNAVAILABLE", got)
	}
	if got := Set(0).String(); got != "{}" {
		t.Errorf("empty String() = %q, want {}", got)
	}
	if All.Len() != 17 || !All.Has(codes.Unauthenticated) {
		t.Errorf("All = %v, want the 17 codes", All)
	}
	if DefaultRetryable != Of(codes.Unavailable, codes.ResourceExhausted) {
		t.Errorf("DefaultRetryable = %v", DefaultRetryable)
	}
	if DefaultRetryable&NeverRetried != 0 {
		t.Errorf("DefaultRetryable and NeverRetried overlap: %v", DefaultRetryable&NeverRetried)
	}
}

func TestSetJSON(t *testing.T) {
	tests := []struct {
		in      string
		want    Set
		wantErr string
	}{
		{`["UNAVAILABLE", "aborted"]`, Of(codes.Unavailable, codes.Aborted), ""},
		{`[14, "8"]`, Of(codes.Unavailable, codes.ResourceExhausted), ""},
		{`[]`, 0, ""},
		{`[17]`, 0, `[0]: unknown status code "17": numbers must be 0 to 16`},
		{`["UNAVAILABLE", true]`, 0, "[1]: true is not a status code name or number"},
		{`"UNAVAILABLE"`, 0, "must be an array of status codes"},
		{`[1.5]`, 0, `[0]: unknown status code "1.5": numbers must be 0 to 16`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var s Set
			err := json.Unmarshal([]byte(tt.in), &s)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("Unmarshal(%s) error = %v, want %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil || s != tt.want {
				t.Fatalf("Unmarshal(%s) = %v, %v, want %v", tt.in, s, err, tt.want)
			}
			out, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			var back Set
			if err := json.Unmarshal(out, &back); err != nil || back != s {
				t.Errorf("round trip %s -> %v, %v, want %v", out, back, err, s)
			}
		})
	}
}

func TestFromHTTPStatus(t *testing.T) {
	tests := []struct {
		http int
		want codes.Code
	}{
		{200, codes.OK}, {204, codes.OK},
		{400, codes.Internal}, {401, codes.Unauthenticated}, {403, codes.PermissionDenied},
		{404, codes.Unimplemented}, {429, codes.Unavailable}, {502, codes.Unavailable},
		{503, codes.Unavailable}, {504, codes.Unavailable},
		{301, codes.Unknown}, {409, codes.Unknown}, {500, codes.Unknown}, {0, codes.Unknown},
	}
	for _, tt := range tests {
		if got := FromHTTPStatus(tt.http); got != tt.want {
			t.Errorf("FromHTTPStatus(%d) = %v, want %v", tt.http, got, tt.want)
		}
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"nil", nil, codes.OK},
		{"status", status.Error(codes.NotFound, "x"), codes.NotFound},
		{"canceled", context.Canceled, codes.Canceled},
		{"wrapped deadline", fmt.Errorf("call: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{"wrapped status", fmt.Errorf("call: %w", status.Error(codes.Aborted, "x")), codes.Aborted},
		{"plain", errors.New("boom"), codes.Unknown},
	}
	for _, tt := range tests {
		if got := Classify(tt.err); got != tt.want {
			t.Errorf("Classify(%s) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"UNAVAILABLE", "14", "", "17", "aborted", "0x1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Parse(s)
		if err != nil {
			return
		}
		if c >= numCodes {
			t.Fatalf("Parse(%q) = %d, outside 0-16", s, c)
		}
	})
}
