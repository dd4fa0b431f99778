package serviceconfig

import (
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
)

// Coverage. grpc-go ignores an unknown key wherever it is, and skips an
// entry without a name. Most unknown keys leave one field at its default;
// a few change which methods a policy covers:
//
//   - an unknown key in a name: {"services": "shop.Orders"} is the name {},
//     the default entry, so a 10-attempt policy meant for one service
//     applies to every method, health checks included;
//   - null in a name: grpc-go reads {"service": null} as {}, the default
//     entry, a null element of the name list too, and {"service":
//     "shop.Orders", "method": null} as the whole service: what a template
//     whose variable is unset writes;
//   - a key given twice where grpc-go merges the two values into a name
//     neither wrote: in a name ({"service": "shop.Orders", "service": ""}
//     is the default entry), "name" in an entry, "methodConfig" at the top
//     level (the second list is decoded into the first, element by
//     element);
//   - a key in an entry that most likely misspells "name", and an entry
//     whose name is absent, null or an empty list: the entry applies to
//     no method;
//   - a top-level key that most likely misspells "methodConfig", or any
//     unknown top-level key of a document without methodConfig: its
//     entries apply to no method.
//
// Parse refuses these by default and, with Lenient, accepts them as grpc-go
// does, with warnings of kind WarningCoverage.

// warningsOf returns the warnings of the decoded document w whose unknown
// keys are unknown: the unknown keys in document order, each of kind
// WarningCoverage when it changes which methods a policy covers, else
// WarningIgnoredKey; then, in entry order, a negative timeout (ignored)
// and the entries that select no method.
func warningsOf(w *wireConfig, unknown []unknownKey) []*Warning {
	root := schemaOf(reflect.TypeFor[wireConfig](), "the top level")
	entrySchema := childSchema(root, "methodConfig")
	nameSchema := childSchema(entrySchema, "name")
	var out []*Warning
	misspeltName := map[int]bool{} // entries with a key that misspells "name"
	for _, u := range unknown {
		var msg string
		switch {
		case u.note != noteUnknown:
			// A known key repeated or null, or a null element: a warning
			// only where it changes coverage.
			if msg = oddInCoverage(w, u, root, entrySchema, nameSchema); msg != "" {
				out = append(out, &Warning{Kind: WarningCoverage, Path: u.path(), Err: errors.New(msg)})
			}
			continue
		case u.in == nameSchema:
			msg = unknownInName(w, u)
		case u.in == entrySchema:
			if u.suggestion == "name" {
				i := u.indices[0]
				misspeltName[i] = true
				msg = misspeltNameKey(entry(w, i))
			}
		case u.in == root:
			msg = unknownAtTop(w, u)
		}
		if msg == "" {
			out = append(out, u.warning())
			continue
		}
		out = append(out, &Warning{Kind: WarningCoverage, Path: u.path(), Err: errors.New(msg)})
	}
	if w.MethodConfig == nil {
		return out
	}
	for i, m := range *w.MethodConfig {
		if t := m.Timeout.v; t != nil && *t < 0 && m.Name != nil {
			out = append(out, &Warning{Kind: WarningIgnoredKey, Path: index("methodConfig", i) + ".timeout", Err: errors.New(
				"is negative, which grpc-go ignores, and so does Parse: the methods get no timeout")})
		}
		if h := m.HedgingPolicy; h != nil && h.HedgingDelayQuantile.v != nil {
			if n := h.HedgingDelayMinSamples.v; n != nil && *n == 0 {
				// The Go field's 0 means the default; written out, it reads
				// as "no warm-up", which it is not.
				out = append(out, &Warning{Kind: WarningIgnoredKey, Path: index("methodConfig", i) + ".hedgingPolicy.hedgingDelayMinSamples",
					Err: errors.New("is 0, which means the default, " + strconv.Itoa(DefaultHedgingDelayMinSamples) +
						" observed attempts, not none: leave it out for the default, or give at least 1")})
			}
		}
		switch {
		case m.Name == nil && !misspeltName[i]:
			out = append(out, &Warning{Kind: WarningCoverage, Path: index("methodConfig", i), Err: errors.New(
				`has no "name", so it applies to no method (grpc-go skips it): ` +
					`give it "name": [{"service": "package.Service"}], or [{}] for every method`)})
		case m.Name != nil && len(*m.Name) == 0:
			out = append(out, &Warning{Kind: WarningCoverage, Path: index("methodConfig", i) + ".name", Err: errors.New(
				"is empty, so the entry applies to no method: list its methods, or write [{}] for every method")})
		}
	}
	return out
}

// childSchema returns the schema of the object that key holds in s.
func childSchema(s *schema, key string) *schema {
	f, _ := s.field(key)
	return f.child
}

// entry returns entry i of w's methodConfig, or nil when there is none
// (a repeated methodConfig key may have walked more entries than decoded).
func entry(w *wireConfig, i int) *wireMethod {
	if w.MethodConfig == nil || i >= len(*w.MethodConfig) {
		return nil
	}
	return &(*w.MethodConfig)[i]
}

// unknownInName words an unknown key of a name, with the name it leaves
// when that selects more methods than one: grpc-go ignores the key.
func unknownInName(w *wireConfig, u unknownKey) string {
	msg := `unknown key (a name holds only "service" and "method"):`
	if u.suggestion != "" {
		msg = `unknown key: did you mean "` + u.suggestion + `"?`
	}
	return msg + " grpc-go ignores it" + nameLeft(w, u.indices)
}

// nameLeft says, after a comma, what the name at indices ([entry, name])
// of w selects when that is more methods than one: the default entry, or a
// whole service; "" otherwise.
func nameLeft(w *wireConfig, indices []int) string {
	if len(indices) < 2 {
		return ""
	}
	m := entry(w, indices[0])
	if m == nil || m.Name == nil || indices[1] >= len(*m.Name) {
		return ""
	}
	n := (*m.Name)[indices[1]]
	switch svc, method := n.Service.v, n.Method.v; {
	case svc == "" && method == "":
		return ", which leaves the name {}, the default entry: its policies would apply to every method"
	case method == "":
		quoted, _ := json.Marshal(svc)
		return `, which leaves the name {"service": ` + string(quoted) +
			`}: its policies would apply to every method of ` + svc
	}
	return ""
}

// oddInCoverage words u, a known key repeated or null or a null element,
// when it changes which methods a policy covers, or returns "": null in a
// name or as a name, and a key given twice in a name, "name" given twice
// in an entry, "methodConfig" given twice. The schemas are those of the
// document, an entry and a name.
func oddInCoverage(w *wireConfig, u unknownKey, root, entrySchema, nameSchema *schema) string {
	f, _ := u.in.field(u.key)
	switch {
	case u.note == noteNullElement && u.in == nameSchema:
		return `null: grpc-go reads it as {}, the default entry: its policies would apply to every method ` +
			`(write {} if every method is meant)`
	case u.note == noteNull && u.in == nameSchema:
		meant := ` (write {} if every method is meant)`
		if f.name == "method" {
			meant = ` (leave "method" out if the whole service is meant)`
		}
		return `null: grpc-go reads it as ""` + nameLeft(w, u.indices) + meant
	case u.note != noteRepeated:
	case u.in == nameSchema:
		return "given twice: grpc-go keeps the last value" + nameLeft(w, u.indices)
	case u.in == entrySchema && f.name == "name", u.in == root && f.name == "methodConfig":
		return "given twice: grpc-go decodes the second list into the first, element by element " +
			"(their fields merge, and elements past the second list's end are dropped), " +
			"so the methods selected are not those either list names"
	}
	return ""
}

// misspeltNameKey words a key of entry m that most likely misspells
// "name"; m is nil when it could not be told.
func misspeltNameKey(m *wireMethod) string {
	const msg = `unknown key: did you mean "name"? grpc-go ignores it, `
	if m != nil && m.Name != nil {
		return msg + "so the methods it lists get none of the entry's policies"
	}
	return msg + "which leaves the entry without a name: it applies to no method (grpc-go skips it)"
}

// unknownAtTop words an unknown top-level key that changes coverage, or
// returns "" for one that does not.
func unknownAtTop(w *wireConfig, u unknownKey) string {
	switch {
	case u.suggestion == "methodConfig":
		return `unknown key: did you mean "methodConfig"? grpc-go ignores it, so the entries it holds apply to no method`
	case u.suggestion == "" && (w.MethodConfig == nil || len(*w.MethodConfig) == 0):
		return "unknown key, in a document without methodConfig: grpc-go ignores it, so if it holds " +
			"the method config, no method gets a policy"
	}
	return ""
}

// firstCoverage returns the first warning of kind WarningCoverage among
// warnings, as an *Error, or nil.
func firstCoverage(warnings []*Warning) error {
	for _, w := range warnings {
		if w.Kind == WarningCoverage {
			return &Error{Path: w.Path, Err: w.Err}
		}
	}
	return nil
}
