package rpcname

import (
	"slices"
	"testing"

	_ "github.com/grpc-resilience/resilience/proto/resilience/echo/v1" // registers resilience.echo.v1.EchoService
	"github.com/grpc-resilience/resilience/serviceconfig"
)

const echo = "resilience.echo.v1.EchoService"

// TestRegistered pins what the registry of linked-in code says of a name:
// nothing of one it knows; a method its service lacks, a method's name
// given as a service, and a message given as a service are wrong (no
// program's call can match them); a service it does not know may be
// called without generated code, so it is only reported.
func TestRegistered(t *testing.T) {
	tests := []struct {
		name      string
		n         serviceconfig.Name
		wantMsg   string
		wantWrong bool
	}{
		{"default", serviceconfig.Name{}, "", false},
		{"service", serviceconfig.Name{Service: echo}, "", false},
		{"method", serviceconfig.Name{Service: echo, Method: "Echo"}, "", false},
		{"stream", serviceconfig.Name{Service: echo, Method: "BidiStream"}, "", false},
		{"misspelt method", serviceconfig.Name{Service: echo, Method: "Ecko"},
			`service resilience.echo.v1.EchoService has no method "Ecko" (did you mean "Echo"?)`, true},
		{"method in the wrong case", serviceconfig.Name{Service: echo, Method: "lookup"},
			`service resilience.echo.v1.EchoService has no method "lookup" (did you mean "Lookup"?)`, true},
		{"method like none", serviceconfig.Name{Service: echo, Method: "Charge"},
			`service resilience.echo.v1.EchoService has no method "Charge" (its methods: Echo, Lookup, ServerStream, ClientStream, BidiStream)`, true},
		{"bare method name", serviceconfig.Name{Service: "Echo"},
			`"Echo" is not a registered service but the name of a method: "/resilience.echo.v1.EchoService/Echo"`, true},
		{"message", serviceconfig.Name{Service: "resilience.echo.v1.EchoRequest"},
			`"resilience.echo.v1.EchoRequest" is not a service but a message`, true},
		{"method as a service", serviceconfig.Name{Service: echo + ".Echo"},
			`"resilience.echo.v1.EchoService.Echo" is not a service but a method: a method is named by its service and its name, "/package.Service/Method"`, true},
		{"unknown service", serviceconfig.Name{Service: "shop.Orders", Method: "Pay"},
			`service "shop.Orders" is not registered in this program (protoregistry.GlobalFiles): the name applies to no call made with generated code`, false},
		{"misspelt service", serviceconfig.Name{Service: "resilience.echo.v1.EchoServce"},
			`service "resilience.echo.v1.EchoServce" is not registered in this program (protoregistry.GlobalFiles) (did you mean "resilience.echo.v1.EchoService"?): the name applies to no call made with generated code`, false},
		{"bare name of no method", serviceconfig.Name{Service: "Orders"},
			`service "Orders" is not registered in this program`, false},
		{"package", serviceconfig.Name{Service: "resilience.echo.v1"},
			`service "resilience.echo.v1" is not registered in this program`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, wrong := Registered(tt.n)
			if wrong != tt.wantWrong || (tt.wantMsg == "") != (msg == "") || len(msg) < len(tt.wantMsg) || msg[:len(tt.wantMsg)] != tt.wantMsg {
				t.Errorf("Registered(%+v) = %q, %v, want %q..., %v", tt.n, msg, wrong, tt.wantMsg, tt.wantWrong)
			}
		})
	}
}

func TestStreamKind(t *testing.T) {
	tests := []struct {
		n    serviceconfig.Name
		want string
	}{
		{serviceconfig.Name{Service: echo, Method: "Echo"}, ""},
		{serviceconfig.Name{Service: echo}, ""},
		{serviceconfig.Name{Service: echo, Method: "ServerStream"}, "server-streaming"},
		{serviceconfig.Name{Service: echo, Method: "ClientStream"}, "client-streaming"},
		{serviceconfig.Name{Service: echo, Method: "BidiStream"}, "bidirectional-streaming"},
		{serviceconfig.Name{Service: echo, Method: "Nope"}, ""},
		{serviceconfig.Name{Service: "shop.Orders", Method: "Watch"}, ""},
	}
	for _, tt := range tests {
		if got := StreamKind(tt.n); got != tt.want {
			t.Errorf("StreamKind(%+v) = %q, want %q", tt.n, got, tt.want)
		}
	}
}

func TestStreamMethods(t *testing.T) {
	if got, want := StreamMethods(echo), []string{"ServerStream", "ClientStream", "BidiStream"}; !slices.Equal(got, want) {
		t.Errorf("StreamMethods(%q) = %q, want %q", echo, got, want)
	}
	for _, s := range []string{"shop.Orders", "resilience.echo.v1.EchoRequest", ""} {
		if got := StreamMethods(s); got != nil {
			t.Errorf("StreamMethods(%q) = %q, want none", s, got)
		}
	}
}

func TestAllStreamMethods(t *testing.T) {
	got := AllStreamMethods()
	for _, want := range []string{"/" + echo + "/BidiStream", "/" + echo + "/ClientStream", "/" + echo + "/ServerStream"} {
		if !slices.Contains(got, want) {
			t.Errorf("AllStreamMethods() = %q, want it to hold %q", got, want)
		}
	}
	if slices.Contains(got, "/"+echo+"/Echo") || !slices.IsSorted(got) {
		t.Errorf("AllStreamMethods() = %q, want the streams only, sorted", got)
	}
}

func TestList(t *testing.T) {
	tests := []struct {
		names []string
		limit int
		want  string
	}{
		{nil, 2, ""},
		{[]string{"a", "b"}, 2, "a, b"},
		{[]string{"a", "b", "c", "d"}, 2, "a, b and 2 more"},
	}
	for _, tt := range tests {
		if got := List(tt.names, tt.limit); got != tt.want {
			t.Errorf("List(%q, %d) = %q, want %q", tt.names, tt.limit, got, tt.want)
		}
	}
}
