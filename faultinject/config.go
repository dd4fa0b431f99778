package faultinject

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Config is a fault-injection configuration: the faults, and the seed of
// their random draws. The zero value injects nothing.
type Config struct {
	// Seed seeds the generator that decides which calls a partial fault
	// hits; one seed and one sequence of calls give one sequence of faults.
	Seed uint64
	// Faults are tried in order; the first whose Methods match a call
	// applies to it.
	Faults []Fault
}

// Fault is what happens to the calls of some methods. At least one of
// Delay, Abort, StreamAbort and Outage is set.
type Fault struct {
	// Methods are full methods ("/pkg.Service/Method", the leading slash
	// optional) or services ("pkg.Service"). Empty matches every method.
	Methods []string
	// Delay, when set, delays matching calls before anything else.
	Delay *Delay
	// Abort, when set, fails matching calls before the handler runs.
	Abort *Abort
	// StreamAbort, when set, fails matching streams part-way.
	StreamAbort *StreamAbort
	// Outage, when set, fails every matching call during recurring windows.
	Outage *Outage
}

// Outage fails every matching call, before the handler runs, during the
// first Duration of every period of length Every, counted from the
// Injector's creation: with Every 10s and Duration 2s, calls fail from 0 s
// to 2 s, from 10 s to 12 s, and so on. It is checked after Delay and
// before Abort.
type Outage struct {
	// Every is the period; it must be positive.
	Every time.Duration
	// Duration is the outage at the start of each period, in (0, Every].
	Duration time.Duration
	// Code is the status code; it must not be OK.
	Code codes.Code
}

// Delay delays a call by a fixed time, or until the call's context ends.
type Delay struct {
	// Fixed is the delay; it must not be negative.
	Fixed time.Duration
	// Rate is the fraction of matching calls delayed, in (0, 1]; 0 means
	// every call.
	Rate float64
}

// Abort fails a call with a status code, and optionally a retry hint.
type Abort struct {
	// Code is the status code; it must not be OK.
	Code codes.Code
	// Rate is the fraction of matching calls aborted, in (0, 1]; 0 means
	// every call.
	Rate float64
	// Pushback, when positive, sends grpc-retry-pushback-ms with the
	// failure (gRFC A6): retry after this long. When negative it sends a
	// negative pushback, which tells the client not to retry.
	Pushback time.Duration
	// RetryDelay, when positive, adds a google.rpc.RetryInfo detail with
	// this retry delay to the status.
	RetryDelay time.Duration
}

// StreamAbort fails a stream once a number of messages have passed.
type StreamAbort struct {
	// AfterMessages is the number of messages, sent and received together,
	// that pass before the stream fails; at least 1.
	AfterMessages int
	// Code is the status code; it must not be OK.
	Code codes.Code
	// Rate is the fraction of matching streams aborted, in (0, 1]; 0 means
	// every stream.
	Rate float64
}

// Error is a configuration error: the JSON path of the bad value (or the Go
// field path, for a Config built in code) and what is wrong with it.
type Error struct {
	Path string // e.g. "faults[1].abort.grpcStatus"
	Err  error
}

// Error returns "faultinject: ", the path when there is one, and what is
// wrong.
func (e *Error) Error() string {
	if e.Path == "" {
		return "faultinject: " + e.Err.Error()
	}
	return "faultinject: " + e.Path + ": " + e.Err.Error()
}

// Unwrap returns what is wrong, for errors.Is and errors.As.
func (e *Error) Unwrap() error { return e.Err }

func errAt(path, format string, args ...any) error {
	return &Error{Path: path, Err: fmt.Errorf(format, args...)}
}

// Validate reports the first invalid value of c, as an *Error naming its
// path in the JSON form.
func (c *Config) Validate() error {
	for i, f := range c.Faults {
		p := fmt.Sprintf("faults[%d]", i)
		if f.Delay == nil && f.Abort == nil && f.StreamAbort == nil && f.Outage == nil {
			return errAt(p, "needs delay, abort, streamAbort or outage")
		}
		for j, m := range f.Methods {
			if _, _, err := splitName(m); err != nil {
				return errAt(fmt.Sprintf("%s.methods[%d]", p, j), "%v", err)
			}
		}
		if d := f.Delay; d != nil {
			if d.Fixed < 0 {
				return errAt(p+".delay.fixedDelay", "must not be negative, got %v", d.Fixed)
			}
			if err := checkRate(d.Rate); err != nil {
				return errAt(p+".delay.percentage", "%v", err)
			}
		}
		if a := f.Abort; a != nil {
			if a.Code == codes.OK || a.Code > codes.Unauthenticated {
				return errAt(p+".abort.grpcStatus", "must be a failure code 1 to 16, got %d", a.Code)
			}
			if err := checkRate(a.Rate); err != nil {
				return errAt(p+".abort.percentage", "%v", err)
			}
			if a.RetryDelay < 0 {
				return errAt(p+".abort.retryDelay", "must not be negative, got %v", a.RetryDelay)
			}
		}
		if s := f.StreamAbort; s != nil {
			if s.AfterMessages < 1 {
				return errAt(p+".streamAbort.afterMessages", "must be at least 1, got %d", s.AfterMessages)
			}
			if s.Code == codes.OK || s.Code > codes.Unauthenticated {
				return errAt(p+".streamAbort.grpcStatus", "must be a failure code 1 to 16, got %d", s.Code)
			}
			if err := checkRate(s.Rate); err != nil {
				return errAt(p+".streamAbort.percentage", "%v", err)
			}
		}
		if o := f.Outage; o != nil {
			if o.Every <= 0 {
				return errAt(p+".outage.every", "must be positive, got %v", o.Every)
			}
			if o.Duration <= 0 || o.Duration > o.Every {
				return errAt(p+".outage.duration", "must be in (0, every=%v], got %v", o.Every, o.Duration)
			}
			if o.Code == codes.OK || o.Code > codes.Unauthenticated {
				return errAt(p+".outage.grpcStatus", "must be a failure code 1 to 16, got %d", o.Code)
			}
		}
	}
	return nil
}

func checkRate(r float64) error {
	if !(r >= 0 && r <= 1) { // also refuses NaN
		return fmt.Errorf("must be a fraction from 0 to 1, got %v", r)
	}
	return nil
}

// splitName splits a method name of a fault into service and method (empty
// for a whole service), or says what is wrong with it, quoting it.
func splitName(name string) (service, method string, err error) {
	n := strings.TrimPrefix(name, "/")
	if n == "" {
		return "", "", errors.New(`empty method name: want "/pkg.Service/Method" or "pkg.Service"`)
	}
	service, method, found := strings.Cut(n, "/")
	if found && method == "" {
		return "", "", fmt.Errorf("%q ends in a slash: want \"/pkg.Service/Method\" or \"pkg.Service\"", name)
	}
	var e *serviceconfig.Error
	if err := (serviceconfig.Name{Service: service, Method: method}).Validate(); errors.As(err, &e) {
		return "", "", fmt.Errorf("%q: %w", name, e.Err)
	}
	return service, method, nil
}

// The JSON form, in the style of Envoy's fault filter.
type jsonConfig struct {
	Seed   uint64      `json:"seed"`
	Faults []jsonFault `json:"faults"`
}

type jsonFault struct {
	Methods     []string         `json:"methods"`
	Delay       *jsonDelay       `json:"delay"`
	Abort       *jsonAbort       `json:"abort"`
	StreamAbort *jsonStreamAbort `json:"streamAbort"`
	Outage      *jsonOutage      `json:"outage"`
}

type jsonOutage struct {
	Every      *string         `json:"every"`
	Duration   *string         `json:"duration"`
	GRPCStatus json.RawMessage `json:"grpcStatus"`
}

type jsonDelay struct {
	FixedDelay *string         `json:"fixedDelay"`
	Percentage *jsonPercentage `json:"percentage"`
}

type jsonAbort struct {
	GRPCStatus json.RawMessage `json:"grpcStatus"`
	Percentage *jsonPercentage `json:"percentage"`
	Pushback   *string         `json:"pushback"`
	RetryDelay *string         `json:"retryDelay"`
}

type jsonStreamAbort struct {
	AfterMessages int             `json:"afterMessages"`
	GRPCStatus    json.RawMessage `json:"grpcStatus"`
	Percentage    *jsonPercentage `json:"percentage"`
}

// jsonPercentage is Envoy's FractionalPercent.
type jsonPercentage struct {
	Numerator   uint32 `json:"numerator"`
	Denominator string `json:"denominator"` // HUNDRED (default), TEN_THOUSAND, MILLION
}

// Parse decodes and validates a JSON configuration. Unknown keys are
// errors (a misspelt key would otherwise silently inject nothing); every
// error is an *Error naming the JSON path of the value at fault, such as
// "faultinject: faults[0].abort.percentage.denominator: ...".
func Parse(data []byte) (Config, error) {
	if err := checkJSON(data, reflect.TypeFor[jsonConfig](), ""); err != nil {
		return Config{}, err
	}
	var j jsonConfig
	if err := json.Unmarshal(data, &j); err != nil { // cannot fail after checkJSON
		return Config{}, &Error{Err: err}
	}
	c := Config{Seed: j.Seed}
	for i, jf := range j.Faults {
		f, err := jf.fault(fmt.Sprintf("faults[%d]", i))
		if err != nil {
			return Config{}, err
		}
		c.Faults = append(c.Faults, f)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// checkJSON checks that data is one JSON value that decodes into a value
// of type t, with no key that t does not know, and returns an *Error at
// the path of the first value that does not: its keys matched to t's json
// tags as encoding/json matches them (exactly, else without regard to
// case).
func checkJSON(data []byte, t reflect.Type, path string) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return &Error{Path: path, Err: fmt.Errorf("invalid JSON at byte %d: %v", se.Offset, se)}
		}
		return &Error{Path: path, Err: err}
	}
	if path == "" && dec.More() {
		return &Error{Err: fmt.Errorf("trailing data after the configuration, at byte %d", dec.InputOffset())}
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	raw = bytes.TrimSpace(raw)
	switch {
	case string(raw) == "null":
		return nil
	case t.Kind() == reflect.Struct:
		return checkObject(raw, t, path)
	case t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Uint8:
		var elems []json.RawMessage
		if json.Unmarshal(raw, &elems) != nil {
			return &Error{Path: path, Err: fmt.Errorf("must be an array, not %s", jsonKind(raw))}
		}
		for i, e := range elems {
			if err := checkJSON(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := json.Unmarshal(raw, reflect.New(t).Interface()); err != nil {
		if k := jsonKind(raw); k != "a number" || t.Kind() == reflect.String {
			return &Error{Path: path, Err: fmt.Errorf("cannot be %s", k)}
		}
		return &Error{Path: path, Err: fmt.Errorf("must be a whole number that fits %s, not %s", t, raw)}
	}
	return nil
}

// checkObject checks the members of the JSON object raw against the
// struct type t, in document order.
func checkObject(raw []byte, t reflect.Type, path string) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return &Error{Path: path, Err: fmt.Errorf("must be an object, not %s", jsonKind(raw))}
	}
	var known []string
	for i := range t.NumField() {
		known = append(known, strings.Split(t.Field(i).Tag.Get("json"), ",")[0])
	}
	for dec.More() {
		tok, err := dec.Token()
		k, _ := tok.(string)
		var v json.RawMessage
		if err != nil || dec.Decode(&v) != nil {
			return &Error{Path: path, Err: errors.New("invalid JSON")} // cannot happen: raw decoded
		}
		i := slices.Index(known, k)
		if i < 0 {
			i = slices.IndexFunc(known, func(n string) bool { return strings.EqualFold(n, k) })
		}
		p := k
		if path != "" {
			p = path + "." + k
		}
		if i < 0 {
			return &Error{Path: p, Err: fmt.Errorf("unknown key; the keys here are %s", strings.Join(known, ", "))}
		}
		if err := checkJSON(v, t.Field(i).Type, p); err != nil {
			return err
		}
	}
	return nil
}

// jsonKind names the kind of the JSON value b, for errors.
func jsonKind(b []byte) string {
	switch b[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "true or false"
	case 'n':
		return "null"
	}
	return "a number"
}

func (jf *jsonFault) fault(p string) (Fault, error) {
	f := Fault{Methods: jf.Methods}
	var err error
	if jd := jf.Delay; jd != nil {
		f.Delay = &Delay{}
		if jd.FixedDelay == nil {
			return f, errAt(p+".delay.fixedDelay", "is required")
		}
		if f.Delay.Fixed, err = parseDuration(*jd.FixedDelay); err != nil {
			return f, errAt(p+".delay.fixedDelay", "%v", err)
		}
		if f.Delay.Rate, err = jd.Percentage.rate(); err != nil {
			return f, errAt(p+".delay.percentage", "%v", err)
		}
	}
	if ja := jf.Abort; ja != nil {
		f.Abort = &Abort{}
		if f.Abort.Code, err = parseCode(ja.GRPCStatus); err != nil {
			return f, errAt(p+".abort.grpcStatus", "%v", err)
		}
		if f.Abort.Rate, err = ja.Percentage.rate(); err != nil {
			return f, errAt(p+".abort.percentage", "%v", err)
		}
		if ja.Pushback != nil {
			if f.Abort.Pushback, err = parseSignedDuration(*ja.Pushback); err != nil {
				return f, errAt(p+".abort.pushback", "%v", err)
			}
		}
		if ja.RetryDelay != nil {
			if f.Abort.RetryDelay, err = parseDuration(*ja.RetryDelay); err != nil {
				return f, errAt(p+".abort.retryDelay", "%v", err)
			}
		}
	}
	if js := jf.StreamAbort; js != nil {
		f.StreamAbort = &StreamAbort{AfterMessages: js.AfterMessages}
		if f.StreamAbort.Code, err = parseCode(js.GRPCStatus); err != nil {
			return f, errAt(p+".streamAbort.grpcStatus", "%v", err)
		}
		if f.StreamAbort.Rate, err = js.Percentage.rate(); err != nil {
			return f, errAt(p+".streamAbort.percentage", "%v", err)
		}
	}
	if jo := jf.Outage; jo != nil {
		f.Outage = &Outage{}
		for _, d := range []struct {
			name string
			src  *string
			dst  *time.Duration
		}{{"every", jo.Every, &f.Outage.Every}, {"duration", jo.Duration, &f.Outage.Duration}} {
			if d.src == nil {
				return f, errAt(p+".outage."+d.name, "is required")
			}
			if *d.dst, err = parseDuration(*d.src); err != nil {
				return f, errAt(p+".outage."+d.name, "%v", err)
			}
		}
		if f.Outage.Code, err = parseCode(jo.GRPCStatus); err != nil {
			return f, errAt(p+".outage.grpcStatus", "%v", err)
		}
	}
	return f, nil
}

// rate converts a FractionalPercent to a fraction; absent means 1.
func (p *jsonPercentage) rate() (float64, error) {
	if p == nil {
		return 0, nil
	}
	var den float64
	switch p.Denominator {
	case "", "HUNDRED":
		den = 100
	case "TEN_THOUSAND":
		den = 10_000
	case "MILLION":
		den = 1_000_000
	default:
		return 0, fmt.Errorf("denominator %q: want HUNDRED, TEN_THOUSAND or MILLION", p.Denominator)
	}
	if p.Numerator == 0 {
		return 0, errors.New("numerator 0 never injects: remove the fault instead")
	}
	// As in Envoy, a numerator above the denominator means every call.
	return min(float64(p.Numerator)/den, 1), nil
}

// parseCode accepts a code name (case-insensitive, as gRFC A6) or number.
func parseCode(raw json.RawMessage) (codes.Code, error) {
	if len(raw) == 0 {
		return 0, errors.New("is required")
	}
	var s string
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, err
		}
	} else {
		s = string(raw)
	}
	c, err := rescodes.Parse(s)
	if err != nil {
		return 0, err
	}
	if c == codes.OK {
		return 0, errors.New("OK is not a failure")
	}
	return c, nil
}

// parseDuration accepts a protobuf-JSON duration such as "0.05s", or any
// time.ParseDuration string such as "50ms"; it must not be negative.
func parseDuration(s string) (time.Duration, error) {
	d, err := parseSignedDuration(s)
	if err == nil && d < 0 {
		err = fmt.Errorf("%q must not be negative", s)
	}
	return d, err
}

func parseSignedDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration such as \"0.05s\"", s)
	}
	return d, nil
}
