package faultinject

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Names against the program's generated code. Every .pb.go file linked into
// the program registers its services with protoregistry.GlobalFiles, so New
// can tell a fault's method that no generated stub or handler can carry.
// (The client and server packages check their names the same way, through
// an internal package this testing aid may not import.)

// checkRegistered checks the methods of c's faults against the registry:
// a method its registered service does not have, a method's name given as
// a service, a name that is not a service, and a fault that only aborts
// streams (streamAbort) naming only unary methods cannot be right, and are
// returned as an *Error at the name's path. A service the registry does not
// know may still be served or called without generated code: it is
// returned as a warning.
func checkRegistered(c *Config) (warnings []string, err error) {
	for i, f := range c.Faults {
		unary := 0
		for j, m := range f.Methods {
			path := fmt.Sprintf("faults[%d].methods[%d]", i, j)
			svc, meth, _ := splitName(m) // validated
			sd, msg, wrong := lookupService(svc)
			switch {
			case wrong:
				return nil, errAt(path, "%q: %s", m, msg)
			case sd == nil:
				warnings = append(warnings, fmt.Sprintf("faultinject: %s: %q: %s", path, m, msg))
				continue
			case meth == "":
				continue
			}
			md := sd.Methods().ByName(protoreflect.Name(meth))
			if md == nil {
				return nil, errAt(path, "%q: service %s has no method %q%s", m, svc, meth, suggestMethod(sd, meth))
			}
			if !md.IsStreamingClient() && !md.IsStreamingServer() {
				unary++
			}
		}
		if f.StreamAbort != nil && f.Delay == nil && f.Abort == nil && f.Outage == nil &&
			len(f.Methods) > 0 && unary == len(f.Methods) {
			return nil, errAt(fmt.Sprintf("faults[%d].streamAbort", i),
				"every method of the fault is unary, and streamAbort fails streams only: the fault would do nothing")
		}
	}
	return warnings, nil
}

// lookupService returns the registered service svc; or says why there is
// none, wrong when the name cannot be right (it names a method or a
// message, not a service), else it is just not registered.
func lookupService(svc string) (sd protoreflect.ServiceDescriptor, msg string, wrong bool) {
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err == nil {
		if sd, ok := d.(protoreflect.ServiceDescriptor); ok {
			return sd, "", false
		}
		kind := "declaration of another kind"
		switch d.(type) {
		case protoreflect.MessageDescriptor:
			kind = "message"
		case protoreflect.EnumDescriptor:
			kind = "enum"
		case protoreflect.MethodDescriptor:
			kind = `method: write "package.Service/Method"`
		}
		return nil, fmt.Sprintf("%s is not a service but a %s", svc, kind), true
	}
	if !strings.Contains(svc, ".") {
		var full string
		protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
			for i := range fd.Services().Len() {
				s := fd.Services().Get(i)
				if s.Methods().ByName(protoreflect.Name(svc)) != nil {
					full = string(s.FullName()) + "/" + svc
					return false
				}
			}
			return true
		})
		if full != "" {
			return nil, fmt.Sprintf("%s is not a registered service but the name of a method: %q", svc, full), true
		}
	}
	return nil, fmt.Sprintf("service %s is not registered in this program (protoregistry.GlobalFiles): "+
		"the fault reaches no method of generated code", svc), false
}

// suggestMethod returns ` (did you mean "M"?)` for the method of sd that m
// most likely misspells (the same letters in another case, or one edit
// away), or the list of sd's methods.
func suggestMethod(sd protoreflect.ServiceDescriptor, m string) string {
	ms := sd.Methods()
	names := make([]string, ms.Len())
	for i := range ms.Len() {
		n := string(ms.Get(i).Name())
		names[i] = n
		if strings.EqualFold(n, m) || oneEdit(strings.ToLower(n), strings.ToLower(m)) {
			return fmt.Sprintf(" (did you mean %q?)", n)
		}
	}
	return " (its methods: " + strings.Join(names, ", ") + ")"
}

// oneEdit reports whether a and b differ by one inserted, deleted or
// replaced byte, or two adjacent bytes swapped.
func oneEdit(a, b string) bool {
	if len(a) < len(b) {
		a, b = b, a
	}
	if len(a)-len(b) > 1 {
		return false
	}
	i := 0
	for i < len(b) && a[i] == b[i] {
		i++
	}
	switch {
	case len(a) > len(b):
		return a[i+1:] == b[i:]
	case i == len(a):
		return false // equal
	case a[i+1:] == b[i+1:]:
		return true // replaced
	}
	return i+1 < len(a) && a[i] == b[i+1] && a[i+1] == b[i] && a[i+2:] == b[i+2:] // swapped
}
