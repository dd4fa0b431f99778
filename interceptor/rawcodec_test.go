package interceptor

import (
	"fmt"
	"testing"
	"testing/synctest"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
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
	return WithServiceConfig(mustParse(t, doc))
}

// mustParse returns doc parsed, failing t if it does not parse.
func mustParse(t testing.TB, doc string) *serviceconfig.Config {
	t.Helper()
	cfg, err := serviceconfig.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse(%s): %v", doc, err)
	}
	return cfg
}

// Item 4 of issue 20: messages the client could not measure as proto
// counted differently on the two paths: a client stream committed at its
// first 3-byte message (counted past the bound), while a 4 KiB unary
// request over a 1 KiB replay buffer was retried (counted as nothing).
// Both now count what the call's codec encodes, as grpc-go does.
func TestNonProtoMessagesCountTowardTheReplayBufferAsEncoded(t *testing.T) {
	const limit = 1024
	opts := []ClientOption{WithStreamReplayBuffer(limit), WithRetryBudget(nil), WithRetryPolicy(fastPolicy(3))}
	raw := grpc.CallContentSubtype(rawCodecName)
	unary := []struct {
		name     string
		payload  int
		attempts int
	}{
		{"4 KiB request over a 1 KiB buffer: committed", 4096, 1},
		{"small request: retried", 10, 3},
	}
	for _, tt := range unary {
		t.Run("unary, "+tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(failFirst(100, codes.Unavailable))
				cc, _ := newRawEcho(t, srv, opts...)
				req := rawOf(t, &echov1.EchoRequest{Payload: make([]byte, tt.payload)})
				err := cc.Invoke(t.Context(), echoMethod, req, &rawMessage{}, raw)
				if status.Code(err) != codes.Unavailable || srv.Count("Echo") != tt.attempts {
					t.Errorf("Invoke = %v over %d attempts, want UNAVAILABLE over %d", err, srv.Count("Echo"), tt.attempts)
				}
			})
		})
	}
	t.Run("client stream of small messages: retried", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := &testserver.Server{}
			srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
				if a.N == 1 {
					return testserver.Outcome{Err: status.Error(codes.Unavailable, "down"), After: 1}
				}
				return testserver.Outcome{}
			})
			cc, _ := newRawEcho(t, srv, opts...)
			st, err := cc.NewStream(t.Context(), &echov1.EchoService_ServiceDesc.Streams[1], echov1.EchoService_ClientStream_FullMethodName, raw)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range []string{"a", "b"} {
				if err := st.SendMsg(rawOf(t, &echov1.ClientStreamRequest{Message: m})); err != nil {
					t.Fatalf("SendMsg(%s) = %v", m, err)
				}
			}
			if err := st.CloseSend(); err != nil {
				t.Fatal(err)
			}
			var reply rawMessage
			if err := st.RecvMsg(&reply); err != nil {
				t.Fatalf("RecvMsg = %v, want the second attempt's answer", err)
			}
			if n := srv.Count("ClientStream"); n != 2 {
				t.Errorf("server saw %d attempts, want 2: the 3-byte messages fit the buffer", n)
			}
		})
	})
}
