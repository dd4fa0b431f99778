package codes

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
)

// numCodes is the number of gRPC status codes, OK (0) to UNAUTHENTICATED (16).
const numCodes = 17

// Set is a set of gRPC status codes, one bit per code. The zero value is the
// empty set. Sets are values: every method returns a new Set and leaves the
// receiver alone.
type Set uint32

// All holds all 17 gRPC status codes.
const All Set = 1<<numCodes - 1

// The default sets. See the package documentation for the rules around them.
var (
	// DefaultRetryable is retried by default for every method: UNAVAILABLE and
	// RESOURCE_EXHAUSTED.
	DefaultRetryable = Of(codes.Unavailable, codes.ResourceExhausted)

	// DefaultBreakerFailures counts against a circuit breaker by default:
	// UNAVAILABLE, DEADLINE_EXCEEDED (of an attempt), INTERNAL, UNKNOWN,
	// DATA_LOSS and RESOURCE_EXHAUSTED.
	DefaultBreakerFailures = Of(codes.Unavailable, codes.DeadlineExceeded, codes.Internal,
		codes.Unknown, codes.DataLoss, codes.ResourceExhausted)

	// NeverRetried is never retried under the default rules.
	NeverRetried = Of(codes.OK, codes.Canceled, codes.InvalidArgument, codes.NotFound,
		codes.AlreadyExists, codes.PermissionDenied, codes.Unauthenticated,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented)
)

// Of returns the set of the given codes. Codes outside 0–16 are ignored.
func Of(cs ...codes.Code) Set {
	var s Set
	for _, c := range cs {
		s = s.With(c)
	}
	return s
}

// Has reports whether c is in s.
func (s Set) Has(c codes.Code) bool {
	return c < numCodes && s&(1<<c) != 0
}

// With returns s with c added. A code outside 0–16 leaves s unchanged.
func (s Set) With(c codes.Code) Set {
	if c >= numCodes {
		return s
	}
	return s | 1<<c
}

// Without returns s with c removed.
func (s Set) Without(c codes.Code) Set {
	if c >= numCodes {
		return s
	}
	return s &^ (1 << c)
}

// Union returns the codes in s or in t.
func (s Set) Union(t Set) Set { return s | t }

// IsEmpty reports whether s holds no code.
func (s Set) IsEmpty() bool { return s&All == 0 }

// Len returns the number of codes in s.
func (s Set) Len() int { return bits.OnesCount32(uint32(s & All)) }

// Codes returns the codes in s in ascending order.
func (s Set) Codes() []codes.Code {
	out := make([]codes.Code, 0, s.Len())
	for c := codes.Code(0); c < numCodes; c++ {
		if s.Has(c) {
			out = append(out, c)
		}
	}
	return out
}

// String returns the names of the codes in s in ascending order, joined by
// "|", as in "UNAVAILABLE|RESOURCE_EXHAUSTED"; the empty set is "{}".
func (s Set) String() string {
	if s.IsEmpty() {
		return "{}"
	}
	var b strings.Builder
	for _, c := range s.Codes() {
		if b.Len() > 0 {
			b.WriteByte('|')
		}
		b.WriteString(Name(c))
	}
	return b.String()
}

// MarshalJSON writes s as a JSON array of code names, the form of a service
// config's retryableStatusCodes.
func (s Set) MarshalJSON() ([]byte, error) {
	names := make([]string, 0, s.Len())
	for _, c := range s.Codes() {
		names = append(names, Name(c))
	}
	return json.Marshal(names)
}

// UnmarshalJSON reads a JSON array whose elements are code names (any case)
// or numbers 0–16, as strings or JSON numbers. null leaves s unchanged.
func (s *Set) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return errors.New("must be an array of status codes")
	}
	var out Set
	for i, r := range raw {
		c, err := parseJSONCode(r)
		if err != nil {
			return fmt.Errorf("[%d]: %w", i, err)
		}
		out = out.With(c)
	}
	*s = out
	return nil
}

func parseJSONCode(r json.RawMessage) (codes.Code, error) {
	var name string
	if err := json.Unmarshal(r, &name); err == nil {
		return Parse(name)
	}
	var n json.Number
	dec := json.NewDecoder(strings.NewReader(string(r)))
	dec.UseNumber()
	if err := dec.Decode(&n); err != nil {
		return 0, fmt.Errorf("%s is not a status code name or number", r)
	}
	return Parse(n.String())
}

// names is indexed by code: the upper-case names gRFC A6 and the service
// config use.
var names = [numCodes]string{
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
	"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
	"FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
	"UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
}

// Name returns the service-config name of c, such as "UNAVAILABLE", or
// "CODE(n)" for a code outside 0–16.
func Name(c codes.Code) string {
	if c < numCodes {
		return names[c]
	}
	return "CODE(" + strconv.FormatUint(uint64(c), 10) + ")"
}

// ErrUnknownCode is wrapped by every error of [Parse] and [ParseSet].
var ErrUnknownCode = errors.New("unknown status code")

// Parse returns the code named by s: a name such as "UNAVAILABLE", matched
// case-insensitively as gRFC A6 requires (ASCII letters only: the Kelvin sign
// is not a "K"), or a decimal number from 0 to 16. Surrounding spaces are not
// allowed.
func Parse(s string) (codes.Code, error) {
	if s != "" && s[0] >= '0' && s[0] <= '9' {
		n, err := strconv.ParseUint(s, 10, 8)
		if err != nil || n >= numCodes {
			return 0, fmt.Errorf("%w %q: numbers must be 0 to 16", ErrUnknownCode, s)
		}
		return codes.Code(n), nil
	}
	for c, name := range names {
		if equalFoldASCII(s, name) {
			return codes.Code(c), nil
		}
	}
	return 0, fmt.Errorf("%w %q", ErrUnknownCode, s)
}

// ParseSet returns the set of the codes named in list, each as [Parse]
// accepts it. The error names the first bad element by its index.
func ParseSet(list []string) (Set, error) {
	var s Set
	for i, name := range list {
		c, err := Parse(name)
		if err != nil {
			return 0, fmt.Errorf("[%d]: %w", i, err)
		}
		s = s.With(c)
	}
	return s, nil
}

// equalFoldASCII reports whether s and upper, which holds no lower-case
// letter, are equal when ASCII letters in s are upper-cased. Unlike
// strings.EqualFold it does not fold non-ASCII runes such as the Kelvin sign
// onto ASCII letters.
func equalFoldASCII(s, upper string) bool {
	if len(s) != len(upper) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		if c != upper[i] {
			return false
		}
	}
	return true
}
