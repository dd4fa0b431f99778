package overload

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// rawClient calls the echo service over plain HTTP/2 (h2c), as a client
// written without grpc would: it sends a grpc-timeout header and never
// cancels, so no RST_STREAM ends its calls; the server's own deadline
// timer does.
type rawClient struct {
	addr string
	hc   *http.Client
}

func newRawClient(addr string) *rawClient {
	tr := &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}
	return &rawClient{addr: addr, hc: &http.Client{Transport: tr}}
}

// echo calls Echo with a grpc-timeout of timeout (whole milliseconds) and
// waits for the answer, however long it takes; it returns the call's code.
func (c *rawClient) echo(msg string, timeout time.Duration) (codes.Code, error) {
	body, err := proto.Marshal(&echov1.EchoRequest{Message: msg})
	if err != nil {
		return codes.Internal, err
	}
	frame := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(frame[1:], uint32(len(body)))
	frame = append(frame, body...)
	req, err := http.NewRequest(http.MethodPost, "http://"+c.addr+"/resilience.echo.v1.EchoService/Echo", bytes.NewReader(frame))
	if err != nil {
		return codes.Internal, err
	}
	req.Header.Set("content-type", "application/grpc")
	req.Header.Set("te", "trailers")
	req.Header.Set("grpc-timeout", strconv.FormatInt(timeout.Milliseconds(), 10)+"m")
	resp, err := c.hc.Do(req)
	if err != nil {
		return codes.Unavailable, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return codes.Unavailable, err
	}
	s := resp.Trailer.Get("grpc-status")
	if s == "" {
		s = resp.Header.Get("grpc-status") // a trailers-only answer
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return codes.Unknown, fmt.Errorf("grpc-status %q: %v", s, err)
	}
	return codes.Code(n), nil
}

func (c *rawClient) close() { c.hc.CloseIdleConnections() }
