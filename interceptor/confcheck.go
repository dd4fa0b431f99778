package interceptor

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/grpc-resilience/resilience/interceptor/internal/rpcname"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Checking the client's configuration where it comes in: NewClient (the
// options), UpdateServiceConfig and the resolver's configs (WrapResolver).
// Everything here runs when a configuration is given, never on a call.
//
// A setting that cannot be right is refused, with an error naming where
// the user wrote it: the option and the Go field for a policy written in
// Go ("WithRetryPolicy: InitialBackoff: must not be negative"), the JSON
// path for a parsed document. A setting that may yet be right (a service no
// code linked into the program registers, which a call made without
// generated code may still name) is logged, once. A resolver's config is
// never refused for what grpc-go would apply: its problems are logged.

// entryOrigin is where an entry of a client's method config came from: the
// cap its MaxAttempts is held to, and how an error names it.
type entryOrigin struct {
	option string // the option that gave it, or "UpdateServiceConfig", or resolverOrigin
	index  int    // its index among the entries that option gave
	// parsedCap is the cap serviceconfig.Parse applied to the entry's
	// config; 0 for an entry built in Go, held to the client's cap.
	parsedCap int
}

// resolverOrigin is the option of the entries of a resolver's config.
const resolverOrigin = "the resolver's service config"

// originsOf returns the origins of the entries of cfg, given whole by option.
func originsOf(option string, cfg *serviceconfig.Config) []entryOrigin {
	origins := make([]entryOrigin, len(cfg.MethodConfig))
	for i := range origins {
		origins[i] = entryOrigin{option: option, index: i, parsedCap: cfg.MaxAttemptsCap()}
	}
	return origins
}

// at names, for an error or a warning, what is at rel in the entry: a path
// relative to the entry in JSON form ("retryPolicy.initialBackoff",
// "name[0]"), or "" for the entry itself. A policy written in Go is named
// by its option and Go fields, a parsed document by its JSON path:
//
//	WithRetryPolicy: InitialBackoff
//	WithMethodConfig: entry 1: RetryPolicy.InitialBackoff
//	WithServiceConfig: MethodConfig[1].RetryPolicy.InitialBackoff   (a Config built in Go)
//	WithServiceConfig: methodConfig[1].retryPolicy.initialBackoff   (a parsed Config)
func (og entryOrigin) at(rel string) string {
	join := func(a, b string) string {
		switch {
		case b == "":
			return a
		case a == "":
			return b
		}
		return a + ": " + b
	}
	entry := fmt.Sprintf("methodConfig[%d]", og.index)
	switch {
	case og.parsedCap > 0:
		if rel != "" {
			entry += "." + rel
		}
		return join(og.option, entry)
	case og.option == "WithRetryPolicy":
		// One policy: the caller wrote neither an entry nor retryPolicy.
		rel = strings.TrimPrefix(strings.TrimPrefix(rel, "retryPolicy"), ".")
		return join(og.option, goPath(rel))
	case og.option == "WithMethodConfig":
		return join(fmt.Sprintf("%s: entry %d", og.option, og.index), goPath(rel))
	}
	entry = fmt.Sprintf("MethodConfig[%d]", og.index)
	if rel != "" {
		entry += "." + goPath(rel)
	}
	return join(og.option, entry)
}

// atName names name j of the entry, n, as at does, but as the string the
// caller wrote for WithRetryPolicy: WithRetryPolicy("shop.Orders").
func (og entryOrigin) atName(j int, n serviceconfig.Name) string {
	if og.option != "WithRetryPolicy" || og.parsedCap > 0 {
		return og.at(fmt.Sprintf("name[%d]", j))
	}
	s := n.Service
	switch {
	case n.Service == "" && n.Method == "":
		return og.option + " without names (the default of every method)"
	case n.Method != "":
		s = "/" + n.Service + "/" + n.Method
	}
	return fmt.Sprintf("%s(%q)", og.option, s)
}

// goPath turns a JSON path relative to a MethodConfig or Config, such as
// "retryPolicy.retryableStatusCodes[1]", into its Go fields,
// "RetryPolicy.RetryableStatusCodes[1]": the keys are the fields'
// lowerCamel names (all lower case for TTL).
func goPath(path string) string {
	parts := strings.Split(path, ".")
	for i, p := range parts {
		key, rest, _ := strings.Cut(p, "[")
		if rest != "" {
			rest = "[" + rest
		}
		switch {
		case key == "ttl":
			key = "TTL"
		case key != "":
			key = strings.ToUpper(key[:1]) + key[1:]
		}
		parts[i] = key + rest
	}
	return strings.Join(parts, ".")
}

// configError is an error in a client's configuration, worded for where
// it was given; it wraps the *serviceconfig.Error of a policy's
// validation, whose Path is then the entry's JSON path.
type configError struct {
	msg string
	err error // nil, or the *serviceconfig.Error
}

func (e *configError) Error() string { return e.msg }
func (e *configError) Unwrap() error { return e.err }

// errAt returns the error msg about what is at rel in og's entry.
func (og entryOrigin) errAt(rel, msg string) error {
	return &configError{msg: "interceptor: " + og.at(rel) + ": " + msg}
}

// checkEntries checks mcs, entries of a client's method config, each
// against where it came from (origins[i]): a name list (for an entry built
// in Go), names that a call can carry, given once across all entries,
// valid policies, a MaxAttempts within the cap of its origin. Then what
// the registry of linked-in protos tells (checkRegistered): an error where
// direct, a warning to log for a resolver's config. It returns the first
// error, and the warnings.
func checkEntries(mcs []serviceconfig.MethodConfig, origins []entryOrigin, clientCap int, direct bool) (warnings []string, err error) {
	seen := make(map[string]string)                        // the key of each name given, to where it was given
	allStreams := sync.OnceValue(rpcname.AllStreamMethods) // read once, when an entry needs it
	for i := range mcs {
		mc, og := &mcs[i], origins[i]
		if len(mc.Name) == 0 && og.parsedCap == 0 {
			return nil, og.errAt("", noNameMsg(og))
		}
		for j, n := range mc.Name {
			at := og.atName(j, n)
			if err := n.Validate(); err != nil {
				return nil, fmt.Errorf("interceptor: %s: %w", at, rpcname.Bare(err))
			}
			key := "/" + n.Service + "/" + n.Method
			if n.Service == "" {
				key = ""
			}
			if first, dup := seen[key]; dup {
				return nil, fmt.Errorf("interceptor: %s: duplicates the name at %s", at, first)
			}
			seen[key] = at
		}
		if err := checkPolicies(mc, og); err != nil {
			return nil, err
		}
		if err := checkCap(mc, og, clientCap); err != nil {
			return nil, err
		}
		w, err := checkRegistered(mc, og, direct)
		if err != nil {
			return nil, err
		}
		warnings = append(warnings, w...)
		warnings = append(warnings, hedgedStreams(mcs, i, og, allStreams)...)
	}
	return warnings, nil
}

// maxListed bounds the methods a warning names.
const maxListed = 8

// hedgedStreams returns the warnings about the streaming methods that
// entry i of mcs governs through a service's name or the default name
// ([{}]) while it holds a hedgingPolicy: a stream is never hedged, so
// under such an entry it runs one attempt, without retries. It names the
// streams the registry describes (the streams of a service, or of every
// service for the default) that no more specific entry of mcs names; an
// entry naming a stream exactly is checkRegistered's. A stream the registry
// does not describe is logged at its first call (Client.noteHedgedStream).
// all returns rpcname.AllStreamMethods, read once across the entries of
// one check.
func hedgedStreams(mcs []serviceconfig.MethodConfig, i int, og entryOrigin, all func() []string) []string {
	mc := &mcs[i]
	if mc.HedgingPolicy == nil {
		return nil
	}
	// The entry a call runs under, by the client's own lookup (grpc-go's
	// rule: the first exact name, else the first service, else the first
	// default).
	lookup := &serviceconfig.Config{MethodConfig: mcs}
	var warnings []string
	for _, n := range mc.Name {
		if n.Method != "" {
			continue
		}
		var under []string
		if n.Service != "" {
			for _, m := range streamMethods(n.Service) {
				if lookup.LookupIndex("/"+n.Service+"/"+m) == i {
					under = append(under, m)
				}
			}
			if len(under) > 0 {
				warnings = append(warnings, fmt.Sprintf("interceptor: %s: service %s has streaming methods (%s), "+
					"which are never hedged: under this entry they run one attempt, without retries",
					og.at("hedgingPolicy"), n.Service, rpcname.List(under, maxListed)))
			}
			continue
		}
		for _, fm := range all() {
			if lookup.LookupIndex(fm) == i {
				under = append(under, fm)
			}
		}
		if len(under) > 0 {
			warnings = append(warnings, fmt.Sprintf("interceptor: %s: the default entry (name [{}]) covers streaming methods "+
				"that no other entry names (%s), which are never hedged: under this entry they run one attempt, without retries",
				og.at("hedgingPolicy"), rpcname.List(under, maxListed)))
		}
	}
	return warnings
}

// noNameMsg says that an entry built in Go without a name applies to no
// method, and how to write the default.
func noNameMsg(og entryOrigin) string {
	if og.option == "WithRetryPolicy" {
		return "no names" // cannot happen: WithRetryPolicy without names is the default
	}
	return "has no Name, so it applies to no method: name its methods, or give Name: []serviceconfig.Name{{}} for every method"
}

// checkPolicies validates the policies of mc alone, with errors worded for
// og: its names were checked before.
func checkPolicies(mc *serviceconfig.MethodConfig, og entryOrigin) error {
	one := serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{*mc}}
	err := one.Validate()
	var e *serviceconfig.Error
	if err == nil || !errors.As(err, &e) {
		return err
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(e.Path, "methodConfig[0]"), ".")
	return &configError{
		msg: "interceptor: " + og.at(rel) + ": " + e.Err.Error(),
		err: &serviceconfig.Error{Path: joinPath(fmt.Sprintf("methodConfig[%d]", og.index), rel), Err: e.Err},
	}
}

func joinPath(p, rel string) string {
	if rel == "" {
		return p
	}
	return p + "." + rel
}

// checkCap refuses mc when its MaxAttempts is above the cap of where it
// came from: the cap Parse applied to a parsed config's, clientCap to one
// built in Go. Nothing is lowered in silence: a Go policy asking for 8
// attempts under the default cap of 5 is an error that names
// WithMaxAttemptsCap.
func checkCap(mc *serviceconfig.MethodConfig, og entryOrigin, clientCap int) error {
	limit, raise := clientCap, "interceptor.WithMaxAttemptsCap"
	if og.parsedCap > 0 {
		limit, raise = og.parsedCap, "serviceconfig.WithMaxAttemptsCap when parsing"
	}
	var rel string
	var n int
	switch {
	case mc.RetryPolicy != nil && mc.RetryPolicy.MaxAttempts > limit:
		rel, n = "retryPolicy.maxAttempts", mc.RetryPolicy.MaxAttempts
	case mc.HedgingPolicy != nil && mc.HedgingPolicy.MaxAttempts > limit:
		rel, n = "hedgingPolicy.maxAttempts", mc.HedgingPolicy.MaxAttempts
	default:
		return nil
	}
	return og.errAt(rel, fmt.Sprintf("%d is above the cap of %d; raise the cap with %s", n, limit, raise))
}

// checkRegistered checks the names of mc against the services and methods
// linked into the program (see registered), and a hedging policy against
// the streaming methods mc names exactly: a stream is never hedged. What
// cannot be right (a stream named exactly) is an error when direct, else a
// warning; a service the program does not register is a warning (and the
// streams a hedging entry covers by a service or the default name are
// hedgedStreams' warnings).
func checkRegistered(mc *serviceconfig.MethodConfig, og entryOrigin, direct bool) (warnings []string, err error) {
	for j, n := range mc.Name {
		at := og.atName(j, n)
		msg, wrong := registered(n)
		if msg == "" && mc.HedgingPolicy != nil {
			if kind := streamKind(n); kind != "" {
				at, msg, wrong = og.at("hedgingPolicy"), fmt.Sprintf("/%s/%s is a %s method, and a stream is never hedged: "+
					"it runs one attempt (a retryPolicy retries it until it commits)", n.Service, n.Method, kind), true
			}
		}
		switch {
		case msg == "":
		case wrong && direct:
			return nil, errors.New("interceptor: " + at + ": " + msg)
		default:
			warnings = append(warnings, "interceptor: "+at+": "+msg)
		}
	}
	return warnings, nil
}

// nameOptions are the client's options that select methods by a name
// outside any config entry.
func (o *clientOptions) nameOptions() []struct {
	option string
	names  []string
} {
	var fallbacks []string
	for _, fb := range o.fallbacks {
		fallbacks = append(fallbacks, fb.names...)
	}
	return []struct {
		option string
		names  []string
	}{
		{"WithIdempotencyKeys", o.keyed},
		{"WithIdempotentMethods", o.idempotent},
		{"WithExemptMethods", o.exempt},
		{"WithFallback", fallbacks},
	}
}

// checkNameOptions checks the names of o's options as checkRegistered
// checks an entry's: a method its service lacks, a method name given as a
// service, idempotency keys or a fallback for a streaming method (neither
// applies to streams) are errors; a service the program does not
// register is a warning. The default exempt services are not checked.
func checkNameOptions(o *clientOptions) (warnings []string, err error) {
	for _, l := range o.nameOptions() {
		if l.option == "WithExemptMethods" && !o.exemptSet {
			continue
		}
		for _, s := range l.names {
			n, perr := rpcname.Parse(s)
			if perr != nil {
				continue // refused when the option was applied
			}
			msg, wrong := registered(n)
			if msg == "" && n.Method == "" {
				msg = unaryOnlyService(l.option, n.Service)
			}
			if kind := streamKind(n); msg == "" && kind != "" {
				switch l.option {
				case "WithIdempotencyKeys":
					msg, wrong = "a "+kind+" method: idempotency keys apply to unary methods only (a server runs a stream once per call, whatever its key)", true
				case "WithFallback":
					msg, wrong = "a "+kind+" method: a fallback answers unary calls only (a stream's rejection is returned as it is)", true
				}
			}
			switch {
			case msg == "":
			case wrong:
				return nil, fmt.Errorf("interceptor: %s(%q): %s", l.option, s, msg)
			default:
				warnings = append(warnings, fmt.Sprintf("interceptor: %s(%q): %s", l.option, s, msg))
			}
		}
	}
	return warnings, nil
}

// unaryOnlyService returns the warning, "" for none, about the streaming
// methods of service when option, naming the service, applies to its unary
// methods only: WithIdempotencyKeys (a stream gets no key: a server runs a
// stream once per call, whatever its key) and WithFallback.
func unaryOnlyService(option, service string) string {
	var what string
	switch option {
	case "WithIdempotencyKeys":
		what = "which get no key: keys apply to unary methods only (a server runs a stream once per call, whatever its key)"
	case "WithFallback":
		what = "which it does not answer: a fallback answers unary calls only (a stream's rejection is returned as it is)"
	default:
		return ""
	}
	streams := streamMethods(service)
	if len(streams) == 0 {
		return ""
	}
	return fmt.Sprintf("service %s has streaming methods (%s), %s", service, rpcname.List(streams, maxListed), what)
}

// checkBlocks validates the client-wide blocks of cfg, given by option
// (retryThrottling, retryBudget, loadBalancingConfig): an error names
// the Go fields of a Config built in Go, the JSON path of a parsed one.
func checkBlocks(option string, cfg *serviceconfig.Config) error {
	blocks := serviceconfig.Config{
		RetryThrottling:     cfg.RetryThrottling,
		RetryBudget:         cfg.RetryBudget,
		LoadBalancingConfig: cfg.LoadBalancingConfig,
	}
	err := blocks.Validate()
	var e *serviceconfig.Error
	if err == nil || !errors.As(err, &e) {
		return err
	}
	path := e.Path
	if cfg.MaxAttemptsCap() == 0 {
		path = goPath(path)
	}
	return &configError{msg: "interceptor: " + option + ": " + path + ": " + e.Err.Error(), err: e}
}

// goError rewords err, a policy's Validate error, with the Go field at
// fault ("TTL: must not be negative") rather than its JSON path; it keeps
// err to unwrap.
func goError(err error) error {
	var e *serviceconfig.Error
	if !errors.As(err, &e) || e.Path == "" {
		return err
	}
	return &configError{msg: goPath(e.Path) + ": " + e.Err.Error(), err: e}
}

// parseWarnings returns the warnings of cfg, a config from
// serviceconfig.Parse that option gave the client, as the lines to log.
func parseWarnings(option string, cfg *serviceconfig.Config) []string {
	var out []string
	for _, w := range cfg.Warnings() {
		out = append(out, fmt.Sprintf("interceptor: %s: %s: %v (%s)", option, w.Path, w.Err, w.Kind))
	}
	return out
}

// checkOptions checks the options NewClient was given, once applied: the
// entries of the method config (checkEntries) and the names of the other
// options (checkNameOptions). It returns the warnings to log, those of
// the parsed configs WithServiceConfig gave included.
func checkOptions(o *clientOptions) (warnings []string, err error) {
	entries, err := checkEntries(o.config.MethodConfig, o.origins, o.maxAttemptsCap, true)
	if err != nil {
		return nil, err
	}
	names, err := checkNameOptions(o)
	if err != nil {
		return nil, err
	}
	return slices.Concat(o.warnings, entries, names), nil
}
