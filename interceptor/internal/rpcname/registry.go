package rpcname

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// What the program's generated code registers. Every .pb.go file linked
// into the program registers its services with protoregistry.GlobalFiles
// when its package is initialized, so at construction time (NewClient,
// server.New) the registry knows every service a generated stub or
// handler of the program uses. It knows nothing of services called
// without generated code (a proxy's, conn.Invoke with a name from
// elsewhere).

// Registered says how n fails to match the services and methods linked
// into the program, or returns "" when it matches (or is the default
// name, or a service name that names no service and no method either).
// wrong reports a name that cannot be right however the program calls:
//
//   - a method its registered service does not have (a service's methods
//     are fixed by its one descriptor), with the method it most likely
//     misspells;
//   - a name that names no service but is, without a package, the name of
//     a method of a registered service ("Echo" for
//     "/resilience.echo.v1.EchoService/Echo");
//   - a registered name that is not a service (a message, a package's
//     member).
//
// Otherwise, a service that is not registered is reported with wrong
// false: a call made without generated code may still carry the name.
func Registered(n serviceconfig.Name) (msg string, wrong bool) {
	if n.Service == "" {
		return "", false
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(n.Service))
	if err == nil {
		sd, ok := d.(protoreflect.ServiceDescriptor)
		if !ok {
			return fmt.Sprintf("%q is not a service but a %s", n.Service, kindOf(d)), true
		}
		if n.Method == "" || sd.Methods().ByName(protoreflect.Name(n.Method)) != nil {
			return "", false
		}
		return fmt.Sprintf("service %s has no method %q%s", n.Service, n.Method, suggestMethod(sd, n.Method)), true
	}
	if n.Method == "" && !strings.Contains(n.Service, ".") {
		if full := methodNamed(n.Service); full != "" {
			return fmt.Sprintf("%q is not a registered service but the name of a method: %q", n.Service, full), true
		}
	}
	return fmt.Sprintf("service %q is not registered in this program (protoregistry.GlobalFiles)%s: "+
		"the name applies to no call made with generated code", n.Service, suggestService(n.Service)), false
}

// StreamKind returns what kind of streaming method n names, as the
// registry describes it: "server-streaming", "client-streaming" or
// "bidirectional-streaming"; "" for a unary method, a whole service, or a
// method the registry does not know.
func StreamKind(n serviceconfig.Name) string {
	if n.Service == "" || n.Method == "" {
		return ""
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(n.Service))
	if err != nil {
		return ""
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return ""
	}
	md := sd.Methods().ByName(protoreflect.Name(n.Method))
	switch {
	case md == nil:
		return ""
	case md.IsStreamingClient() && md.IsStreamingServer():
		return "bidirectional-streaming"
	case md.IsStreamingClient():
		return "client-streaming"
	case md.IsStreamingServer():
		return "server-streaming"
	}
	return ""
}

// AllStreamMethods returns the full names ("/pkg.Service/Method") of every
// streaming method of every service the registry describes, sorted.
func AllStreamMethods() []string {
	var out []string
	eachService(func(sd protoreflect.ServiceDescriptor) bool {
		ms := sd.Methods()
		for i := range ms.Len() {
			if md := ms.Get(i); md.IsStreamingClient() || md.IsStreamingServer() {
				out = append(out, "/"+string(sd.FullName())+"/"+string(md.Name()))
			}
		}
		return true
	})
	slices.Sort(out)
	return out
}

// List joins names for a message, the first limit of them and then how
// many more: "a, b, c and 7 more".
func List(names []string, limit int) string {
	if len(names) <= limit {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:limit], ", "), len(names)-limit)
}

// StreamMethods returns the names of the streaming methods of service, as
// the registry describes it, in declaration order; nil for a service
// without any, or one the registry does not know.
func StreamMethods(service string) []string {
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		return nil
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil
	}
	var out []string
	ms := sd.Methods()
	for i := range ms.Len() {
		if md := ms.Get(i); md.IsStreamingClient() || md.IsStreamingServer() {
			out = append(out, string(md.Name()))
		}
	}
	return out
}

// kindOf names the kind of a descriptor that is not a service.
func kindOf(d protoreflect.Descriptor) string {
	switch d.(type) {
	case protoreflect.MessageDescriptor:
		return "message"
	case protoreflect.EnumDescriptor:
		return "enum"
	case protoreflect.MethodDescriptor:
		return "method: a method is named by its service and its name, \"/package.Service/Method\""
	}
	return "declaration of another kind"
}

// suggestMethod returns ` (did you mean "M"?)` for the method of sd that
// m most likely misspells, or the list of sd's methods when none is close.
func suggestMethod(sd protoreflect.ServiceDescriptor, m string) string {
	ms := sd.Methods()
	names := make([]string, ms.Len())
	for i := range ms.Len() {
		names[i] = string(ms.Get(i).Name())
	}
	if best := closest(m, names); best != "" {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	if len(names) > 12 {
		return ""
	}
	return " (its methods: " + strings.Join(names, ", ") + ")"
}

// suggestService returns ` (did you mean "S"?)` for the registered service
// that s most likely misspells, or "".
func suggestService(s string) string {
	var names []string
	eachService(func(sd protoreflect.ServiceDescriptor) bool {
		names = append(names, string(sd.FullName()))
		return true
	})
	if best := closest(s, names); best != "" {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	return ""
}

// methodNamed returns "/package.Service/m" for the first registered service
// with a method m, or "".
func methodNamed(m string) string {
	var full string
	eachService(func(sd protoreflect.ServiceDescriptor) bool {
		if sd.Methods().ByName(protoreflect.Name(m)) != nil {
			full = "/" + string(sd.FullName()) + "/" + m
			return false
		}
		return true
	})
	return full
}

// eachService calls f with each registered service until f returns false.
func eachService(f func(protoreflect.ServiceDescriptor) bool) {
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		ss := fd.Services()
		for i := range ss.Len() {
			if !f(ss.Get(i)) {
				return false
			}
		}
		return true
	})
}

// closest returns the name of names that s most likely misspells: equal
// without regard to case, or within an edit distance of 2 (1 for names of
// up to 4 letters); "" when none is.
func closest(s string, names []string) string {
	best, bestD := "", -1
	for _, n := range names {
		d := 0
		if !strings.EqualFold(n, s) {
			limit := 2
			if min(len(n), len(s)) <= 4 {
				limit = 1
			}
			if abs(len(n)-len(s)) > limit {
				continue
			}
			if d = editDistance(strings.ToLower(s), strings.ToLower(n)); d > limit {
				continue
			}
		}
		if bestD < 0 || d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

func abs(n int) int { return max(n, -n) }

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
