package interceptor

import (
	"fmt"

	"google.golang.org/grpc/grpclog"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/grpc-resilience/resilience/interceptor/internal/rpcname"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Names in options and methods. A name that no well-formed call carries (a
// service with a slash, a method without its leading slash, a stray space)
// would otherwise leave its option without effect and say nothing: every
// option and method that takes a name checks its form and quotes it.

// clientLog is where the client writes what it cannot return as an error.
var clientLog = grpclog.Component("resilience")

// unregisteredNames returns a warning for each name of cfg that matches no
// service or method linked into this program (its generated code
// registers them with protoregistry.GlobalFiles): such a name applies to no
// call made with generated stubs. A warning, not an error: calls made
// without generated stubs still match it.
func unregisteredNames(cfg *serviceconfig.Config) []string {
	var out []string
	for i, mc := range cfg.MethodConfig {
		for j, n := range mc.Name {
			if msg := unregistered(n); msg != "" {
				out = append(out, fmt.Sprintf("interceptor: methodConfig[%d].name[%d]: %s", i, j, msg))
			}
		}
	}
	return out
}

// logWarnings logs each of ws to grpclog's "resilience" component. It is
// called with no lock of the client's held: a logger is the user's code,
// and may call the client.
func logWarnings(ws []string) {
	for _, w := range ws {
		clientLog.Warning(w)
	}
}

// warnUnregisteredOptions is warnUnregistered for the names of the
// client's options that select methods without a config entry.
func warnUnregisteredOptions(o *clientOptions) {
	for _, l := range []struct {
		option string
		names  []string
	}{
		{"WithIdempotencyKeys", o.keyed},
		{"WithIdempotentMethods", o.idempotent},
	} {
		for _, s := range l.names {
			n, err := rpcname.Parse(s)
			if msg := unregistered(n); err == nil && msg != "" {
				clientLog.Warningf("interceptor: %s(%q): %s", l.option, s, msg)
			}
		}
	}
}

// unregistered says how n matches nothing in protoregistry.GlobalFiles, or
// returns "" when it matches (or is the default name).
func unregistered(n serviceconfig.Name) string {
	if n.Service == "" {
		return ""
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(n.Service))
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if err != nil || !ok {
		return fmt.Sprintf("service %q is not registered in this program (protoregistry.GlobalFiles): the name applies to no call made with generated code", n.Service)
	}
	if n.Method != "" && sd.Methods().ByName(protoreflect.Name(n.Method)) == nil {
		return fmt.Sprintf("service %q has no method %q", n.Service, n.Method)
	}
	return ""
}
