package serviceconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// Unknown keys. encoding/json ignores a key that names no field, as grpc-go
// does, so a misspelt key silently leaves its field at the default. Where
// the schema is ours, that is an error; in gRFC A6's own objects it is a
// warning (Config.Warnings), so that a document grpc-go accepts stays
// valid, except where the key is plainly one of ours misspelt or misplaced.
//
// The check reads the wire types by reflection, so a field added to them
// is known at once. A field whose subtree is ours carries the struct tag
// `sc:"ours"`: our blocks (circuitBreaker, bulkhead, retryBudget, every
// block of the server config) and our extension fields inside A6's objects
// (perAttemptRecvTimeout, jitter, the adaptive hedging delay's fields).

// schema is one JSON object of a wire type: its keys, each with the schema
// of its value when that is an object or an array of objects.
type schema struct {
	where  string // where the object sits, for "belongs in": "the top level", "retryPolicy"
	fields []schemaField
}

type schemaField struct {
	name  string  // the JSON key, lowerCamel
	ours  bool    // an extension field or block: strict, and errors when misspelt
	child *schema // nil for a leaf
}

// schemaOf returns the schema of the wire struct type t, built once.
func schemaOf(t reflect.Type, where string) *schema {
	if s, ok := schemas.Load(t); ok {
		return s.(*schema)
	}
	s := &schema{where: where}
	for i := range t.NumField() {
		f := t.Field(i)
		sf := schemaField{name: lowerCamel(f.Name), ours: f.Tag.Get("sc") == "ours"}
		if et := objectType(f.Type); et != nil {
			where := sf.name
			if isList(f.Type) {
				where = "a " + sf.name + " entry"
			}
			sf.child = schemaOf(et, where)
		}
		s.fields = append(s.fields, sf)
	}
	s2, _ := schemas.LoadOrStore(t, s)
	return s2.(*schema)
}

var schemas sync.Map // reflect.Type → *schema

// objectType returns the wire struct type a field of type t decodes JSON
// objects into (through pointers and slices), or nil for a leaf.
func objectType(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t.Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerType) {
		return nil
	}
	return t
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// isList reports whether a field of type t holds a JSON array.
func isList(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Kind() == reflect.Slice
}

// lowerCamel returns the JSON key of a wire field: "MaxQueueWait" gives
// "maxQueueWait", an all-capitals "TTL" gives "ttl".
func lowerCamel(s string) string {
	if strings.ToUpper(s) == s {
		return strings.ToLower(s)
	}
	return strings.ToLower(s[:1]) + s[1:]
}

// field returns the field of s that key names, matched as encoding/json
// matches keys to field names: exactly, or else without regard to case.
func (s *schema) field(key string) (schemaField, bool) {
	for _, f := range s.fields {
		if f.name == key {
			return f, true
		}
	}
	for _, f := range s.fields {
		if strings.EqualFold(f.name, key) {
			return f, true
		}
	}
	return schemaField{}, false
}

// keyCheck walks a document against a schema and collects what it finds:
// the first unknown key that is an error, and the notes (the other unknown
// keys, and the known keys repeated or null), in document order.
type keyCheck struct {
	root     *schema
	strict   bool // the whole document is ours (the server config)
	err      *Error
	warnings []unknownKey
	places   []placed // every field of the schema, for placeOf; built on first use
	// indices are the indices of the array elements the walk is in, outermost
	// first: [i] in the i-th methodConfig entry, [i, j] in its j-th name.
	indices []int
}

// unknownKey is a note of the walk: an unknown key that is only warned
// about, or (note) a known key given twice in one object or given null, or
// a null element of an array of objects. Parse decides which of the notes
// change which methods a policy covers (coverage.go); the others are no
// warning.
type unknownKey struct {
	parent, key, suggestion string
	in                      *schema // the object holding the key (the array's element schema for noteNullElement)
	indices                 []int   // keyCheck.indices where the key is
	note                    noteKind
}

// noteKind says what an unknownKey notes.
type noteKind uint8

const (
	noteUnknown     noteKind = iota // a key the object does not know
	noteRepeated                    // a known key given again in the same object
	noteNull                        // a known key whose value is null
	noteNullElement                 // a null element of an array of objects: parent is its path, key ""
)

// checkKeys checks the keys of data, a document that decoded, against
// the schema of the wire type root. It returns the first unknown key that
// is an error and the notes: the other unknown keys, and the known keys
// repeated or null and the null elements of arrays of objects.
func checkKeys(data []byte, root reflect.Type, strict bool) (*Error, []unknownKey) {
	k := &keyCheck{root: schemaOf(root, "the top level"), strict: strict}
	k.value(data, k.root, "", strict)
	return k.err, k.warnings
}

// value checks the value raw when it is an object (against s) or an array
// of objects; anything else has no keys.
func (k *keyCheck) value(raw []byte, s *schema, path string, ours bool) {
	raw = bytes.TrimSpace(raw)
	if k.err != nil || s == nil || len(raw) == 0 {
		return
	}
	switch raw[0] {
	case '[':
		var elems []json.RawMessage
		if json.Unmarshal(raw, &elems) != nil {
			return
		}
		for i, e := range elems {
			k.indices = append(k.indices, i)
			if isNull(e) {
				k.note(unknownKey{parent: index(path, i), in: s, note: noteNullElement})
			}
			k.value(e, s, index(path, i), ours)
			k.indices = k.indices[:len(k.indices)-1]
		}
	case '{':
		k.object(raw, s, path, ours)
	}
}

// object checks the keys of one object, in document order.
func (k *keyCheck) object(raw []byte, s *schema, path string, ours bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // '{'
		return
	}
	var given []string // the fields given so far, by their names
	for dec.More() && k.err == nil {
		t, err := dec.Token()
		key, ok := t.(string)
		var v json.RawMessage
		if err != nil || !ok || dec.Decode(&v) != nil {
			return
		}
		if f, known := s.field(key); known {
			if slices.Contains(given, f.name) {
				k.note(unknownKey{parent: path, key: key, in: s, note: noteRepeated})
			}
			given = append(given, f.name)
			if isNull(v) {
				k.note(unknownKey{parent: path, key: key, in: s, note: noteNull})
			}
			k.value(v, f.child, join(path, key), ours || f.ours)
			continue
		}
		k.unknown(s, path, key, ours)
	}
}

// unknown decides what an unknown key of an object of schema s is: an
// error in our objects, and in A6's when it is one of our keys misspelt
// or misplaced; else a warning.
func (k *keyCheck) unknown(s *schema, path, key string, ours bool) {
	best, bestOurs := closest(s, key)
	elsewhere := k.placeOf(key, s)
	switch {
	case ours && best != "":
		k.err = newError(join(path, key), `unknown key: did you mean "`+best+`"?`)
	case ours && elsewhere != "":
		k.err = newError(join(path, key), "unknown key here: it belongs in "+elsewhere)
	case ours:
		k.err = newError(join(path, key), "unknown key; the keys here are "+s.names())
	case bestOurs:
		k.err = newError(join(path, key), `unknown key: did you mean "`+best+`"? (one of grpc-resilience's own keys)`)
	case elsewhere != "" && best == "":
		k.err = newError(join(path, key), "unknown key here: it belongs in "+elsewhere)
	default:
		k.warnings = append(k.warnings, unknownKey{parent: path, key: key, suggestion: best, in: s, indices: slices.Clone(k.indices)})
	}
}

// note records u at the walk's current indices.
func (k *keyCheck) note(u unknownKey) {
	u.indices = slices.Clone(k.indices)
	k.warnings = append(k.warnings, u)
}

// isNull reports whether the JSON value raw is null.
func isNull(raw []byte) bool { return string(bytes.TrimSpace(raw)) == "null" }

// names lists the keys of s, for an error.
func (s *schema) names() string {
	names := make([]string, len(s.fields))
	for i, f := range s.fields {
		names[i] = f.name
	}
	return strings.Join(names, ", ")
}

// placed is one field of a document's schema, with the object holding it.
type placed struct {
	field schemaField
	in    *schema
}

// fieldsUnder lists every field of the document rooted at s, each object's
// fields once, depth first in field order: the order in which placeOf
// looks for a key.
func (s *schema) fieldsUnder(seen map[*schema]bool, out []placed) []placed {
	if seen[s] {
		return out
	}
	seen[s] = true
	for _, f := range s.fields {
		out = append(out, placed{field: f, in: s})
		if f.child != nil {
			out = f.child.fieldsUnder(seen, out)
		}
	}
	return out
}

// placeOf returns where, in the document, key names one of our fields or
// blocks (any field, when the whole document is ours), matched without
// regard to case, other than in the object not: "the top level",
// "retryPolicy", or "" when nowhere.
func (k *keyCheck) placeOf(key string, not *schema) string {
	if k.places == nil {
		k.places = k.root.fieldsUnder(map[*schema]bool{}, nil)
	}
	for _, p := range k.places {
		if p.in != not && (p.field.ours || k.strict) && strings.EqualFold(p.field.name, key) {
			return p.in.where
		}
	}
	return ""
}

// closest returns the key of s that key most likely misspells, and whether
// it is one of ours; "" when none is close. Keys are compared in lower
// case: within an edit distance of 2 (1 for keys of up to 3 letters), or
// one a prefix of the other (such as "failureRate" for
// "failureRateThreshold", or "openDurationMs" for "openDuration").
func closest(s *schema, key string) (best string, ours bool) {
	lk := strings.ToLower(key)
	if lk == "" {
		return "", false
	}
	n := utf8.RuneCountInString(lk)
	bestD := -1
	for _, f := range s.fields {
		lf := strings.ToLower(f.name)
		m := utf8.RuneCountInString(lf)
		limit := 2
		if min(n, m) <= 3 {
			limit = 1
		}
		// The distance is at least the difference in length, and exactly
		// that when one is a prefix of the other: the full distance is
		// computed only for keys of about the same length, so that a long
		// key costs its length, not its length times the schema's.
		var d int
		switch {
		case len(lk) >= 4 && len(lf) >= 4 && (strings.HasPrefix(lf, lk) || strings.HasPrefix(lk, lf)):
			d = max(n-m, m-n)
		case max(n-m, m-n) > limit:
			continue
		default:
			if d = editDistance(lk, lf); d > limit {
				continue
			}
		}
		if bestD < 0 || d < bestD {
			best, ours, bestD = f.name, f.ours, d
		}
	}
	return best, ours
}

// editDistance is the Levenshtein distance between a and b, in runes.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// warning returns u as a warning of kind WarningIgnoredKey.
func (u unknownKey) warning() *Warning {
	msg := "unknown key, ignored (grpc-go ignores it too)"
	if u.suggestion != "" {
		msg += `: did you mean "` + u.suggestion + `"?`
	}
	return &Warning{Kind: WarningIgnoredKey, Path: u.path(), Err: errors.New(msg)}
}

// path returns the JSON path of the key, or of the element.
func (u unknownKey) path() string {
	if u.note == noteNullElement {
		return u.parent
	}
	return join(u.parent, u.key)
}

// hint adds to err, an error of Parse at the path of a key the document
// lacks, or at the object that lacks it and names it ("method "Pay" set
// without service" at a name), the unknown key that most likely misspells
// it: a required field reported missing is often one written wrong.
func hint(err error, unknown []unknownKey) error {
	var e *Error
	if !errors.As(err, &e) || e.Path == "" {
		return err
	}
	for _, u := range unknown {
		if u.note != noteUnknown || u.suggestion == "" {
			continue
		}
		if join(u.parent, u.suggestion) == e.Path || u.parent == e.Path && namesWord(e.Err.Error(), u.suggestion) {
			return &Error{Path: e.Path, Err: errors.New(e.Err.Error() + ` (the document has "` + u.key + `": a misspelling?)`)}
		}
	}
	return err
}

// namesWord reports whether msg holds word as a whole word, outside quotes
// (a quoted value is the document's, not a key the message names).
func namesWord(msg, word string) bool {
	for _, f := range strings.FieldsFunc(msg, func(r rune) bool { return r == ' ' || r == ',' || r == ':' || r == ';' }) {
		if f == word {
			return true
		}
	}
	return false
}
