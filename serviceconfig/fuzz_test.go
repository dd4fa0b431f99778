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

// FuzzParse checks that Parse never panics, that its errors are *Error, and
// that what it accepts validates and survives parse → marshal → parse.
func FuzzParse(f *testing.F) {
	for _, c := range parseCases() {
		f.Add([]byte(c.doc))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := serviceconfig.Parse(data)
		if err != nil {
			var e *serviceconfig.Error
			if !errors.As(err, &e) || c != nil || !strings.HasPrefix(err.Error(), "serviceconfig: ") {
				t.Fatalf("Parse(%q) = %v, %T %v, want nil, *serviceconfig.Error", data, c, err, err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse(%q).Validate() = %v, want nil", data, err)
		}
		for _, m := range []string{testMethod, "/a/b", "/", ""} {
			c.Lookup(m)
		}
		checkRoundTrip(t, c)
	})
}

// FuzzParseMatchesGRPC checks that Parse and grpc-go's own parser give the
// same verdict, but for the differences the package documents: our
// extension blocks and the gRFC A6 corrections (hedgingPolicy,
// retryThrottling, case-insensitive status codes), and load-balancing
// policies grpc-go looks up in its registry.
func FuzzParseMatchesGRPC(f *testing.F) {
	for _, c := range parseCases() {
		f.Add([]byte(c.doc))
	}
	p := newGRPCParser(f, 0)
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := serviceconfig.Parse(data)
		_, grpcErr := p.parse(string(data), testMethod)
		switch {
		case (err == nil) == (grpcErr == nil):
		case err != nil:
			var e *serviceconfig.Error
			if errors.As(err, &e) && (documentedRejection(e.Path) || ourKeyRejected(e)) {
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
	for _, p := range []string{".hedgingPolicy", ".circuitBreaker", ".bulkhead", ".perAttemptRecvTimeout", ".jitter"} {
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
