package faultinject_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/faultinject"
	_ "github.com/grpc-resilience/resilience/proto/resilience/echo/v1" // registers resilience.echo.v1.EchoService
)

// TestFaultMethodsAreCheckedAgainstTheRegistry pins issue 29, item 4: a
// fault whose methods match nothing the program serves or calls with
// generated code. A method its registered service lacks, a method's name
// given as a service, a message's name, and a streamAbort-only fault on
// unary methods cannot be right: New refuses them with the path of the
// name (before, each was accepted and injected nothing, so a test of a
// retry policy passed without a single fault). A service nothing
// registers may be served with a hand-written grpc.ServiceDesc: New
// accepts it and logs it once, naming the path.
func TestFaultMethodsAreCheckedAgainstTheRegistry(t *testing.T) {
	abort := &faultinject.Abort{Code: codes.Unavailable}
	tests := []struct {
		name    string
		fault   faultinject.Fault
		wantErr string
		wantLog string
	}{
		{"misspelt method", faultinject.Fault{Methods: []string{"resilience.echo.v1.EchoService/Echo", "/resilience.echo.v1.EchoService/Lokup"}, Abort: abort},
			`faultinject: faults[0].methods[1]: "/resilience.echo.v1.EchoService/Lokup": service resilience.echo.v1.EchoService has no method "Lokup" (did you mean "Lookup"?)`, ""},
		{"method like none", faultinject.Fault{Methods: []string{"resilience.echo.v1.EchoService/Charge"}, Abort: abort},
			`faultinject: faults[0].methods[0]: "resilience.echo.v1.EchoService/Charge": service resilience.echo.v1.EchoService has no method "Charge" (its methods: Echo, Lookup, ServerStream, ClientStream, BidiStream)`, ""},
		{"a method's name as a service", faultinject.Fault{Methods: []string{"Echo"}, Abort: abort},
			`faultinject: faults[0].methods[0]: "Echo": Echo is not a registered service but the name of a method: "resilience.echo.v1.EchoService/Echo"`, ""},
		{"a message as a service", faultinject.Fault{Methods: []string{"resilience.echo.v1.EchoRequest"}, Abort: abort},
			`faultinject: faults[0].methods[0]: "resilience.echo.v1.EchoRequest": resilience.echo.v1.EchoRequest is not a service but a message`, ""},
		{"streamAbort on unary methods only", faultinject.Fault{Methods: []string{"resilience.echo.v1.EchoService/Echo"},
			StreamAbort: &faultinject.StreamAbort{AfterMessages: 1, Code: codes.Unavailable}},
			`faultinject: faults[0].streamAbort: every method of the fault is unary, and streamAbort fails streams only: the fault would do nothing`, ""},
		{"streamAbort on a stream", faultinject.Fault{Methods: []string{"resilience.echo.v1.EchoService/Echo", "resilience.echo.v1.EchoService/BidiStream"},
			StreamAbort: &faultinject.StreamAbort{AfterMessages: 1, Code: codes.Unavailable}}, "", ""},
		{"unregistered service", faultinject.Fault{Methods: []string{"shop.Orders/Pay"}, Delay: &faultinject.Delay{Fixed: time.Millisecond}}, "",
			`faultinject: faults[0].methods[0]: \"shop.Orders/Pay\": service shop.Orders is not registered in this program (protoregistry.GlobalFiles): the fault reaches no method of generated code`},
		{"registered service", faultinject.Fault{Methods: []string{"resilience.echo.v1.EchoService"}, Abort: abort}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var log bytes.Buffer
			inj, err := faultinject.New(faultinject.Config{Faults: []faultinject.Fault{tt.fault}},
				faultinject.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
			if tt.wantErr != "" {
				var e *faultinject.Error
				if err == nil || err.Error() != tt.wantErr || !errors.As(err, &e) || inj != nil {
					t.Fatalf("New() = %v, %v, want %q", inj, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New() = %v, want no error", err)
			}
			got := log.String()
			if tt.wantLog == "" && got != "" || !strings.Contains(got, tt.wantLog) || strings.Count(got, "\n") > 1 {
				t.Errorf("New() logged %q, want one line with %q", got, tt.wantLog)
			}
		})
	}
}

// TestWarningsWithoutALoggerReachSlogDefault pins where New writes its
// warnings without WithLogger: slog.Default(). Before, grpclog's
// "resilience" component, whose default logger discards warnings, so a
// fault on a misspelt, unregistered service injected nothing and said so
// to no one. Not parallel: it replaces slog's default logger.
func TestWarningsWithoutALoggerReachSlogDefault(t *testing.T) {
	var log bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&log, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	_, err := faultinject.New(faultinject.Config{Faults: []faultinject.Fault{{
		Methods: []string{"zz.slogdefault.Unregistered/Pay"}, Abort: &faultinject.Abort{Code: codes.Unavailable}}}})
	if err != nil {
		t.Fatal(err)
	}
	const want = `faults[0].methods[0]: \"zz.slogdefault.Unregistered/Pay\": service zz.slogdefault.Unregistered is not registered`
	if got := log.String(); strings.Count(got, want) != 1 {
		t.Errorf("slog.Default() got %q, want one line with %q", got, want)
	}
}
