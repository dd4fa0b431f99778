package interceptor

import (
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/proto"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// rawCodecName is the content-subtype of rawCodec, registered for the
// package's tests: a server finds the codec by the call's content-subtype.
const rawCodecName = "resilience-test-raw"

// rawMessage is a message that is not a proto message: its bytes are what
// goes on the wire (rawCodec).
type rawMessage struct{ b []byte }

// rawCodec sends a *rawMessage as its bytes and a proto message (the echo
// server's side) as proto, so that a client can call the echo service with
// messages the interceptor cannot measure or clone as proto.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	switch m := v.(type) {
	case *rawMessage:
		return m.b, nil
	case proto.Message:
		return proto.Marshal(m)
	}
	return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	switch m := v.(type) {
	case *rawMessage:
		m.b = append(m.b[:0], data...)
		return nil
	case proto.Message:
		return proto.Unmarshal(data, m)
	}
	return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
}

func (rawCodec) Name() string { return rawCodecName }

func init() { encoding.RegisterCodec(rawCodec{}) }

// rawOf returns m encoded as a rawMessage.
func rawOf(t testing.TB, m proto.Message) *rawMessage {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return &rawMessage{b: b}
}

// newRawEcho starts srv and returns a connection through a client built
// with opts, for calls with rawMessage requests and replies (made with the
// rawCodec content-subtype).
func newRawEcho(t *testing.T, srv *testserver.Server, opts ...ClientOption) (*grpc.ClientConn, *Client) {
	t.Helper()
	c := newTestClient(t, opts...)
	return testserver.Start(t, srv, c.DialOptions()...), c
}

// parsedConfig returns WithServiceConfig of doc, which must parse.
func parsedConfig(t testing.TB, doc string) ClientOption {
	t.Helper()
	cfg, err := serviceconfig.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse(%s): %v", doc, err)
	}
	return WithServiceConfig(cfg)
}
