// Package rpcname checks and splits the method and service names that the
// client's and the server's options take, and holds the services that both
// sides leave alone by default.
package rpcname

import (
	"errors"
	"fmt"
	"strings"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// ExemptServices are health checking and reflection: they must answer when
// all else fails, so neither side breaks, limits or sheds them by default.
// Callers copy the slice; nothing writes to it.
var ExemptServices = []string{
	"grpc.health.v1.Health",
	"grpc.reflection.v1.ServerReflection",
	"grpc.reflection.v1alpha.ServerReflection",
}

// Parse turns "/pkg.S/M" into {pkg.S, M} and "pkg.S" into {pkg.S}, or
// says what is wrong with n, quoting it.
func Parse(n string) (serviceconfig.Name, error) {
	var name serviceconfig.Name
	switch {
	case n == "":
		return name, errors.New(`"": want a full method "/package.Service/Method" or a service "package.Service"`)
	case strings.HasPrefix(n, "/"):
		s, m := serviceconfig.SplitMethod(n)
		if s == "" || m == "" {
			return name, fmt.Errorf("%q is not a full method: want \"/package.Service/Method\"", n)
		}
		name = serviceconfig.Name{Service: s, Method: m}
	case strings.Count(n, "/") == 1 && !strings.HasSuffix(n, "/"):
		return name, fmt.Errorf("%q: a full method starts with a slash: \"/%s\"", n, n)
	default:
		name.Service = n
	}
	if err := name.Validate(); err != nil {
		return name, fmt.Errorf("%q: %w", n, Bare(err))
	}
	return name, nil
}

// Bare returns the message of a *serviceconfig.Error without its prefix.
func Bare(err error) error {
	var e *serviceconfig.Error
	if errors.As(err, &e) && e.Path == "" {
		return e.Err
	}
	return err
}

// FullMethod returns m as grpc names a method, "/pkg.Service/Method" (a
// name without the leading slash gets it, so that it finds the state the
// calls use), or an error that names op and quotes m.
func FullMethod(op, m string) (string, error) {
	full := m
	if !strings.HasPrefix(full, "/") {
		full = "/" + full
	}
	s, meth := serviceconfig.SplitMethod(full)
	if s == "" || meth == "" {
		return "", fmt.Errorf("interceptor: %s: %q is not a full method: want \"/package.Service/Method\"", op, m)
	}
	if err := (serviceconfig.Name{Service: s, Method: meth}).Validate(); err != nil {
		return "", fmt.Errorf("interceptor: %s: %q: %w", op, m, Bare(err))
	}
	return full, nil
}
