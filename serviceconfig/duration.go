package serviceconfig

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"time"
)

// maxProtoSeconds is the largest number of seconds a google.protobuf.Duration
// may hold (10,000 years).
const maxProtoSeconds = 315_576_000_000

// duration is a time.Duration read from the protobuf JSON form of a
// google.protobuf.Duration: a JSON string of decimal seconds with the suffix
// "s", such as "1s", "0.5s", ".05s" or "-1.5s".
//
// Its UnmarshalJSON accepts and rejects exactly what grpc-go v1.85 accepts
// for the durations of a service config (internal/serviceconfig.Duration),
// quirks included, so that both read a document alike:
//   - the value must be a JSON string; null is the empty string and so
//     invalid (a pointer field turns null into "absent" before this runs);
//   - the string must end in a lower-case "s" and hold one leading "-" at
//     most, whole seconds, and up to 9 fraction digits after a ".";
//   - like grpc-go it parses both parts with strconv.ParseInt, so a sign
//     after the "-" or after the "." is taken as written ("+1s" is 1s,
//     "1.-5s" is 0.5s);
//   - more than 315,576,000,000 seconds (the protobuf limit, checked before
//     the leading "-" is applied) is an error; values past what
//     time.Duration holds (about 292 years) are clamped to its limits.
type duration time.Duration

// UnmarshalJSON reads b as described on the type.
func (d *duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return errors.New(`must be a duration string such as "0.5s", not null`)
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		msg := `must be a duration string such as "0.5s", not ` + jsonKind(b)
		var secs float64
		if json.Unmarshal(b, &secs) == nil && math.Abs(secs) < maxProtoSeconds {
			msg += `: write "` + formatDuration(time.Duration(secs*float64(time.Second))) + `"`
		}
		return errors.New(msg)
	}
	v, err := parseDuration(s)
	if err != nil {
		return goForm(s, err)
	}
	*d = duration(v)
	return nil
}

// goForm returns the error for s, which parseDuration refused with err,
// with the form to write when s is a Go duration such as "100ms" or
// "1m30s" (a service config takes seconds only), or a bare number.
func goForm(s string, err error) error {
	q := strconv.Quote(s)
	if n := strings.TrimPrefix(s, "-"); n != "" && strings.Trim(n, "0123456789") == "" {
		return errors.New(q + ` is not a duration: it needs its unit: write "` + s + `s" for seconds`)
	}
	if protoShaped(s) {
		return err
	}
	d, perr := time.ParseDuration(s)
	if perr != nil {
		return err
	}
	return errors.New(q + ` is not a duration: a service config takes seconds, so write "` + formatDuration(d) + `"`)
}

// protoShaped reports whether s has the shape of a protobuf duration
// (digits, one dot at most, a trailing "s"), right or wrong in its detail.
func protoShaped(s string) bool {
	s, ok := strings.CutSuffix(strings.TrimPrefix(s, "-"), "s")
	if !ok || strings.Count(s, ".") > 1 {
		return false
	}
	return strings.Trim(s, "0123456789.") == ""
}

// parseDuration parses s, the content of a protobuf JSON duration string, as
// the type duration documents.
func parseDuration(s string) (time.Duration, error) {
	q := strconv.Quote(s)
	if !strings.HasSuffix(s, "s") {
		return 0, errors.New(q + ` is not a duration: it must end in "s", such as "0.5s"`)
	}
	neg := false
	if s[0] == '-' {
		neg = true
		s = s[1:]
	}
	parts := strings.SplitN(s[:len(s)-1], ".", 3)
	if len(parts) > 2 {
		return 0, errors.New(q + " is not a duration: too many dots")
	}
	hasDigits := false
	var sec, ns int64
	if parts[0] != "" {
		var err error
		if sec, err = strconv.ParseInt(parts[0], 10, 64); err != nil {
			return 0, errors.New(q + " is not a duration: bad seconds")
		}
		if sec > maxProtoSeconds {
			return 0, errors.New(q + " is out of range: at most 315576000000s")
		}
		hasDigits = true
	}
	if len(parts) == 2 && parts[1] != "" {
		frac := parts[1]
		if len(frac) > 9 {
			return 0, errors.New(q + " is not a duration: more than 9 digits after the dot")
		}
		var err error
		if ns, err = strconv.ParseInt(frac, 10, 64); err != nil {
			return 0, errors.New(q + " is not a duration: bad fraction")
		}
		for i := 9; i > len(frac); i-- {
			ns *= 10
		}
		hasDigits = true
	}
	if !hasDigits {
		return 0, errors.New(q + " is not a duration: no digits")
	}
	if neg {
		sec, ns = -sec, -ns
	}

	// The limits of time.Duration in whole seconds and the nanoseconds left.
	const (
		maxSeconds = math.MaxInt64 / int64(time.Second)
		maxNanos   = math.MaxInt64 % int64(time.Second)
		minSeconds = math.MinInt64 / int64(time.Second)
		minNanos   = math.MinInt64 % int64(time.Second)
	)
	switch {
	case sec > maxSeconds || sec == maxSeconds && ns >= maxNanos:
		return math.MaxInt64, nil
	case sec < minSeconds || sec == minSeconds && ns <= minNanos:
		return math.MinInt64, nil
	}
	return time.Duration(sec*int64(time.Second) + ns), nil
}

// formatDuration writes d in protobuf JSON form with no more fraction digits
// than it needs: "1s", "0.5s", "0.000000001s", "-1.5s". parseDuration reads
// the result back to d for every d.
func formatDuration(d time.Duration) string {
	neg := d < 0
	// Work on the magnitude as uint64 so that math.MinInt64 does not overflow.
	u := uint64(d)
	if neg {
		u = -u
	}
	sec, ns := u/uint64(time.Second), u%uint64(time.Second)
	b := make([]byte, 0, 32)
	if neg {
		b = append(b, '-')
	}
	b = strconv.AppendUint(b, sec, 10)
	if ns != 0 {
		frac := strconv.AppendUint(make([]byte, 0, 9), ns, 10)
		b = append(b, '.')
		for range 9 - len(frac) {
			b = append(b, '0')
		}
		b = append(b, strings.TrimRight(string(frac), "0")...)
	}
	return string(append(b, 's'))
}
