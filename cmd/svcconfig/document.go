package main

import (
	"cmp"
	"encoding/json"
	"fmt"
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

// load parses data with the cap, and with serviceconfig.Lenient under
// -lenient, or returns Parse's error unchanged.
func load(data []byte, opts options) (*document, error) {
	parseOpts := []serviceconfig.ParseOption{serviceconfig.WithMaxAttemptsCap(opts.maxAttemptsCap)}
	if opts.lenient {
		parseOpts = append(parseOpts, serviceconfig.Lenient())
	}
	cfg, err := serviceconfig.Parse(data, parseOpts...)
	if err != nil {
		return nil, err
	}
	parseOpts[0] = serviceconfig.WithMaxAttemptsCap(math.MaxInt)
	uncapped, err := serviceconfig.Parse(data, parseOpts...)
	if err != nil || len(uncapped.MethodConfig) != len(cfg.MethodConfig) {
		uncapped = cfg // cannot happen: the cap only lowers values
	}
	d := &document{cfg: cfg, uncapped: uncapped, cap: opts.maxAttemptsCap}
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

// parseWarnings returns Parse's warnings about the document, each as
// "path: what", in their order: unknown keys in gRFC A6's objects, and
// under -lenient the problems that change which methods a policy covers,
// marked so.
func (d *document) parseWarnings() []string {
	var out []string
	for _, w := range d.cfg.Warnings() {
		line := w.Path + ": " + w.Err.Error()
		if w.Kind == serviceconfig.WarningCoverage {
			line += " [changes which methods a policy covers]"
		}
		out = append(out, line)
	}
	return out
}

// coverage returns the number of Parse's warnings that change which
// methods a policy covers: only a document read with -lenient has any.
func (d *document) coverage() int {
	n := 0
	for _, w := range d.cfg.Warnings() {
		if w.Kind == serviceconfig.WarningCoverage {
			n++
		}
	}
	return n
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

// The keys that only one kind of document has: a server document
// (serviceconfig.ParseServer) at its top level and in its entries, and a
// client's service config (serviceconfig.Parse). Both have methodConfig
// entries with names.
var (
	serverTopKeys   = []string{"concurrencyLimit", "tenantFairness"}
	serverEntryKeys = []string{"concurrencyLimit"}
	clientTopKeys   = []string{"loadBalancingPolicy", "loadBalancingConfig", "retryThrottling", "healthCheckConfig", "retryBudget"}
	clientEntryKeys = []string{"waitForReady", "timeout", "maxRequestMessageBytes", "maxResponseMessageBytes",
		"retryPolicy", "hedgingPolicy", "circuitBreaker", "bulkhead", "rateLimit"}
)

// kindKeys returns a key of data that only a server document has and one
// that only a client's service config has ("" when none), each the first
// of its list that data has, matched as encoding/json matches keys,
// without regard to case. Data
// that is not a JSON object has neither.
func kindKeys(data []byte) (server, client string) {
	var doc map[string]json.RawMessage
	if json.Unmarshal(data, &doc) != nil {
		return "", ""
	}
	// find returns the first of keys, in their order, that obj has.
	find := func(obj map[string]json.RawMessage, keys []string) string {
		for _, want := range keys {
			for k := range obj {
				if strings.EqualFold(k, want) {
					return want
				}
			}
		}
		return ""
	}
	server, client = find(doc, serverTopKeys), find(doc, clientTopKeys)
	for k, v := range doc {
		if !strings.EqualFold(k, "methodConfig") {
			continue
		}
		var entries []map[string]json.RawMessage
		_ = json.Unmarshal(v, &entries) // a list of anything else has no keys to tell
		for _, e := range entries {
			server = cmp.Or(server, find(e, serverEntryKeys))
			client = cmp.Or(client, find(e, clientEntryKeys))
		}
	}
	return server, client
}

// checkKind refuses a document of the other kind than cmd reads, saying
// which command reads it: "svcconfig check" reads a client's service
// config, "svcconfig server" a server document. A document with keys of
// both kinds is left to the parser's verdict.
func checkKind(cmd, file string, data []byte) error {
	server, client := kindKeys(data)
	what := file
	if file == "-" {
		what = "the document on standard input"
	}
	switch {
	case cmd == "server" && client != "" && server == "":
		return fmt.Errorf("svcconfig: %s is a client's service config (it has %q, which serviceconfig.Parse reads), "+
			"not a server document: use svcconfig check %s (or explain)", what, client, file)
	case cmd != "server" && server != "" && client == "":
		return fmt.Errorf("svcconfig: %s is a server document (it has %q, which serviceconfig.ParseServer reads), "+
			"not a client's service config: use svcconfig server %s", what, server, file)
	}
	return nil
}
