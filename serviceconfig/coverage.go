package serviceconfig

import (
	"encoding/json"
	"errors"
	"reflect"
)

// Coverage. grpc-go ignores an unknown key wherever it is, and skips an
// entry without a name. Most unknown keys leave one field at its default;
// a few change which methods a policy covers:
//
//   - an unknown key in a name: {"services": "shop.Orders"} is the name {},
//     the default entry, so a 10-attempt policy meant for one service
//     applies to every method, health checks included;
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
// WarningIgnoredKey; then the entries that select no method, in entry order.
func warningsOf(w *wireConfig, unknown []unknownKey) []*Warning {
	root := schemaOf(reflect.TypeFor[wireConfig](), "the top level")
	entrySchema := childSchema(root, "methodConfig")
	nameSchema := childSchema(entrySchema, "name")
	var out []*Warning
	misspeltName := map[int]bool{} // entries with a key that misspells "name"
	for _, u := range unknown {
		var msg string
		switch u.in {
		case nameSchema:
			msg = unknownInName(w, u)
		case entrySchema:
			if u.suggestion == "name" {
				i := u.indices[0]
				misspeltName[i] = true
				msg = misspeltNameKey(entry(w, i))
			}
		case root:
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
	msg += " grpc-go ignores it"
	m := entry(w, u.indices[0])
	if m == nil || m.Name == nil || u.indices[1] >= len(*m.Name) {
		return msg
	}
	n := (*m.Name)[u.indices[1]]
	switch svc, method := n.Service.v, n.Method.v; {
	case svc == "" && method == "":
		msg += ", which leaves the name {}, the default entry: its policies would apply to every method"
	case method == "":
		quoted, _ := json.Marshal(svc)
		msg += `, which leaves the name {"service": ` + string(quoted) +
			`}: its policies would apply to every method of ` + svc
	}
	return msg
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
