package main

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// document is a parsed service config with what the reports need beside it.
type document struct {
	cfg *serviceconfig.Config
	// uncapped is the same document parsed with no cap on maxAttempts: its
	// entries line up with cfg's and tell what the document asked for.
	uncapped *serviceconfig.Config
	// pos[i] is the position in the document's methodConfig list of
	// cfg.MethodConfig[i]; nil when it could not be told (see load).
	pos []int
	// entries is the length of the document's methodConfig list; entries at
	// positions missing from pos have no name and were skipped by Parse.
	entries int
	// cap is the cap on maxAttempts cfg was parsed with.
	cap int
}

// load parses data with the cap, or returns Parse's error unchanged.
func load(data []byte, maxAttemptsCap int) (*document, error) {
	cfg, err := serviceconfig.Parse(data, serviceconfig.WithMaxAttemptsCap(maxAttemptsCap))
	if err != nil {
		return nil, err
	}
	uncapped, err := serviceconfig.Parse(data, serviceconfig.WithMaxAttemptsCap(math.MaxInt))
	if err != nil || len(uncapped.MethodConfig) != len(cfg.MethodConfig) {
		uncapped = cfg // cannot happen: the cap only lowers values
	}
	d := &document{cfg: cfg, uncapped: uncapped, cap: maxAttemptsCap}
	d.pos, d.entries = positions(data, len(cfg.MethodConfig))
	return d, nil
}

// positions finds the position in the document of each entry Parse kept:
// Parse skips the entries whose name is absent or null, as grpc-go does.
// The document is decoded as Parse decodes it (encoding/json, a pointer to
// the name list), so both agree on which entries have a name. kept is the
// number of entries Parse kept; on any disagreement positions returns nil.
func positions(data []byte, kept int) (pos []int, entries int) {
	var raw struct {
		MethodConfig *[]struct {
			Name *[]json.RawMessage
		}
	}
	if err := json.Unmarshal(data, &raw); err != nil || raw.MethodConfig == nil {
		return nil, kept
	}
	for i, e := range *raw.MethodConfig {
		if e.Name != nil {
			pos = append(pos, i)
		}
	}
	if len(pos) != kept {
		return nil, kept
	}
	return pos, len(*raw.MethodConfig)
}

// parseWarnings returns Parse's warnings about the document (unknown keys
// in gRFC A6's objects), each as "path: what", in document order.
func (d *document) parseWarnings() []string {
	var out []string
	for _, w := range d.cfg.Warnings() {
		var e *serviceconfig.Error
		if errors.As(w, &e) {
			out = append(out, e.Path+": "+e.Err.Error())
		} else {
			out = append(out, w.Error())
		}
	}
	return out
}

// label names entry i of cfg.MethodConfig for a reader: its path in the
// document.
func (d *document) label(i int) string {
	if d.pos == nil {
		return "methodConfig entry " + strconv.Itoa(i) + " (counting entries with a name)"
	}
	return "methodConfig[" + strconv.Itoa(d.pos[i]) + "]"
}

// The levels at which an entry matches a method, best first.
const (
	levelNone = iota
	levelDefault
	levelService
	levelExact
)

// resolution is the entry that applies to a method.
type resolution struct {
	found bool
	entry int                        // index in cfg.MethodConfig
	level int                        // levelExact, levelService or levelDefault
	name  serviceconfig.Name         // the name that matched
	mc    serviceconfig.MethodConfig // the entry, capped
	raw   serviceconfig.MethodConfig // the entry, uncapped
	// shadowed lists the other entries that match the method at a lower
	// level; levels are never merged, so they do not apply.
	shadowed []int
}

// resolve finds the entry that applies to fullMethod with Config.Lookup,
// then tells which entry it is and at which level it matched.
func (d *document) resolve(fullMethod string) resolution {
	mc, ok := d.cfg.Lookup(fullMethod)
	if !ok || len(mc.Name) == 0 {
		return resolution{}
	}
	r := resolution{found: true, entry: -1, mc: mc}
	for i := range d.cfg.MethodConfig {
		e := &d.cfg.MethodConfig[i]
		// Lookup returns a copy of the entry: its Name list is the entry's.
		if len(e.Name) > 0 && &e.Name[0] == &mc.Name[0] {
			r.entry = i
			r.raw = d.uncapped.MethodConfig[i]
			r.level, r.name = matchLevel(e.Name, fullMethod)
			continue
		}
		if lvl, _ := matchLevel(e.Name, fullMethod); lvl != levelNone {
			r.shadowed = append(r.shadowed, i)
		}
	}
	if r.entry < 0 { // cannot happen
		return resolution{}
	}
	return r
}

// matchLevel returns the best level at which one of names selects
// fullMethod, and that name. Each name is tried alone with Config.Lookup, so
// that matching stays the library's.
func matchLevel(names []serviceconfig.Name, fullMethod string) (int, serviceconfig.Name) {
	best, which := levelNone, serviceconfig.Name{}
	trimmed := strings.TrimPrefix(fullMethod, "/")
	for _, n := range names {
		one := serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{Name: []serviceconfig.Name{n}}}}
		if _, ok := one.Lookup(fullMethod); !ok {
			continue
		}
		lvl := levelService
		switch {
		case n.Service == "":
			lvl = levelDefault
		case n.Method != "" && trimmed == n.Service+"/"+n.Method:
			lvl = levelExact
		}
		if lvl > best {
			best, which = lvl, n
		}
	}
	return best, which
}

// nameString writes a name for a reader: /svc/Method for one method,
// /svc/* for a whole service, (default) for the default.
func nameString(n serviceconfig.Name) string {
	switch {
	case n.Service == "" && n.Method == "":
		return "(default)"
	case n.Method == "":
		return "/" + n.Service + "/*"
	}
	return "/" + n.Service + "/" + n.Method
}
