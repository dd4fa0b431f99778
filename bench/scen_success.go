package bench

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// SuccessPath measures what each peer costs when nothing fails.
func SuccessPath() Scenario {
	return Scenario{
		Name: "success-path overhead",
		Workload: "Nothing fails. One caller, sequential calls on one connection per peer to one shared echo server: " +
			"a unary Echo (12-byte message) and a server stream of 10 responses, over bufconn and over loopback TCP, " +
			"each call with a deadline (2 s), as real calls have. " +
			"Time: the peer and the bare call alternate in blocks of 20 calls (the order alternating too), Size.Pairs calls each; " +
			"the cell is the median of the blocks' time ratios peer/bare. Allocations: heap allocations per call counted by " +
			"runtime.MemStats over Size.Pairs sequential calls, peer minus bare (the server's share cancels out). " +
			"The policy is configured but never triggers: DefaultPolicy.",
		Run: runSuccessPath,
	}
}

func unaryCall(cc *grpc.ClientConn) func() error {
	c := echov1.NewEchoServiceClient(cc)
	req := &echov1.EchoRequest{Message: "hello, bench"}
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		_, err := c.Echo(ctx, req)
		return err
	}
}

func streamCall(cc *grpc.ClientConn) func() error {
	c := echov1.NewEchoServiceClient(cc)
	req := &echov1.ServerStreamRequest{Message: "hello, bench", Count: streamReplies}
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		st, err := c.ServerStream(ctx, req)
		if err != nil {
			return err
		}
		n := 0
		for {
			_, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			n++
		}
		if n != streamReplies {
			return fmt.Errorf("bench: server stream: got %d responses, want %d", n, streamReplies)
		}
		return nil
	}
}

func runSuccessPath(_ context.Context, sz Size) ([]Table, error) {
	var tables []Table
	peers := retryPeers()
	for _, tr := range []Transport{Bufconn, TCP} {
		t, err := successTable(tr, peers, sz)
		if err != nil {
			return nil, err
		}
		tables = append(tables, t)
	}
	return tables, nil
}

func successTable(tr Transport, peers []peer, sz Size) (Table, error) {
	ts, err := StartServer(tr)
	if err != nil {
		return Table{}, err
	}
	defer ts.Stop()
	bareCC, err := ts.Dial(grpc.WithDisableRetry())
	if err != nil {
		return Table{}, err
	}
	defer bareCC.Close()
	kinds := []struct {
		n    need
		call func(*grpc.ClientConn) func() error
	}{{needUnary, unaryCall}, {needStream, streamCall}}
	t := Table{
		Title:  "Success path, " + tr.String(),
		Header: []string{"peer", "unary time vs bare", "unary extra allocs/call", "stream of 10 time vs bare", "stream extra allocs/call"},
	}
	for _, p := range peers {
		row := []string{p.name}
		for _, k := range kinds {
			cells, err := successCells(ts, p, k.n, k.call(bareCC), k.call, sz)
			if err != nil {
				return Table{}, fmt.Errorf("%s, %s: %w", p.name, tr, err)
			}
			row = append(row, cells...)
		}
		t.Rows = append(t.Rows, row)
	}
	return t, nil
}

// successCells returns the time ratio and extra allocations of peer p on
// one kind of call, or two cells saying why p cannot make it.
func successCells(ts *Server, p peer, n need, bareCall func() error, call func(*grpc.ClientConn) func() error, sz Size) ([]string, error) {
	opts, cannot, err := p.setup(DefaultPolicy, n)
	if err != nil {
		return nil, err
	}
	if cannot != "" {
		return []string{"(" + cannot + ")", "—"}, nil
	}
	cc, err := ts.Dial(opts...)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	peerCall := call(cc)
	warm := max(sz.Pairs/10, 20)
	for _, f := range []func() error{bareCall, peerCall} {
		for range warm {
			if err := f(); err != nil {
				return nil, err
			}
		}
	}
	r, err := pairedRatio(sz.Pairs, bareCall, peerCall)
	if err != nil {
		return nil, err
	}
	bareAllocs, err := allocsPerCall(sz.Pairs, bareCall)
	if err != nil {
		return nil, err
	}
	peerAllocs, err := allocsPerCall(sz.Pairs, peerCall)
	if err != nil {
		return nil, err
	}
	return []string{ratio(r), signed(peerAllocs - bareAllocs)}, nil
}
